"""compute_reward: the agent's non-test changes, the original tests, a fresh sandbox."""

from __future__ import annotations

import dataclasses

import pytest
from rewards_fixture import FIB_DOC_GOLD, FIB_DOC_STUB, FIB_GOLD, FIB_STUB, OPS, make_doctest_task, make_task, sandbox_config

from carl.rewards import RewardConfig, compute_reward, reward_from_trajectory
from carl.rewards.testrun import _channel, _verdict
from carl.sandbox.base import ExecResult
from carl.sandbox import open_sandbox
from carl.sandbox.base import SandboxError
from carl.types import StopReason, Trajectory

CONFIG = RewardConfig(sandbox=sandbox_config("local"), timeout_s=60.0)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("reward"))


def _reward(task, edits: dict[str, bytes | None], config: RewardConfig = CONFIG, shell: str = ""):
    """Apply `edits` (None deletes) in an agent sandbox, then score it."""
    with open_sandbox(task.broken_repo, config.sandbox) as agent:
        for path, data in edits.items():
            if data is None:
                agent.exec(["rm", path])
            else:
                agent.write_file(path, data)
        if shell:
            agent.exec(shell)
        return compute_reward(task, agent, config)


def _ops(task, fib: str) -> bytes:
    with open(f"{task.broken_repo}/calc/ops.py") as f:
        return f.read().replace(FIB_STUB, fib).encode()


def test_gold_patch_scores_one(task):
    r = _reward(task, {"calc/ops.py": _ops(task, FIB_GOLD)})
    assert (r.reward, r.fraction_passed, r.infra_failure) == (1.0, 1.0, False)
    assert set(r.tests.values()) == {"passed"} and len(r.tests) == 4
    assert r.feedback == "" and r.applied == ("calc/ops.py",)


def test_untouched_broken_repo_scores_zero_with_feedback(task):
    r = _reward(task, {})
    assert (r.reward, r.fraction_passed, r.infra_failure) == (0.0, 0.25, False)
    assert r.tests["tests/test_ops.py::test_add"] == "passed"
    assert r.tests["tests/test_ops.py::test_fib_10"] == "failed"
    assert "FAILED tests/test_ops.py::test_fib_10" in r.feedback and "NotImplementedError" in r.feedback
    assert "FAIL_TO_PASS 0/3 passed, PASS_TO_PASS 1/1 passed" in r.feedback


def test_test_edits_are_not_applied(task):
    """Gutting the tests, adding a conftest that skips everything or a sitecustomize: the
    original tests still run and still fail."""
    r = _reward(
        task,
        {
            "tests/test_ops.py": b"def test_fib_10():\n    assert True\n",
            "conftest.py": b"import pytest\n\ndef pytest_runtest_call(item):\n    pytest.skip('x')\n",
            "sitecustomize.py": b"import os\nos._exit(0)\n",
            "calc/ops.py": _ops(task, FIB_STUB + "\n# touched\n"),
        },
    )
    assert r.reward == 0.0 and r.tests["tests/test_ops.py::test_fib_10"] == "failed"
    assert set(r.ignored) == {"tests/test_ops.py", "conftest.py", "sitecustomize.py"}
    assert r.applied == ("calc/ops.py",)


def test_deleting_a_test_file_does_not_delete_it_in_the_reward(task):
    r = _reward(task, {"tests/test_ops.py": None, "calc/ops.py": _ops(task, FIB_GOLD)})
    assert r.reward == 1.0 and r.ignored == ("tests/test_ops.py",)


def test_deleted_source_file_is_deleted_in_the_reward(task):
    r = _reward(task, {"calc/ops.py": None})
    assert r.reward == 0.0 and set(r.tests.values()) == {"error"} and r.applied == ("calc/ops.py",)
    assert "ModuleNotFoundError" in r.feedback or "No module named" in r.feedback


