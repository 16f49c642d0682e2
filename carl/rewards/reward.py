"""The test reward: the agent's non-test changes, the original tests, a fresh sandbox.

    agent sandbox --workspace_changes--> WorkspaceDiff --non-test files only--+
                                                                              v
    broken repo (original tests in place) --open_sandbox--> fresh sandbox     |
        discover: pytest's rootdir and config file, on the pristine copy      |
        apply  <--------------------------------------------------------------+
        carl's runner: FAIL_TO_PASS + PASS_TO_PASS, results streamed per test, hard timeout
                                                                              --> RewardResult

reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes and the runner saw no tampering
(fraction_passed is exposed for shaping and metrics). Changes to tests and test config are
never copied (see `carl.rewards.diff.is_test_path`), nor to the configuration file pytest
reads, nor to doctests (`changes_to_apply`), so editing a test cannot make it pass here; the
monitor flags the attempt. How the run
itself resists the agent's code (a runner from outside the workspace, carl's own configuration,
no plugin autoloading, a verdict channel written as tests finish, integrity checks) is in
carl/rewards/sandboxed_pytest.py.

What is an infrastructure failure (`infra_failure=True`, masked from training, never a 0): the
sandbox could not be opened or crashed; pytest could not set up the pristine repository (the
discovery run, before any change of the agent's is applied); the runner did not start. What is
*not*: anything after the agent's code is in place -- a test run that hits the timeout, agent
code that kills pytest (os._exit, a segfault) or breaks its collection or configuration (exit 2,
3 or 4): those score 0 with the reason in `feedback`, since masking them would reward breaking
the run on hopeless tasks.

Not guaranteed: the agent's code runs inside the same pytest process as the tests, so code that
deliberately tampers with pytest from the inside in a way the runner's checks do not watch is
not prevented here (it is sandboxed, and the monitor flags code that touches the test runner).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from carl.rewards.diff import (
    FileChange,
    WorkspaceDiff,
    gold_added_paths,
    import_root_module,
    patched_file,
    workspace_changes,
)
from carl.rewards.testrun import Outcome, PytestCommand, TestRun, discover_setup, repo_plugins, run_tests
from carl.sandbox.base import Sandbox, SandboxConfig, SandboxError, SandboxPathError
from carl.tasks.doctests import doctest_files, restore_doctests

if TYPE_CHECKING:
    from carl.tasks.record import TaskRecord

# Used when a record (e.g. from SWE-bench tooling) carries no test_command.
DEFAULT_TEST_COMMAND = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short")



@dataclass(frozen=True)
class RewardConfig:
    timeout_s: float = 300.0
    """Hard wall-clock limit of the whole test run in the reward sandbox."""
    max_feedback_chars: int = 4000
    """Cap on `RewardResult.feedback` (the text self-distillation puts in the teacher context)."""
    max_chars_per_test: int = 1500
    """Cap on the failure text of any one test inside the feedback."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Base config of the fresh reward sandbox; the task's venv and env vars are added to it."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_feedback_chars", "max_chars_per_test"):
            if getattr(self, name) <= 0:
                raise ValueError(f"reward.{name}: got {getattr(self, name)!r}, expected a positive number")


@dataclass(frozen=True)
class RewardResult:
    reward: float
    """1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0 (0.0 on infra failure too:
    check `infra_failure` and mask, never train on it)."""
    fraction_passed: float
    """Passed tests / all F2P + P2P tests."""
    tests: dict[str, Outcome]
    """node id -> "passed", "failed", "error", "skipped", "missing" (not in the report), "timeout"."""
    feedback: str
    """What failed and why (capped); empty when everything passed."""
    infra_failure: bool = False
    infra_error: str | None = None
    duration_s: float = 0.0
    applied: tuple[str, ...] = ()
    """Non-test paths the agent changed, applied in the reward sandbox."""
    ignored: tuple[str, ...] = ()
    """Test / test-config paths the agent changed, NOT applied (the originals ran)."""
    tampering: tuple[str, ...] = ()
    """What the runner saw of the agent's code interfering with the test run (reward 0)."""

    @property
    def passed(self) -> bool:
        return self.reward == 1.0


def infra_failure(error: str, duration_s: float = 0.0) -> RewardResult:
    """The result for a reward that could not be computed (masked from training)."""
    return RewardResult(
        reward=0.0,
        fraction_passed=0.0,
        tests={},
        feedback="",
        infra_failure=True,
        infra_error=error,
        duration_s=duration_s,
    )


