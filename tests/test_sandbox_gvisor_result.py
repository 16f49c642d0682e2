"""How the gVisor backend reads what `runsc run` returned (no runsc needed)."""

import pytest

from carl.sandbox.base import ExecResult
from carl.sandbox.bwrap import STARTED_MARK
from carl.sandbox.gvisor import container_result

MARK = STARTED_MARK.decode()
KILLED = "Killed: the command's processes together went over memory_mb (256 MiB)\n"


def runsc(exit_code: int, stdout: str = "", stderr: str = "", timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout=MARK + stdout, stderr=stderr, timed_out=timed_out, duration_s=1.5)


@pytest.mark.parametrize("runsc_exit_code", [137, 2, 1, -9])
def test_an_oom_killed_container_exits_137_and_says_so_whatever_runsc_returned(runsc_exit_code):
    # CI saw 2 (a Go fatal error in the Sentry under the same memory pressure); 137 is the usual
    res = container_result(runsc(runsc_exit_code, "half"), oom_killed=True, memory_mb=256)
    assert (res.exit_code, res.stdout, res.stderr) == (137, "half", KILLED)
    assert res.duration_s == 1.5 and not res.timed_out


def test_without_an_oom_kill_runsc_s_exit_code_and_output_pass_through():
    res = container_result(runsc(2, "out\n", "err\n"), oom_killed=False, memory_mb=256)
    assert (res.exit_code, res.stdout, res.stderr) == (2, "out\n", "err\n")


def test_a_command_that_exited_0_keeps_it_and_a_timeout_stays_a_timeout():
    survived = container_result(runsc(0, "ok\n"), oom_killed=True, memory_mb=256)
    assert (survived.exit_code, survived.stderr) == (0, KILLED)
    late = container_result(runsc(124, timed_out=True), oom_killed=True, memory_mb=256)
    assert (late.exit_code, late.stderr, late.timed_out) == (124, "", True)