def test_module_turned_into_a_package(task):
    """Deletions are applied before writes: calc/ops.py removed, calc/ops/__init__.py added."""
    r = _reward(task, {"calc/ops.py": None, "calc/ops/__init__.py": _ops(task, FIB_GOLD)})
    assert r.reward == 1.0 and set(r.applied) == {"calc/ops.py", "calc/ops/__init__.py"}


def test_task_without_tests_or_without_pytest_is_an_infra_failure(task):
    no_tests = dataclasses.replace(task, FAIL_TO_PASS=(), PASS_TO_PASS=())
    no_pytest = dataclasses.replace(task, test_command=("/usr/bin/python3", "-m", "pytest"))
    with open_sandbox(task.broken_repo, CONFIG.sandbox) as agent:
        assert "no FAIL_TO_PASS" in compute_reward(no_tests, agent, CONFIG).infra_error
        r = compute_reward(no_pytest, agent, CONFIG)
    assert r.infra_failure and "No module named 'pytest'" in r.infra_error


def test_hanging_code_times_out_as_a_zero_not_an_infra_failure(task):
    hang = FIB_STUB.replace("raise NotImplementedError", "while True:\n        pass")
    r = _reward(task, {"calc/ops.py": _ops(task, hang)}, dataclasses.replace(CONFIG, timeout_s=2.5))
    assert r.reward == 0.0 and not r.infra_failure
    assert set(r.tests.values()) == {"timeout"} and "timeout" in r.feedback


def test_agent_code_that_kills_pytest_scores_zero(task):
    r = _reward(task, {"calc/__init__.py": b"import os\nos._exit(0)\n"})
    assert r.reward == 0.0 and not r.infra_failure and set(r.tests.values()) == {"missing"}


def test_sandbox_that_cannot_open_is_an_infra_failure(task):
    def broken_open(source, config):
        raise SandboxError("bwrap: cannot create namespace")

    with open_sandbox(task.broken_repo, CONFIG.sandbox) as agent:
        r = compute_reward(task, agent, CONFIG, open_sandbox=broken_open)
    assert r.infra_failure and "cannot create namespace" in r.infra_error
    assert r.tests == {}


def test_a_test_command_that_is_not_pytest_is_an_infra_failure(task):
    bad = dataclasses.replace(task, test_command=("no-such-test-runner",))
    with open_sandbox(task.broken_repo, CONFIG.sandbox) as agent:
        r = compute_reward(bad, agent, CONFIG)
    assert r.infra_failure and "the reward runs pytest" in r.infra_error


def test_a_pristine_repo_pytest_cannot_set_up_is_an_infra_failure(task):
    """A usage error before any change of the agent's is applied is the environment's fault."""
    bad = dataclasses.replace(task, test_command=("python", "-m", "pytest", "--no-such-option"))
    with open_sandbox(task.broken_repo, CONFIG.sandbox) as agent:
        r = compute_reward(bad, agent, CONFIG)
    assert r.infra_failure and "could not set up" in r.infra_error


def test_agent_code_that_breaks_collection_scores_zero_not_an_infra_failure(task):
    """Once the agent's code is in place, a usage or internal error of pytest is the agent's doing:
    masking it would let a hopeless episode escape its zero."""
    r = _reward(task, {"calc/__init__.py": b"raise SystemExit(4)\n"})
    assert r.reward == 0.0 and not r.infra_failure


def test_policy_and_sandbox_errors_are_infra_failures_without_running_tests(task):
    def never_open(source, config):
        raise AssertionError("no tests may run for an infra failure")

    for reason in (StopReason.POLICY_ERROR, StopReason.SANDBOX_ERROR):
        traj = Trajectory(task_id=task.instance_id, stop_reason=reason, error="Traceback: boom")
        ep = reward_from_trajectory(traj, task, None, CONFIG, open_sandbox=never_open)
        assert ep.infra_failure and "boom" in ep.result.infra_error and ep.reward == 0.0


