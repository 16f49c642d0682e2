"""A run's state between steps: what a checkpoint resumes from, and how a finished run is continued
or branched (`carl train --extend`, `carl train --branch-from`).

    phase        warm_start -> rl -> done
    sft_epoch    warm-start epochs done
    rl_step      RL optimizer steps done (= the weights version the engine serves)
    task_pos     next position in the RL task order
    reports      the eval summaries so far ("warm_start", "rl")
    metrics_rows metrics.jsonl rows that belong to the work up to this checkpoint
    rl_rollouts  RL rollouts sampled so far (rl.max_rollouts counts them; 0 in checkpoints older
                 than the field, which then count from their resume)
    rl_out_of_time  a budget (rl.max_wall_s or rl.max_rollouts) ended RL early: a resume goes
                 straight to the final eval

Stored in each checkpoint's trainer.pt as a plain dict (`to_dict`), read back with `from_dict`,
which names an unknown or missing field instead of guessing.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carl.errors import UserError
from carl.io import atomic_write_text, read_jsonl

PHASES = ("warm_start", "rl", "done")


@dataclass
class RunState:
    phase: str = "warm_start"
    sft_epoch: int = 0
    rl_step: int = 0
    task_pos: int = 0
    reports: dict[str, Any] = field(default_factory=dict)
    metrics_rows: int = 0
    rl_rollouts: int = 0
    rl_out_of_time: bool = False

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase: got {self.phase!r}, expected one of {list(PHASES)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "trainer state") -> RunState:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"{where}: unknown field(s) {unknown}; expected some of {sorted(known)}")
        return cls(**d)

    def reopen_rl(self) -> None:
        """A state saved as done, made to (re)enter RL: no after-RL report, the clock reset."""
        self.phase = "rl"
        self.reports.pop("rl", None)
        self.rl_out_of_time = False


def extend_run(run_dir: Path, steps: int) -> int | None:
    """Reopen a finished run so that training goes on to `steps` RL steps (also after rl.max_wall_s
    or rl.max_rollouts stopped it: a rollout budget counts the whole run, so raise it too); returns
    the step it continues from, or None when it already ran `steps`. The after-RL eval (its eval
    file, its metrics row, report.json) is dropped, to be made again after the new steps: copy the
    run directory first to keep it."""
    from carl.train.checkpoint import latest_checkpoint, load_state, save_state
    from carl.io import atomic_write_jsonl

    last = latest_checkpoint(run_dir)
    if last is None or not (run_dir / "report.json").exists():
        raise UserError(f"--extend: {run_dir} holds no finished run (no report.json or checkpoint)")
    state = load_state(last)
    if state.phase != "done" or state.rl_step == 0:
        raise UserError(f"--extend: {last} is at phase {state.phase!r} after {state.rl_step} RL steps; "
                        "expected a finished RL run (rerun without --extend to resume it)")
    if state.rl_step >= steps:
        return None
    step = state.rl_step
    state.reopen_rl()
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl")
            if not (r["step"] == step and all(k == "step" or k.startswith("eval/") for k in r))]
    state.metrics_rows = len(rows)  # the resume keeps these rows and logs the new steps after them
    atomic_write_jsonl(run_dir / "metrics.jsonl", rows)
    (run_dir / "eval" / f"step{step:06d}.json").unlink(missing_ok=True)
    save_state(last, state)
    (run_dir / "report.json").unlink()  # last: until here, the run still reads as finished
    return step


def branch_run(source: Path, step: int, run_dir: Path, reevaluate: bool = False) -> None:
    """Start `run_dir` at checkpoint `step` of the run in `source`, as its RL phase: the checkpoint
    (model, optimizer, RNG), the metrics rows and eval reports up to it. Task files are the
    caller's (`branch_task_files`). Does nothing when `run_dir` already has a checkpoint (a
    resumed branch). `reevaluate` (step 0 only): leave the warm-start eval behind, so the branch
    makes its own before RL (`warm_eval_changes` says when a branch needs that)."""
    if reevaluate and step != 0:
        raise UserError(f"--branch-from: step {step}: only a branch from step 0 can evaluate its warm start again")
    from carl.train.checkpoint import load_state, save_state

    src = source / "checkpoints" / f"step_{step:06d}"
    if not (src / "trainer.pt").exists():
        have = sorted(p.name for p in (source / "checkpoints").glob("step_*") if ".tmp-" not in p.name)
        raise UserError(f"--branch-from: {source} has no checkpoint step_{step:06d}; it has {have}")
    ckpts = run_dir / "checkpoints"
    if (ckpts / "latest").exists():
        return
    ckpts.mkdir(parents=True, exist_ok=True)
    tmp = ckpts / f"step_{step:06d}.tmp-branch"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    state = load_state(tmp)
    if state.phase == "warm_start":
        raise UserError(f"--branch-from: {src} is mid warm start; branch from a checkpoint after it")
    state.reopen_rl()
    if reevaluate:
        state.reports.pop("warm_start", None)
    rows = [r for r in read_jsonl(source / "metrics.jsonl") if r["step"] <= step] \
        if (source / "metrics.jsonl").exists() else []
    drop_eval = step > 0 or reevaluate  # the eval at the branch point is the branch's own to make (or not)
    rows = [r for r in rows if not (r["step"] == step and drop_eval and all(
        k == "step" or k.startswith("eval/") for k in r))]
    from carl.io import atomic_write_jsonl

    atomic_write_jsonl(run_dir / "metrics.jsonl", rows)
    state.metrics_rows = len(rows)
    for report in (source / "eval").glob("step*.json") if (source / "eval").exists() else []:
        if int(report.stem.removeprefix("step")) <= step and not (drop_eval and report.stem == f"step{step:06d}"):
            (run_dir / "eval").mkdir(parents=True, exist_ok=True)
            shutil.copy2(report, run_dir / "eval" / report.name)
    save_state(tmp, state)
    tmp.rename(ckpts / f"step_{step:06d}")
    atomic_write_text(ckpts / "latest", f"step_{step:06d}\n")


def branch_task_files(source: Path) -> dict[str, str]:
    """The task files a branch of `source` trains and evaluates on: `source`'s own JSONL files, or
    its micro world's (so the branch never rebuilds the world)."""
    from carl.config import load_config
    from carl.train.config import TrainConfig

    cfg = load_config(TrainConfig, source / "config.toml")
    if cfg.tasks:
        files = {"tasks": cfg.tasks, "rl_tasks": cfg.rl_tasks, "eval_tasks": cfg.eval_tasks}
        return {k: v for k, v in files.items() if v}
    micro = source / "micro"
    files = {"tasks": micro / "warm_start.jsonl", "rl_tasks": micro / "rl.jsonl", "eval_tasks": micro / "eval.jsonl"}
    if cfg.micro.templates:  # the tasks of micro.templates, as the source trained and evaluated on them
        from carl.micro.world import templates_file

        files |= {"rl_tasks": templates_file(micro, "rl"), "eval_tasks": templates_file(micro, "eval")}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise UserError(f"--branch-from: {source}'s micro world is incomplete (missing {missing})")
    return {k: str(p.resolve()) for k, p in files.items()}