OpenSandbox = Callable[[str, SandboxConfig], Sandbox]


def compute_reward(
    task: TaskRecord,
    agent_sandbox: Sandbox | None,
    config: RewardConfig,
    *,
    changes: WorkspaceDiff | None = None,
    open_sandbox: OpenSandbox | None = None,
) -> RewardResult:
    """Score the agent's work on `task` (a carl.tasks.TaskRecord) by its tests in a clean sandbox.

    `changes` may be passed when already computed (the monitor needs them too); otherwise they
    are read from `agent_sandbox`. `open_sandbox` defaults to carl.sandbox.open_sandbox.
    """
    from carl.tasks.store import broken_repo_dir, sandbox_config_for

    t0 = time.monotonic()
    broken = str(broken_repo_dir(task))
    if not (task.FAIL_TO_PASS or task.PASS_TO_PASS):  # pytest would run every test it finds
        return infra_failure(f"task {task.instance_id} has no FAIL_TO_PASS or PASS_TO_PASS tests")
    try:
        if changes is None:
            if agent_sandbox is None:
                raise ValueError("compute_reward: pass agent_sandbox or changes")
            changes = workspace_changes(agent_sandbox, broken, task.test_files)
        if changes.overflow:  # the agent's doing (a workspace filled with files): a zero, not masked
            tests = dict.fromkeys([*task.FAIL_TO_PASS, *task.PASS_TO_PASS], "missing")
            return RewardResult(0.0, 0.0, tests, f"The workspace held more than {changes.overflow} files; not scored.")
        if open_sandbox is None:
            from carl.sandbox import open_sandbox
        sandbox = open_sandbox(broken, sandbox_config_for(task, config.sandbox))
    except (SandboxError, OSError) as e:
        return infra_failure(f"{type(e).__name__}: {e}", time.monotonic() - t0)
    try:
        result = _run_in(sandbox, task, changes, config)
    except (SandboxError, SandboxPathError, OSError) as e:
        return infra_failure(f"{type(e).__name__}: {e}", time.monotonic() - t0)
    finally:
        sandbox.close()
    return _with_duration(result, time.monotonic() - t0)


def _run_in(sandbox: Sandbox, task: TaskRecord, changes: WorkspaceDiff, config: RewardConfig) -> RewardResult:
    node_ids = list(dict.fromkeys([*task.FAIL_TO_PASS, *task.PASS_TO_PASS]))
    command = PytestCommand.parse(task.test_command or DEFAULT_TEST_COMMAND)
    test_files = tuple(sorted({n.split("::")[0] for n in node_ids}))  # pytest's rootdir depends on them
    key = (task.broken_repo, task.environment.get("path"), command, test_files)
    setup = discover_setup(sandbox, key, command, node_ids, config.timeout_s)  # before any change
    to_apply = changes_to_apply(task, changes, protected={setup.config_file()})
    applied = apply_changes(sandbox, to_apply)
    import_roots = [".", *task.environment.get("pythonpath", [])]
    gold_added = gold_added_paths(task)  # a deleted top-level module the agent has to write again
    added_modules = {import_root_module(c.path) for c in to_apply if c.status == "added" and c.path not in gold_added}
    run = run_tests(
        sandbox,
        command,
        node_ids,
        setup,
        timeout_s=config.timeout_s,
        repo_plugins=repo_plugins(Path(task.broken_repo), import_roots),
        changed=list(applied),
        installed_first=sorted(added_modules - {None}),
        max_text=config.max_chars_per_test,
    )
    tests = run.outcomes
    num_passed = sum(o == "passed" for o in tests.values())
    all_passed = num_passed == len(node_ids) and len(node_ids) > 0 and not run.tampering
    return RewardResult(
        reward=1.0 if all_passed else 0.0,
        fraction_passed=num_passed / len(node_ids) if node_ids else 0.0,
        tests=tests,
        feedback="" if all_passed else _feedback(task, run, config),
        applied=applied,
        ignored=tuple(sorted({c.path for c in changes.changes} - set(applied))),
        tampering=run.tampering,
    )