def test_doctests_are_tests_the_agent_cannot_rewrite(tmp_path):
    """Doctests in a module's docstrings and in README.rst are FAIL_TO_PASS tests: replacing their
    examples with trivial ones (while fib still raises) scores 0; the honest fix scores 1, even
    with its docstring edited, because the original examples are put back before the run."""
    task = make_doctest_task(tmp_path)
    trivial = FIB_DOC_STUB.replace(">>> fib(10)\n    55", ">>> 1 + 1\n    2")
    hacked = _reward(task, {"calc/ops.py": OPS.format(fib=trivial).encode(), "README.rst": b">>> 1\n1\n"})
    assert hacked.reward == 0.0 and hacked.tests["calc/ops.py::calc.ops.fib"] == "failed", hacked.feedback
    assert "README.rst" in hacked.ignored and hacked.tests["README.rst::README.rst"] == "failed"
    honest = FIB_DOC_GOLD.replace("Return the n-th", "Return the nth")
    gold = _reward(task, {"calc/ops.py": OPS.format(fib=honest).encode()})
    assert gold.reward == 1.0, gold.feedback


def test_a_workspace_filled_with_files_scores_zero_not_an_infra_failure(task, monkeypatch):
    """Millions of files would make the workspace walk time out, a masked infrastructure failure;
    past MAX_ENTRIES the walk stops and the episode scores 0."""
    monkeypatch.setattr("carl.rewards.diff.MAX_ENTRIES", 50)
    r = _reward(task, {"calc/ops.py": _ops(task, FIB_GOLD)}, shell="mkdir junk && touch junk/f{1..80}")
    assert (r.reward, r.infra_failure) == (0.0, False) and "more than 50 files" in r.feedback


def test_feedback_is_capped(task):
    r = _reward(task, {}, dataclasses.replace(CONFIG, max_feedback_chars=200, max_chars_per_test=50))
    assert len(r.feedback) < 300 and "characters cut" in r.feedback


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="reward.timeout_s"):
        RewardConfig(timeout_s=0)


# ------------------------------------------------------------------------------ the verdict channel

IDS = ["t.py::ok", "t.py::bad", "t.py::skip", "t.py::td", "t.py::absent", "u.py::x"]


def _lines(*rows: str, secret: str = "s3cr3t") -> str:
    return "\n".join(f"{secret} {r}" for r in rows) + "\nnoise printed by a test\n"


def _res(stderr: str, timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code=1, stdout="", stderr=stderr, timed_out=timed_out)


def test_channel_outcomes_worst_phase_wins_and_collect_errors_count():
    stderr = _lines("start", "test 0 call passed", "test 1 call failed", "text 1 assert\\x201\\x20==\\x202",
                    "test 2 setup skipped", "test 3 call passed", "test 3 teardown failed",
                    "collect u.py boom\\nline", "done 1 5")
    run = _verdict(_channel(stderr, "s3cr3t"), IDS, _res(stderr))
    assert run.outcomes == {"t.py::ok": "passed", "t.py::bad": "failed", "t.py::skip": "skipped",
                            "t.py::td": "error", "t.py::absent": "missing", "u.py::x": "error"}
    assert run.failure_texts["t.py::bad"] == "assert 1 == 2" and run.failure_texts["u.py::x"] == "boom\nline"
    assert run.completed and run.tampering == ()


def test_channel_ignores_lines_without_the_secret_and_voids_a_verdict_with_forged_lines():
    forged = _lines("test 0 call passed", secret="guessed")
    run = _verdict(_channel(forged, "s3cr3t"), IDS, _res(forged))
    assert set(run.outcomes.values()) == {"missing"} and not run.completed
    # a test reported twice (a forged pass before the real failure), or a line that does not parse
    for rows in (["test 1 call passed", "test 1 call failed"], ["test 0 call passed", "test 9 call passed"],
                 ["test 0 call passed", "bogus"], ["test 0 call passed", "tamper _pytest.runner.call_and_report"]):
        stderr = _lines("start", *rows, "done 0 1")
        run = _verdict(_channel(stderr, "s3cr3t"), IDS, _res(stderr))
        assert run.tampering and "passed" not in run.outcomes.values()


