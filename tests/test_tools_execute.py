"""run_calls: parallel execution, results in call order, every failure becomes an observation."""

from __future__ import annotations

import threading
import time

import pytest
from tools_sandbox import make_repo, open_test_sandbox

from carl.harness.execute import run_calls
from carl.harness.protocol import parse_calls
from carl.harness.tools import default_tools, specs_of
from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.sandbox.base import SandboxError
from carl.types import ToolCall


class Sleepy:
    """Sleeps, then echoes; records how many calls were running at once."""

    spec = ToolSpec(
        "sleepy", "d", (ParamSpec("s", "str", "d"), ParamSpec("n", "int", "d", required=False, default=7))
    )

    def __init__(self) -> None:
        self.running = self.peak = 0
        self.lock = threading.Lock()

    def run(self, params, sandbox):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.2)
        with self.lock:
            self.running -= 1
        return f"{params['s']}:{params['n']}"


class Failing:
    spec = ToolSpec("failing", "d", (ParamSpec("how", "str", "d"),))

    def run(self, params, sandbox):
        if params["how"] == "failure":
            raise ToolFailure("no such thing")
        if params["how"] == "crash":
            raise KeyError("bug")
        if params["how"] == "missing":
            raise FileNotFoundError(2, "No such file or directory", "x.py")
        if params["how"] == "sandbox":
            raise SandboxError("sandbox died")
        return "x" * 10_000


def test_calls_run_in_parallel_and_results_keep_call_order():
    sleepy = Sleepy()
    tools = {"sleepy": sleepy}
    calls = [
        ToolCall("sleepy", {"s": str(i), "n": " 3 "} if i % 2 else {"s": str(i)}, index=i) for i in range(6)
    ]
    start = time.perf_counter()
    results = run_calls(calls, tools, sandbox=None)
    elapsed = time.perf_counter() - start
    assert [r.output for r in results] == ["0:7", "1:3", "2:7", "3:3", "4:7", "5:3"]  # typed, defaults filled
    assert [r.index for r in results] == list(range(6)) and all(r.ok for r in results)
    assert sleepy.peak == 6 and elapsed < 0.2 * 6 / 2


def test_errors_and_crashes_become_typed_results_in_place():
    tools = {"failing": Failing(), "sleepy": Sleepy()}
    text = (
        '<tool name="failing"><how>failure</how></tool>'
        '<tool name="nope"></tool>'
        '<tool name="failing"><how>crash</how></tool>'
        '<tool name="failing"><how>missing</how></tool>'
        '<tool name="sleepy"><s>ok</s></tool>'
        '<tool name="failing"><how>long</how></tool>'
    )
    results = run_calls(parse_calls(text, specs_of(tools)), tools, sandbox=None, max_output_chars=500)
    kinds = [r.error.kind if r.error else None for r in results]
    assert kinds == ["execution", "unknown_tool", "execution", "execution", None, None]
    assert results[0].output == "failing failed: no such thing"
    assert results[1].output == "unknown tool 'nope'\nValid tools: failing, sleepy"
    assert results[2].output == "failing failed: the tool crashed: KeyError: 'bug'"
    assert results[3].output == "failing failed: FileNotFoundError: No such file or directory: x.py"
    assert results[4].output == "ok:7"
    assert results[5].truncated and len(results[5].output) <= 500 and "[... truncated" in results[5].output
    assert results[2].error.raw == '<tool name="failing"><how>crash</how></tool>'


def test_calls_built_in_code_are_validated_too():
    tools = {"sleepy": Sleepy()}
    [bad] = run_calls([ToolCall("sleepy", {"s": "a", "n": "many"})], tools, sandbox=None)
    assert bad.error.kind == "bad_value" and bad.error.param == "n"


def test_a_dead_sandbox_is_an_infrastructure_error_not_an_observation():
    tools = {"failing": Failing()}
    with pytest.raises(SandboxError, match="sandbox died"):
        run_calls([ToolCall("failing", {"how": "sandbox"})], tools, sandbox=None)


def test_parallel_reads_on_a_real_sandbox(tmp_path):
    files = {f"f{i}.py": f"x = {i}\n" * 50 for i in range(8)}
    tools = default_tools()
    with open_test_sandbox(make_repo(tmp_path / "src", files)) as sb:
        text = "".join(f'<tool name="read_file"><path>f{i}.py</path></tool>' for i in range(8))
        text += '<tool name="read_file"><path>../outside.py</path></tool>'
        results = run_calls(parse_calls(text, specs_of(tools)), tools, sb)
    assert [r.output.splitlines()[1] for r in results[:8]] == [f"     1\tx = {i}" for i in range(8)]
    assert results[8].error.kind == "execution" and "outside.py" in results[8].output


def test_a_call_that_never_returns_becomes_an_error_and_the_others_still_answer():
    """Every tool call has a wall-clock limit: one that hangs (here a tool blocked on an event
    nobody sets) is reported as an error after call_timeout_s, and the other calls' results stand."""
    import threading

    from carl.harness.execute import run_calls
    from carl.harness.tools.base import ToolSpec
    from carl.types import ToolCall

    release = threading.Event()

    class Hangs:
        spec = ToolSpec(name="hang", description="blocks")

        def run(self, params, sandbox):
            release.wait(30)
            return "late"

    class Quick:
        spec = ToolSpec(name="quick", description="answers")

        def run(self, params, sandbox):
            return "on time"

    try:
        results = run_calls([ToolCall("hang", {}, index=0), ToolCall("quick", {}, index=1)],
                            {"hang": Hangs(), "quick": Quick()}, sandbox=None, call_timeout_s=0.5)
    finally:
        release.set()
    assert not results[0].ok and "did not finish within 0.5 s" in results[0].output
    assert results[1].ok and results[1].output == "on time"
