"""Grade predictions made by any agent (a SWE-bench-style patch per task) with the RL reward.

    prediction (model_patch) --missing / empty--------------------------------> scored 0
        | apply_patch_in: carl.tasks.patch.apply_patch, run inside a fresh sandbox over the
        | task's broken repo --does not apply--> scored 0 with the applier's reason
        v
    that sandbox is the "agent's workspace": reward_from_trajectory(an empty trajectory, task,
    sandbox) = workspace_changes --> compute_reward (clean sandbox, original tests) + monitor
        --> training_reward's `passed` (tests pass and the monitor saw nothing) = resolved

This is `carl.rollout.rollout.run_rollout` with the agent's episode replaced by applying its
patch: the same workspace diff, the same test reward (test files and test config in the patch
are never applied, so a patch that edits a test cannot make it pass) and the same monitor with
the RL action ("zero"), so what the reward or the monitor catches in an RL episode's final diff
is caught here. The monitor sees the final diff only: what it finds in an episode's tool calls
(reading caches or git history on the way to a patch) a predictions file cannot show.

Resumable: each task's result is appended to a partial JSONL file as it finishes; a rerun
reuses a result whose prediction is byte-identical (same patch sha256) and regrades the rest,
and infrastructure failures (never a score) are graded again.

What is not covered: the patch applier is strict (every context line must match at the hunk's
stated position, as `git diff` on the task's broken repo writes it: no fuzz, no offsets);
binary patches and pure renames (no `---`/`+++` lines) change nothing. The local sandbox
backend applies the patch and runs the tests without any isolation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from carl.errors import UserError
from carl.rewards.monitor import MonitorConfig
from carl.rewards.reward import RewardConfig
from carl.sandbox.base import Sandbox, SandboxConfig, SandboxError
from carl.tasks.record import TaskRecord

Status = Literal["resolved", "failed", "empty", "missing", "patch_error", "infra_failure"]
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Prediction:
    instance_id: str
    model_patch: str
    """A unified diff against the task's broken repo (a/ b/ prefixes, as `git diff` writes); may be ""."""
    model_name_or_path: str = ""

    @property
    def patch_sha256(self) -> str:
        return hashlib.sha256(self.model_patch.encode()).hexdigest()