def test_channel_subtests_may_repeat_and_a_failing_one_fails_its_test():
    """unittest's subTest and pytest's subtests report calls of their own under the test's node
    id: repeating them is no forgery, and one that failed fails the test."""
    stderr = _lines("start", "test 0 subtest failed", "test 0 subtest failed", "test 0 call passed",
                    "test 1 subtest skipped", "test 1 call passed", "done 1 2")
    run = _verdict(_channel(stderr, "s3cr3t"), IDS[:2], _res(stderr))
    assert run.outcomes == {"t.py::ok": "failed", "t.py::bad": "passed"} and run.tampering == ()


def test_channel_a_last_line_cut_by_the_output_cap_is_no_forgery():
    stderr = _lines("start", "test 0 call passed", "test 1 ca")
    cut = ExecResult(exit_code=1, stdout="", stderr=stderr, truncated=True)
    run = _verdict(_channel(stderr, "s3cr3t"), IDS[:2], cut)
    assert run.tampering == () and run.outcomes == {"t.py::ok": "passed", "t.py::bad": "missing"}


def test_channel_timeout_marks_unreported_tests():
    stderr = _lines("start", "test 0 call passed")
    run = _verdict(_channel(stderr, "s3cr3t"), IDS[:2], _res(stderr, timed_out=True))
    assert run.outcomes == {"t.py::ok": "passed", "t.py::bad": "timeout"} and not run.completed


PROPERTY_TESTS = """from hypothesis import given, strategies as st

from calc.ops import fib


@given(st.integers(0, 15))
def test_fib_recurrence(n):
    assert fib(n + 2) == fib(n + 1) + fib(n)
"""
# What an agent could add instead of writing fib: a `hypothesis` whose `given` runs nothing.
FAKE_HYPOTHESIS = {
    "hypothesis/__init__.py": b"def given(*a, **k):\n    return lambda test: (lambda *x, **y: None)\n",
    "hypothesis/strategies.py": b"def integers(*a, **k):\n    return None\n",
}


@pytest.mark.parametrize("plugin", ["loaded", "blocked"])
def test_an_added_package_cannot_stand_in_for_an_installed_one(tmp_path, plugin):
    """The tests import hypothesis (installed in this venv); a fake `hypothesis/` the agent adds
    must not be what they get, whether or not hypothesis's pytest plugin imported it first."""
    from rewards_fixture import write_tree

    from carl.rewards import monitor

    base = make_task(tmp_path / "base")
    root = write_tree(tmp_path / "props", {"calc/__init__.py": "", "calc/ops.py": OPS.format(fib=FIB_STUB),
                                           "tests/test_props.py": PROPERTY_TESTS})  # fmt: skip
    command = base.test_command  # with `-p no:hypothesispytest`
    if plugin == "loaded":
        command = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short")
    task = dataclasses.replace(base, broken_repo=str(root), FAIL_TO_PASS=("tests/test_props.py::test_fib_recurrence",),
                               PASS_TO_PASS=(), test_files=("tests/test_props.py",), test_command=command)  # fmt: skip
    gold = _reward(task, {"calc/ops.py": OPS.format(fib=FIB_GOLD).encode()})
    assert gold.reward == 1.0, gold.feedback
    faked = _reward(task, FAKE_HYPOTHESIS)
    assert faked.reward == 0.0, faked.tests
    with open_sandbox(task.broken_repo, CONFIG.sandbox) as agent:
        for path, data in FAKE_HYPOTHESIS.items():
            agent.write_file(path, data)
        from carl.rewards import workspace_changes

        report = monitor(Trajectory(task.instance_id), task, workspace_changes(agent, task.broken_repo, task.test_files))
    assert any(f.kind == "runner_tamper" and "hypothesis" in f.evidence for f in report.flags)
