"""The test reward: the agent's non-test changes, the original tests, a fresh sandbox.

    agent sandbox --workspace_changes--> WorkspaceDiff --non-test files only--+
                                                                              v
    broken repo (original tests in place) --open_sandbox--> fresh sandbox <- apply
                                                                              |
    pytest FAIL_TO_PASS + PASS_TO_PASS --junitxml, hard timeout-------------- +--> RewardResult

reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes (fraction_passed is exposed
for shaping and metrics). Changes to tests and test config are never copied (see
`carl.rewards.diff.is_test_path`), so editing a test cannot make it pass here; the monitor
flags the attempt.

What is an infrastructure failure (`infra_failure=True`, masked from training, never a 0):
the sandbox could not be opened or crashed, the test command could not be started, pytest
stopped with an internal or usage error before writing a report. What is *not*: a test run that
hits the timeout, or agent code that kills pytest (os._exit, a segfault) -- those score 0 with the
reason in `feedback`, since masking them would reward hanging or crashing on hopeless tasks.

Not guaranteed: the agent's code runs inside the same pytest process as the tests, so code that
deliberately tampers with pytest from the inside is not prevented here (it is sandboxed, and
the monitor flags code that references the test runner).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from carl.rewards.diff import WorkspaceDiff, workspace_changes
from carl.sandbox.base import Sandbox, SandboxConfig, SandboxError, SandboxPathError

if TYPE_CHECKING:
    from carl.tasks.record import TaskRecord

# Used when a record (e.g. from SWE-bench tooling) carries no test_command.
DEFAULT_TEST_COMMAND = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short")

Outcome = str  # "passed" | "failed" | "error" | "skipped" | "missing" | "timeout"


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
    applied = apply_changes(sandbox, changes)
    node_ids = list(dict.fromkeys([*task.FAIL_TO_PASS, *task.PASS_TO_PASS]))
    junit = f".carl-reward-{uuid.uuid4().hex}.xml"
    argv = [*(task.test_command or DEFAULT_TEST_COMMAND), f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    res = sandbox.exec(argv + node_ids, timeout_s=config.timeout_s, env={"PYTHONDONTWRITEBYTECODE": "1"})
    ignored = tuple(c.path for c in changes.test_changes())
    if res.exit_code in (126, 127):
        raise SandboxError(f"test command could not start: {shlex.join(argv[:4])}: {res.output[-1000:]}")
    report = _read_optional(sandbox, junit)
    if (
        report is None
        and not res.timed_out
        and (res.exit_code in (3, 4) or "No module named pytest" in res.output)
    ):
        raise SandboxError(f"pytest exited {res.exit_code} without a report: {res.output[-2000:]}")
    try:
        tests = parse_junit(report, node_ids) if report is not None else {}
    except ET.ParseError:  # pytest was killed while writing it (by the agent's code or the timeout)
        report, tests = None, {}
    missing = "timeout" if res.timed_out else "missing"
    tests = {n: tests.get(n, missing) for n in node_ids}
    num_passed = sum(o == "passed" for o in tests.values())
    all_passed = num_passed == len(node_ids) and len(node_ids) > 0
    return RewardResult(
        reward=1.0 if all_passed else 0.0,
        fraction_passed=num_passed / len(node_ids) if node_ids else 0.0,
        tests=tests,
        feedback="" if all_passed else _feedback(task, tests, report, res, config),
        applied=applied,
        ignored=ignored,
    )


def apply_changes(sandbox: Sandbox, changes: WorkspaceDiff) -> tuple[str, ...]:
    """Write the agent's non-test changes into `sandbox`; returns the paths applied."""
    changed = changes.non_test_changes()
    removals = [c.path for c in changed if c.new is None or c.symlink]
    links = {c.path: c.new.decode() for c in changed if c.symlink and c.new is not None}
    # Deletions first, emptied directories with them, so that a directory the agent replaced by
    # a file (or the reverse) can be written.
    _run_script(sandbox, _REMOVE_SCRIPT, removals)
    for c in changed:
        if c.new is not None and not c.symlink:
            sandbox.write_file(c.path, c.new)
    _run_script(sandbox, _LINK_SCRIPT, links)
    return tuple(c.path for c in changes.non_test_changes())


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