@dataclass(frozen=True)
class GradeConfig:
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Base config of the sandbox the patch is applied in and of the reward's clean sandbox (the
    task's venv and env vars are added, as for an RL rollout)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The test reward's settings (its `sandbox` is replaced by the task's, as in run_rollout)."""
    monitor: MonitorConfig = field(default_factory=lambda: MonitorConfig(action="zero"))
    """RL's action (carl.train.config.TrainConfig.monitor): a flagged prediction's reward is 0.
    `resolved` never counts a flagged prediction, whatever the action (as carl eval)."""


@dataclass(frozen=True)
class GradedTask:
    """One task's outcome (a line of the partial file, an entry of the report's "tasks")."""

    instance_id: str
    status: Status
    """"resolved"; "failed" (tests fail, or pass with a monitor flag); "empty" (empty patch, not
    run); "missing" (no prediction); "patch_error" (does not apply); "infra_failure" (not scored)."""
    resolved: bool = False
    reward: float = 0.0
    """The RL reward: the test reward after the monitor's action."""
    test_reward: float = 0.0
    """The test reward alone (1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed)."""
    fraction_passed: float = 0.0
    monitor_flags: tuple[str, ...] = ()
    """Kinds of the monitor's flags (carl.rewards.monitor.FLAG_KINDS), sorted."""
    monitor_evidence: tuple[str, ...] = ()
    """"kind: evidence" per flag."""
    infra_failure: bool = False
    reason: str = ""
    """Why it is not resolved (one line), or why its infrastructure failed; "" when resolved."""
    failed_tests: tuple[str, ...] = ()
    """FAIL_TO_PASS / PASS_TO_PASS node ids that did not pass."""
    applied: tuple[str, ...] = ()
    """Non-test paths of the patch applied in the clean sandbox."""
    ignored: tuple[str, ...] = ()
    """Test and test-config paths of the patch, NOT applied (the original tests ran)."""
    duration_s: float = 0.0
    patch_sha256: str = ""
    """sha256 of the graded model_patch ("" when missing): a rerun reuses the result only for this patch."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GradedTask:
        """From a line of the partial file (JSON lists back to tuples; unknown keys ignored)."""
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}  # annotations are strings here
        return cls(**{k: tuple(v) if types[k].startswith("tuple") else v for k, v in d.items() if k in types})


def grade_all(tasks: list[TaskRecord], predictions: Mapping[str, Prediction], config: GradeConfig,
              partial_path: str | Path, workers: int, done: dict[str, GradedTask] | None = None,
              on_graded: Callable[[GradedTask], None] | None = None,
              submit: Callable[[int], Future] | None = None) -> list[GradedTask]:
    """Every task's outcome, in the order of `tasks`. Those in `done` (`load_partial`) are kept;
    the others are graded `workers` at once (in threads of this process, or by `submit(task
    index)`, e.g. Ray actors running `GradeJobs`), each appended to `partial_path` when it finishes."""
    from carl.io import append_jsonl
    from carl.types import to_jsonable

    results = dict(done or {})
    todo = [i for i, t in enumerate(tasks) if t.instance_id not in results]
    pool = None
    if submit is None:
        pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo) or 1)))

        def submit(i: int) -> Future:
            return pool.submit(grade_prediction, tasks[i], predictions.get(tasks[i].instance_id), config)
    try:
        futures = [submit(i) for i in todo]
        for future in as_completed(futures):
            graded = future.result()
            append_jsonl(partial_path, to_jsonable(graded))
            results[graded.instance_id] = graded
            if on_graded is not None:
                on_graded(graded)
    finally:  # interrupted: grades in flight finish (their sandboxes close), queued ones never start
        if pool is not None:  # (Ray's submit: the caller's pool)
            pool.shutdown(wait=True, cancel_futures=True)
    return [results[t.instance_id] for t in tasks]


@dataclass(frozen=True)
class GradeJobs:
    """Grades run by Ray actors (carl.rollout.workers.RayWorkers, `carl bench grade --ray`): sent to
    each actor once, pickled; run(task index, _, _) grades that task in the actor's own sandboxes."""

    tasks: list[TaskRecord]
    predictions: Mapping[str, Prediction]
    config: GradeConfig

    def runner(self) -> Callable[[int, int, int], GradedTask]:
        def run(i: int, _sample: int = 0, _version: int = 0) -> GradedTask:
            return grade_prediction(self.tasks[i], self.predictions.get(self.tasks[i].instance_id), self.config)

        return run


def grade_prediction(task: TaskRecord, prediction: Prediction | None, config: GradeConfig) -> GradedTask:
    """One task's outcome (see the module docstring)."""
    from carl.rewards.episode import reward_from_trajectory
    from carl.rewards.shaping import ShapingConfig, training_reward
    from carl.sandbox import open_sandbox
    from carl.tasks.store import broken_repo_dir, sandbox_config_for
    from carl.types import Trajectory

    if prediction is None:
        return GradedTask(task.instance_id, "missing", reason="no prediction for this task")
    digest = prediction.patch_sha256
    if not prediction.model_patch.strip():
        return GradedTask(task.instance_id, "empty", reason="empty patch", patch_sha256=digest)
    t0 = time.monotonic()
    trajectory = Trajectory(task_id=task.instance_id)  # no turns: the monitor reads the final diff only
    try:
        sandbox_config = sandbox_config_for(task, config.sandbox)
        with open_sandbox(broken_repo_dir(task), sandbox_config) as sandbox:
            error = apply_patch_in(sandbox, prediction.model_patch)
            if error:
                return GradedTask(task.instance_id, "patch_error", reason=f"the patch does not apply: {error}",
                                  duration_s=time.monotonic() - t0, patch_sha256=digest)
            # the reward's clean sandbox gets the task's environment, as in run_rollout
            ep = reward_from_trajectory(trajectory, task, sandbox,
                                        dataclasses.replace(config.reward, sandbox=sandbox_config), config.monitor)
    except Exception:  # a crash while grading becomes an infra-failure record, as a crashed rollout does
        lines = [line for line in traceback.format_exc().splitlines() if line.strip()]
        return GradedTask(task.instance_id, "infra_failure", infra_failure=True, reason=lines[-1][:300],
                          duration_s=time.monotonic() - t0, patch_sha256=digest)
    _, resolved = training_reward(ep, trajectory, ShapingConfig())
    r = ep.result
    flags = sorted(ep.monitor.kinds())
    if ep.infra_failure:
        status, reason = "infra_failure", (r.infra_error or "no detail").splitlines()[0][:300]
    elif resolved:
        status, reason = "resolved", ""
    elif r.passed:
        status, reason = "failed", f"the tests pass, but the monitor flagged it: {', '.join(flags)}"
    else:
        status, reason = "failed", (r.feedback.splitlines() or ["the tests did not pass"])[0].rstrip(".")
        if flags:
            reason += f"; monitor flags: {', '.join(flags)}"
    return GradedTask(
        instance_id=task.instance_id,
        status=status,
        resolved=resolved,
        reward=ep.reward,
        test_reward=r.reward,
        fraction_passed=r.fraction_passed,
        monitor_flags=tuple(flags),
        monitor_evidence=tuple(f"{f.kind}: {f.evidence}" for f in ep.monitor.flags),
        infra_failure=ep.infra_failure,
        reason=reason,
        failed_tests=tuple(n for n, o in r.tests.items() if o != "passed"),
        applied=r.applied,
        ignored=r.ignored,
        duration_s=time.monotonic() - t0,
        patch_sha256=digest,
    )


# The strict applier, run inside the sandbox (its module is standard library only): the patch
# writes only where the sandbox lets it, as the agent's own edits would.
def _apply_script() -> str:
    import carl.tasks.patch

    return inspect.getsource(carl.tasks.patch) + """
import json, sys
try:
    touched = apply_patch(Path("."), sys.stdin.read())
except Exception as e:  # PatchError, or headers the applier cannot read: the prediction's fault
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
else:
    print(json.dumps({"touched": touched}))
"""


def apply_patch_in(sandbox: Sandbox, patch: str) -> str:
    """Apply unified diff `patch` to the sandbox's workspace; "" when it applied, else why not.
    Raises SandboxError when the sandbox cannot run the applier (an infrastructure failure)."""
    res = sandbox.exec(["python3", "-I", "-c", _apply_script()], stdin=patch)
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SandboxError(f"the patch applier did not run (exit {res.exit_code}): {res.output[-1000:]}") from None
    if "error" in out:
        return out["error"][:500]
    return "" if out["touched"] else "no file in it (expected a unified diff with ---/+++ headers)"


# ------------------------------------------------------------------------------ input files


def load_predictions(path: str | Path) -> dict[str, Prediction]:
    """instance_id -> Prediction from a SWE-bench predictions file: JSONL (one object a line), or
    for a `.json` file a list of objects or an object keyed by instance id (SWE-agent's preds.json).
    Each object: instance_id (str), model_patch (str; null counts as empty), model_name_or_path
    (optional str). UserError naming the file, the entry and the field for anything else."""
    from carl.io import read_jsonl_numbered

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--predictions: {str(path)!r} does not exist")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                data = [{"instance_id": k, **v} if isinstance(v, dict) else v for k, v in data.items()]
            if not isinstance(data, list):
                raise UserError(f"--predictions: {path}: got a JSON {type(data).__name__}, expected a list of "
                                "predictions or an object keyed by instance_id")
            rows = list(enumerate(data, 1))
            where = "entry"
        else:
            rows, where = read_jsonl_numbered(path), "line"
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"--predictions: {e}") from None
    out: dict[str, Prediction] = {}
    for number, d in rows:
        at = f"--predictions: {path}: {where} {number}"
        if not isinstance(d, dict):
            raise UserError(f"{at}: got a JSON {type(d).__name__}, expected an object with instance_id and model_patch")
        iid, patch, name = d.get("instance_id"), d.get("model_patch", None), d.get("model_name_or_path") or ""
        if not isinstance(iid, str) or not iid:
            raise UserError(f"{at}: instance_id: got {iid!r}, expected a non-empty string")
        if "model_patch" not in d:
            raise UserError(f"{at}: model_patch: missing, expected a unified diff (a string, may be empty)")
        if patch is not None and not isinstance(patch, str):
            raise UserError(f"{at}: model_patch: got a {type(patch).__name__}, expected a unified diff (a string)")
        if not isinstance(name, str):
            raise UserError(f"{at}: model_name_or_path: got {name!r}, expected a string")
        if iid in out:
            raise UserError(f"{at}: instance_id: {iid!r} is predicted twice, expected one prediction per task")
        out[iid] = Prediction(iid, patch or "", name)
    return out


