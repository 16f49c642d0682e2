"""Run directories and metrics: metrics.jsonl, sample transcripts, PNG plots refreshed as it trains.

A run directory holds:
  config.toml          the resolved config
  git_revision.txt     the code revision (and whether the tree was dirty)
  metrics.jsonl        one JSON object per step (append-only, fsynced; rewound on resume to the
                       rows the checkpoint had seen, so a step that is run again is logged once)
  transcripts/         sample transcripts per step (text)
  plots/*.png          reward, pass rate, tokens per episode, loss terms (refreshed)
  checkpoints/         see carl.train.checkpoint
TensorBoard is an optional sink when installed (`tensorboard` package).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from carl.io import append_jsonl, atomic_write_json, atomic_write_jsonl, atomic_write_text, read_jsonl

# plot file -> metric keys drawn in it (keys missing from the log are skipped)
PLOTS = {
    "reward.png": ["rl/reward_mean", "eval/pass@1"],
    "pass_rate.png": ["rl/pass_rate", "eval/pass@1", "eval/pass@k"],
    "tokens.png": ["rl/tokens_per_episode", "rl/generated_tokens_per_episode"],
    "loss.png": ["loss/total", "loss/grpo", "loss/kl", "loss/self_distill", "loss/sft"],
    "tool_errors.png": ["rl/tool_error_rate"],
    # episodes that ended with a finish call: reward ignores it, so RL can unlearn it (measured)
    "finish.png": ["rl/finish_rate", "eval/finish_rate"],
    "kl.png": ["kl/kl"],  # KL(policy || RL start) per sampled token, when rl.kl_coef > 0
    # seconds per RL step: the whole step, the trainer waiting for rollouts, training, weight sync
    "time.png": ["time/step_s", "time/rollout_wait_s", "time/train_s", "sync/total_s"],
    # engine vs trainer log-probs on the sampled tokens (carl.rl.mismatch): drift shows here first
    "mismatch.png": ["mismatch/abs_diff_mean", "mismatch/frac_over_0.1", "mismatch/ratio_std"],
    # weight sync: bytes sent as a share of the full bf16 weights, and of the step's time
    "sync.png": ["sync/bytes_ratio", "sync/frac_of_step"],
    # how many versions behind the trained step the rollouts' tokens were (async RL)
    "staleness.png": ["staleness/token_mean", "staleness/token_max", "time/trainer_idle_frac", "engine/busy_frac"],
}


def git_revision(cwd: str | Path | None = None) -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if rev.returncode != 0:
        return "unknown (not a git checkout)"
    return rev.stdout.strip() + (" (dirty)" if dirty.stdout.strip() else "")


TRACKERS = ("tensorboard", "wandb", "trackio")


class MetricsLog:
    """metrics.jsonl (always) and the trackers the run asks for (`tracking`): "tensorboard" (events
    under <run_dir>/tb), "wandb", "trackio". Each is an optional dependency: asking for one that is
    not installed is a one-line error naming the package to install."""

    def __init__(self, run_dir: str | Path, tracking: tuple[str, ...] = (), project: str = "carl"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self._sinks = [_open_tracker(name, self.run_dir, project) for name in tracking]

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        append_jsonl(self.path, row)
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        for sink in self._sinks:
            sink(step, scalars)

    def rows(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path) if self.path.exists() else []

    def rewind(self, num_rows: int) -> int:
        """Keep the first `num_rows` rows and drop the rest, with any torn last line; returns how
        many rows were dropped. On resume, the rows logged after the checkpoint belong to work that
        is about to run again: kept, they would show that step twice, and a torn line would glue
        itself to the next row."""
        rows = self.rows()
        if not self.path.exists():
            return 0
        atomic_write_jsonl(self.path, rows[:num_rows])
        return max(0, len(rows) - num_rows)

    def transcript(self, step: int, name: str, text: str) -> None:
        atomic_write_text(self.run_dir / "transcripts" / f"step{step:05d}_{name}.txt", text)

    def eval_report(self, step: int, report: dict[str, Any]) -> Path:
        """A held-out evaluation's full report (summary and per-task results) as eval/stepNNNNNN.json."""
        path = self.run_dir / "eval" / f"step{step:06d}.json"
        atomic_write_json(path, report)
        return path

    def plot(self, plots: dict[str, list[str]] = PLOTS) -> list[Path]:
        return write_plots(self.rows(), self.run_dir / "plots", plots)


def write_plots(rows: list[dict[str, Any]], out_dir: Path, plots: dict[str, list[str]] = PLOTS) -> list[Path]:
    """One PNG per entry of `plots` (file -> metric keys; default: the RL trainer's PLOTS) with the
    series present in `rows`; returns the files written. A plot whose series are those it was last
    drawn from (their digest is kept in out_dir/.plots.json) is not drawn again: a run refreshes its
    plots after every step, and an eval-only plot changes only at evals."""
    from matplotlib.figure import Figure  # no pyplot: no global figure registry, no GUI backend

    digests_path = out_dir / ".plots.json"
    try:
        drawn = json.loads(digests_path.read_text())
    except (OSError, ValueError):  # none yet (or unreadable): draw every plot
        drawn = {}
    written = []
    for fname, keys in plots.items():
        series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        digest = hashlib.sha256(repr(sorted(series.items())).encode()).hexdigest()[:16]
        if drawn.get(fname) == digest and (out_dir / fname).exists():
            continue
        fig = Figure(figsize=(6, 3.5))
        ax = fig.add_subplot()
        for k, pts in series.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=k)
        ax.set_xlabel("step")
        ax.set_title(fname.removesuffix(".png").replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.9)  # fixed: a layout pass draws twice
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{fname}.tmp.png"
        fig.savefig(tmp, dpi=90)
        tmp.replace(out_dir / fname)
        written.append(out_dir / fname)
        drawn[fname] = digest
    if written:
        atomic_write_json(digests_path, drawn)
    return written


def _plain(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    return v


def _open_tracker(name: str, run_dir: Path, project: str):
    """A function (step, scalars) -> None that logs to tracker `name`."""
    from carl.errors import UserError

    if name not in TRACKERS:
        raise UserError(f"tracking: got {name!r}, expected some of {list(TRACKERS)}")
    package = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}[name]
    try:
        if name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(run_dir / "tb"))
            return lambda step, scalars: [writer.add_scalar(k, v, step) for k, v in scalars.items()]
        if name == "wandb":
            import wandb

            wandb_run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), resume="allow")
            return lambda step, scalars: wandb_run.log(scalars, step=step)
        import trackio

        trackio.init(project=project, name=run_dir.name, resume="allow")
        return lambda step, scalars: trackio.log(scalars, step=step)
    except ImportError:
        raise UserError(f"tracking: {name!r} needs the {package} package: pip install {package}") from None