EVAL_SETTINGS = ("limits", "eval", "rollout.top_p", "seed")
"""What an eval's outcomes depend on, besides weights and tasks (`seed` names the sampler's episode
streams: under another seed, the warm start's eval is not on the branch's random numbers)."""


def warm_eval_changes(source: Path, cfg: Any) -> list[str]:
    """The settings an eval depends on that a branch of `source` changes, as `key: old -> new`: its
    warm-start eval, made under the source's settings, does not measure the branch's starting point
    under its own (a branch with limits.context_strategy=truncate evaluated with summaries)."""
    changes = setting_changes(source, cfg, EVAL_SETTINGS)
    tasks = Path(branch_task_files(source)["eval_tasks"]).resolve()
    if cfg.eval_tasks and Path(cfg.eval_tasks).resolve() != tasks:
        changes.append(f"eval_tasks: {str(tasks)!r} -> {cfg.eval_tasks!r}")
    return changes


INHERITED_SETTINGS = ("warm_start",)
"""What made the checkpoint a branch starts from: a branch runs no warm start of its own, so it takes
these from its source, and its config.toml records the warm start it has."""


def inherited_settings(source: Path) -> list[str]:
    """`source`'s settings under INHERITED_SETTINGS, as overrides `key=VALUE`."""
    import tomllib

    from carl.config import load_config, to_toml, toml_value
    from carl.train.config import TrainConfig

    flat = _flatten(tomllib.loads(to_toml(load_config(TrainConfig, source / "config.toml"))))
    return [f"{k}={toml_value(v)}" for k, v in flat.items() if is_under(k, INHERITED_SETTINGS)]


def setting_changes(source: Path, cfg: Any, prefixes: tuple[str, ...]) -> list[str]:
    """The settings under `prefixes` (a dotted key or section, e.g. "warm_start") on which `cfg` differs
    from the run at `source`, as `key: old -> new`."""
    import tomllib

    from carl.config import load_config, to_toml
    from carl.train.config import TrainConfig

    source_cfg = load_config(TrainConfig, source / "config.toml")  # defaults and renamed keys as `cfg` has them
    old, new = (_flatten(tomllib.loads(to_toml(c))) for c in (source_cfg, cfg))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
            if is_under(k, prefixes) and old.get(k) != new.get(k)]


def is_under(key: str, prefixes: tuple[str, ...]) -> bool:
    """`key` is one of `prefixes` or a setting in one of their sections ("rl.lr" is under "rl")."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out