def changes_to_apply(task: TaskRecord, changes: WorkspaceDiff, protected: set[str | None]) -> list[FileChange]:
    """The agent's changes the reward applies: non-test files only, and none of `protected` (the
    configuration file pytest reads). Doctests are tests too (carl.tasks.doctests): a text file
    holding a FAIL_TO_PASS / PASS_TO_PASS doctest is not applied, and in a Python file holding
    one the agent's code is applied with the original's doctest docstrings put back."""
    py_doctests, text_doctests = doctest_files([*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    out = []
    for c in changes.non_test_changes():
        if c.path in protected or c.path in text_doctests:
            continue
        if c.path in py_doctests and c.new is not None and not c.symlink:
            broken = (c.old or b"").decode("utf-8", errors="replace")
            original = patched_file(broken, task.patch, c.path) or broken
            restored = restore_doctests(original, c.new.decode("utf-8", errors="replace"))
            c = dataclasses.replace(c, new=restored.encode("utf-8"))
        out.append(c)
    return out


def apply_changes(sandbox: Sandbox, changed: list[FileChange]) -> tuple[str, ...]:
    """Write these changes of the agent's into `sandbox`; returns the paths applied."""
    removals = [c.path for c in changed if c.new is None or c.symlink]
    links = {c.path: c.new.decode() for c in changed if c.symlink and c.new is not None}
    # Deletions first, emptied directories with them, so that a directory the agent replaced by
    # a file (or the reverse) can be written.
    _run_script(sandbox, _REMOVE_SCRIPT, removals)
    for c in changed:
        if c.new is not None and not c.symlink:
            sandbox.write_file(c.path, c.new)
    _run_script(sandbox, _LINK_SCRIPT, links)
    return tuple(c.path for c in changed)


_REMOVE_SCRIPT = """
for p in ops:
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)
    try:
        os.removedirs(os.path.dirname(p))  # the emptied parents, up to the workspace
    except OSError:
        pass
"""
_LINK_SCRIPT = """
for p, target in ops.items():
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    os.symlink(target, p)
"""


def _run_script(sandbox: Sandbox, body: str, ops: list | dict) -> None:
    if not ops:
        return
    script = "import json, os, shutil, sys\nops = json.load(sys.stdin)\n" + body
    res = sandbox.exec(["python3", "-I", "-c", script], stdin=json.dumps(ops))
    if res.exit_code != 0:
        raise SandboxError(f"applying the agent's deletions or symlinks failed: {res.output[-1000:]}")


def _feedback(task: TaskRecord, run: TestRun, config: RewardConfig) -> str:
    tests = run.outcomes

    def num_passed(ids) -> int:
        return sum(tests.get(n) == "passed" for n in ids)

    f2p, p2p = list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS)
    summary = (
        f"{len(tests) - num_passed(tests)} of {len(tests)} tests did not pass "
        f"(FAIL_TO_PASS {num_passed(f2p)}/{len(f2p)} passed, PASS_TO_PASS {num_passed(p2p)}/{len(p2p)} passed)."
    )
    lines = [summary]
    if run.tampering:
        lines.append("The test run was interfered with, so its results do not count: " + "; ".join(run.tampering))
    if run.result is not None and run.result.timed_out:
        lines.append(f"The test run was killed after {config.timeout_s:g} s (timeout).")
    first_with: dict[str, str] = {}  # failure text -> the first test shown with it
    for node, outcome in tests.items():
        if outcome == "passed":
            continue
        text = run.failure_texts.get(node, "").rstrip()
        if text and text in first_with:  # a collection error repeats for every test of the file
            lines.append(f"{outcome.upper()} {node} (same error as {first_with[text]})")
            continue
        lines.append(f"{outcome.upper()} {node}")
        if text:
            first_with[text] = node
            lines.append(_cap(text, config.max_chars_per_test))
    if run.result is not None and (not run.completed or any(o in ("missing", "timeout") for o in tests.values())):
        # the session did not finish, or tests are absent from it: the output is the evidence
        lines.append("Output of the test run:")
        lines.append(_cap(run.result.stdout or run.result.output, config.max_chars_per_test, keep="tail"))
    return _cap("\n".join(lines), config.max_feedback_chars)


def _cap(text: str, limit: int, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    return text[:limit] + marker if keep == "head" else marker + text[-limit:]


def _with_duration(r: RewardResult, duration_s: float) -> RewardResult:
    return dataclasses.replace(r, duration_s=duration_s)