def _read_optional(sandbox: Sandbox, path: str) -> bytes | None:
    try:
        return sandbox.read_file(path)
    except (FileNotFoundError, ValueError):  # SandboxPathError is a ValueError
        return None


# ------------------------------------------------------------------------------ junit


def junit_key(node_id: str) -> tuple[str, str]:
    """(classname, name) that pytest's junit report gives a node id (mirrors
    _pytest.junitxml.mangle_test_address): path/to/test_x.py::C::t[p] -> (path.to.test_x.C, t[p])."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    names[0] = names[0].removesuffix(".py")
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def parse_junit(xml: bytes, node_ids: list[str]) -> dict[str, Outcome]:
    """node id -> outcome for the node ids found in a pytest junit report.

    A testcase with a <failure> is "failed", with an <error> (setup/teardown/collection) "error",
    with <skipped> (skip, xfail) "skipped", else "passed"; the worst wins if a test is reported
    twice (call failure plus teardown error). A collection error of a test file is reported as
    one testcase named after the file: every requested test of that file gets "error".
    """
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out: dict[str, Outcome] = {}
    for nodes, case in _cases(xml, node_ids):
        tags = {child.tag for child in case}
        outcome = (
            "error"
            if "error" in tags
            else "failed"
            if "failure" in tags
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        for node in nodes:
            if node not in out or rank[outcome] > rank[out[node]]:
                out[node] = outcome
    return out


def _cases(xml: bytes, node_ids: list[str]) -> Iterator[tuple[list[str], ET.Element]]:
    """(the requested node ids a <testcase> reports on, the element), for every testcase."""
    by_key: dict[tuple[str, str], list[str]] = {}
    for n in node_ids:
        by_key.setdefault(junit_key(n), []).append(n)
        by_key.setdefault(junit_key(n.split("::")[0]), []).append(n)  # the file's collection report
    for case in ET.fromstring(xml).iter("testcase"):
        nodes = by_key.get((case.get("classname", ""), case.get("name", "")))
        if nodes:
            yield nodes, case


def _failure_texts(xml: bytes | None, node_ids: list[str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for nodes, case in _cases(xml, node_ids) if xml is not None else ():
        for child in case:
            if child.tag in ("failure", "error"):
                text = (child.text or "").strip() or child.get("message", "")
                for node in nodes:
                    texts[node] = texts.get(node, "") + text + "\n"
    return texts


def _feedback(
    task: TaskRecord, tests: dict[str, Outcome], xml: bytes | None, res, config: RewardConfig
) -> str:
    def num_passed(ids) -> int:
        return sum(tests.get(n) == "passed" for n in ids)

    f2p, p2p = list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS)
    summary = (
        f"{len(tests) - num_passed(tests)} of {len(tests)} tests did not pass "
        f"(FAIL_TO_PASS {num_passed(f2p)}/{len(f2p)} passed, PASS_TO_PASS {num_passed(p2p)}/{len(p2p)} passed)."
    )
    lines = [summary]
    if res.timed_out:
        lines.append(f"The test run was killed after {config.timeout_s:g} s (timeout).")
    texts = _failure_texts(xml, list(tests))
    first_with: dict[str, str] = {}  # failure text -> the first test shown with it
    for node, outcome in tests.items():
        if outcome == "passed":
            continue
        text = texts.get(node, "").rstrip()
        if text and text in first_with:  # a collection error repeats for every test of the file
            lines.append(f"{outcome.upper()} {node} (same error as {first_with[text]})")
            continue
        lines.append(f"{outcome.upper()} {node}")
        if text:
            first_with[text] = node
            lines.append(_cap(text, config.max_chars_per_test))
    if xml is None or any(o in ("missing", "timeout") for o in tests.values()):
        # no report (or tests absent from it, e.g. a collection error): the output is the evidence
        lines.append("Output of the test run:")
        lines.append(_cap(res.output, config.max_chars_per_test, keep="tail"))
    return _cap("\n".join(lines), config.max_feedback_chars)


def _cap(text: str, limit: int, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    return text[:limit] + marker if keep == "head" else marker + text[-limit:]


def _with_duration(r: RewardResult, duration_s: float) -> RewardResult:
    return dataclasses.replace(r, duration_s=duration_s)