def check_known(predictions: Mapping[str, Prediction], tasks: list[TaskRecord], tasks_path: str) -> None:
    """UserError naming the predictions for tasks not in the task file: grading a predictions file
    made for other tasks would report a pass@1 that means nothing."""
    known = {t.instance_id for t in tasks}
    unknown = sorted(set(predictions) - known)
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise UserError(f"--predictions: {len(unknown)} predictions name tasks that are not in --tasks "
                        f"{tasks_path!r}: {shown}; expected instance ids of that file (drop those lines to "
                        "grade a subset)")


def load_partial(path: str | Path, predictions: Mapping[str, Prediction]) -> dict[str, GradedTask]:
    """The results of an earlier run that still hold: instance_id -> its last result whose patch
    is the one predicted now (missing: still missing), infrastructure failures left out (graded again)."""
    from carl.io import read_jsonl_numbered

    path = Path(path)
    if not path.is_file():
        return {}
    out: dict[str, GradedTask] = {}
    try:
        rows = read_jsonl_numbered(path)
        for lineno, d in rows:
            if not isinstance(d, dict):
                raise ValueError(f"{path}:{lineno}: got a JSON {type(d).__name__}")
            g = GradedTask.from_dict(d)
            if g.status not in STATUSES:
                raise ValueError(f"{path}:{lineno}: status {g.status!r}")
            p = predictions.get(g.instance_id)
            if g.patch_sha256 == (p.patch_sha256 if p is not None else "") and not g.infra_failure:
                out[g.instance_id] = g
            else:
                out.pop(g.instance_id, None)
    except (ValueError, TypeError) as e:
        raise UserError(f"partial results {str(path)!r}: {e}; expected the lines an earlier `carl bench grade` "
                        "wrote (delete the file to grade every task again)") from None
    return out
