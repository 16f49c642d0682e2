"""`carl midtrain`: continued pretraining of a causal LM on a team's repositories, resumable at any step.

    data    rank 0, once per run directory: sources -> filter, deduplicate, split by file (data.py)
            -> tokenize, general data to its share, pack (packing.py) -> <run_dir>/data/
            (manifest.json written last); the other ranks read it from there
    model   model.path (SmolLM2 or a Hugging Face folder) -> fp32 master weights, the last
            model.trainable_layers blocks trained, FSDP2 over N ranks, AdamW or Muon (carl.train.ranks)
    resume  the latest complete checkpoint (weights, optimizer, step); metrics.jsonl rewound to the
            rows that checkpoint had seen, so a step run again is logged once
    step 0  held-out eval: the "before" numbers
    step s  the rows of step s (a seeded order per epoch) -> train_step -> metrics row, progress line
            -> held-out eval every eval_every steps -> checkpoint every checkpoint_every steps
    end     held-out eval and checkpoint after the last step -> report.json (before vs after)

Every rank runs this function (one rank is N ranks with the communication skipped); rank 0 alone
writes files and prints. A checkpoint's model/ is a Hugging Face folder with the tokenizer:
`carl train model.path=<ckpt>/model` continues from it, `carl eval --checkpoint <ckpt>` evaluates it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from carl.config import save_config
from carl.engine.hf import DTYPES, load_model, pad_token_id
from carl.errors import UserError
from carl.io import atomic_write_json, atomic_write_text
from carl.midtrain.config import MidtrainConfig, OptimConfig
from carl.midtrain.data import check_sources, collect
from carl.midtrain.packing import Dataset, build_dataset, fingerprint, load_dataset, save_dataset, step_rows
from carl.midtrain.step import GROUPS, evaluate, heldout_report, train_step
from carl.tasks.store import cache_dir
from carl.train.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from carl.train.loop import resolve_model_path, seed_everything, set_trainable
from carl.train.metrics import MetricsLog, git_revision
from carl.train.progress import RunProgress, clock
from carl.train.ranks import Ranks, make_optimizer, shard_model, torchrun_ranks
from carl.train.trainer import SavedState, gathered_state, set_state

PLOTS = {
    "loss.png": ["train/loss", *(f"heldout/{g}" for g in GROUPS)],
    "lr.png": ["train/lr"],
    "throughput.png": ["train/tokens_per_s"],
    "grad_norm.png": ["train/grad_norm"],
}


@dataclass
class MidtrainState:
    """What a checkpoint resumes from (stored in its trainer.pt)."""

    step: int = 0
    """Optimizer steps done."""
    tokens: int = 0
    """Target tokens trained on so far."""
    metrics_rows: int = 0
    """metrics.jsonl rows that belong to the work up to this checkpoint."""

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> MidtrainState:
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) != known:
            raise UserError(f"{where}: not a midtrain checkpoint (its state has fields {sorted(d)}, "
                            f"expected {sorted(known)})")
        return cls(**d)


def midtrain(cfg: MidtrainConfig, console: Console | None = None) -> dict[str, Any]:
    with torchrun_ranks() as ranks:
        return run_midtrain(cfg, ranks, console)


def run_midtrain(cfg: MidtrainConfig, ranks: Ranks, console: Console | None) -> dict[str, Any]:
    lead = ranks.rank == 0
    console = console if console is not None and lead else Console(quiet=not lead)

    def say(text: str) -> None:  # plain text: paths and specs are not rich markup
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    check_sources(cfg.data)
    run_dir = Path(cfg.run_dir)
    if lead:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.toml")
        atomic_write_text(run_dir / "git_revision.txt", git_revision(Path(__file__).parent) + "\n")
    log = MetricsLog(run_dir, cfg.tracking if lead else ())
    seed_everything(cfg.seed)

    tokenizer, model, optimizer = build_model(cfg, ranks)
    data = prepared_data(cfg, tokenizer, run_dir, ranks, say)
    pad_id, compute_dtype, T = pad_token_id(tokenizer), DTYPES[cfg.model.dtype], cfg.data.seq_len
    num_rows = data.train.num_rows(T)
    if num_rows == 0:
        raise UserError("data: no training tokens (every file of data.sources was dropped or held out)")
    plots = {**PLOTS, "heldout_sources.png": sorted({f"heldout/source/{d['source']}" for d in data.heldout_docs
                                                     if d["group"] != "general"})}

    state = MidtrainState()
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load(ckpt, model, optimizer, ranks)
        say(f"resumed from {ckpt} (step {state.step} of {cfg.steps})")
    if lead:
        log.rewind(state.metrics_rows)

    def heldout(step: int) -> None:
        t0 = time.monotonic()
        say(f"held-out eval at step {step}: {len(data.heldout.tokens_N):,} tokens in {len(data.heldout_docs)} files")
        with RunProgress(console) as progress:
            progress.phase(f"held-out eval at step {step}", data.heldout.num_rows(T), "rows")
            nll_D, count_D = evaluate(model, data.heldout, T, cfg.micro_batch_size, pad_id, compute_dtype, ranks,
                                      on_progress=lambda done, total: progress.advance(done - progress.done))
        metrics, files = heldout_report(nll_D, count_D, data.heldout_docs)
        if lead:
            log.log(step, {**metrics, "time/eval_s": time.monotonic() - t0})
            log.eval_report(step, {"step": step, "metrics": metrics, "files": files})
        say("  " + ", ".join(f"{k.removeprefix('heldout/')} {v:.4f}" for k, v in metrics.items())
            + f" ({time.monotonic() - t0:.0f} s)")

    def checkpoint() -> None:
        state.metrics_rows = len(log.rows()) if lead else 0
        save(run_dir, model, tokenizer, optimizer, ranks, state, cfg.keep_checkpoints)
        if lead:
            log.plot(plots)

    if state.step == 0:
        heldout(0)
    start_step, t_start = state.step, time.monotonic()
    while state.step < cfg.steps:
        t0 = time.monotonic()
        lr = set_lr(optimizer, lr_at(state.step, cfg.optim, cfg.steps))
        metrics = train_step(model, optimizer, data.train, step_rows(state.step, cfg.batch_size, num_rows, cfg.seed),
                             T, cfg.micro_batch_size, cfg.optim.grad_clip, pad_id, compute_dtype, ranks)
        state.step += 1
        state.tokens += int(metrics["train/tokens"])
        step_s = time.monotonic() - t0
        metrics.update({"train/lr": lr, "train/epoch": state.step * cfg.batch_size / num_rows,
                        "train/tokens_total": float(state.tokens), "train/tokens_per_s": metrics["train/tokens"] / step_s,
                        "time/step_s": step_s})
        if lead:
            log.log(state.step, metrics)
        eta_s = (time.monotonic() - t_start) / (state.step - start_step) * (cfg.steps - state.step)
        say(f"step {state.step}/{cfg.steps}  loss {metrics['train/loss']:.4f}  lr {lr:.2e}  "
            f"{metrics['train/tokens_per_s']:,.0f} tok/s  epoch {metrics['train/epoch']:.2f}  ETA {clock(eta_s)}")
        last = state.step == cfg.steps
        if last or (cfg.eval_every and state.step % cfg.eval_every == 0):
            heldout(state.step)
        if last or state.step % cfg.checkpoint_every == 0:
            checkpoint()

    report = before_after(log.rows() if lead else [], cfg.steps)
    if lead:
        atomic_write_json(run_dir / "report.json", {**report, "data": data.summary})
        print_report(say, report, run_dir)
    return report


# ---------------------------------------------------------------- model, data, checkpoints, schedule


def build_model(cfg: MidtrainConfig, ranks: Ranks) -> tuple[Any, Any, Any]:
    """(tokenizer, model, optimizer): fp32 master weights of model.path with its last
    model.trainable_layers blocks trained, sharded over the ranks, and the optimizer of optim.name."""
    device = cfg.model.device
    if ranks.world > 1 and device.startswith("cuda"):
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"  # torchrun: one GPU per rank
    tokenizer, model = load_model(resolve_model_path(cfg.model.path), torch.float32, device)
    set_trainable(model, cfg.model.trainable_layers)
    model = shard_model(model, ranks)
    optimizer = make_optimizer(cfg.optim.name, model, cfg.optim.lr, cfg.optim.weight_decay, sharded=ranks.world > 1)
    return tokenizer, model, optimizer


def prepared_data(cfg: MidtrainConfig, tokenizer: Any, run_dir: Path, ranks: Ranks, say) -> Dataset:
    """The run's packed data: prepared by rank 0 into <run_dir>/data/ unless it is there already
    (a resumed run trains on exactly the data it started with), then read by every rank."""
    data_dir = run_dir / "data"
    want = fingerprint(cfg.data, cfg.seed, tokenizer)
    if ranks.rank == 0 and load_dataset(data_dir) is None:
        t0 = time.monotonic()
        say(f"preparing data into {data_dir}")
        collection = collect(cfg.data, cfg.seed, cache_dir() / "midtrain" / "downloads", log=say)
        save_dataset(build_dataset(collection, cfg.data, cfg.seed, tokenizer, say), data_dir, want)
        say(f"data ready ({time.monotonic() - t0:.0f} s)")
    ranks.broadcast(None)  # the other ranks wait for rank 0's data
    data, found = load_dataset(data_dir) or (None, None)
    if found != want:
        raise UserError(f"{data_dir} holds data prepared for another data config, seed or tokenizer than this "
                        "run's; use a new run_dir (or delete that folder to prepare the data again)")
    return data


def save(run_dir: Path, model: Any, tokenizer: Any, optimizer: Any, ranks: Ranks, state: MidtrainState,
         keep: int) -> None:
    """Checkpoint `state.step` (carl.train.checkpoint: written to a temp folder, then renamed); every rank calls it."""
    model_state, optim_state = gathered_state(model, optimizer, ranks)
    if ranks.rank == 0:
        save_checkpoint(run_dir, state.step, model, tokenizer, SavedState(optim_state), None,
                        dataclasses.asdict(state), keep=keep, pinned=(), model_state=model_state)


def load(ckpt: Path, model: Any, optimizer: Any, ranks: Ranks) -> MidtrainState:
    """Weights, optimizer state and RNG from `ckpt`, on any number of ranks."""
    weights = load_model(ckpt / "model", torch.float32, "cpu")[1].state_dict()
    optim = SavedState(None)
    _, trainer_state = load_trainer_state(ckpt, optim, None)
    set_state(model, optimizer, ranks, weights, optim.state)
    return MidtrainState.from_dict(trainer_state, where=str(ckpt))


def lr_at(step: int, optim: OptimConfig, steps: int) -> float:
    """Linear warmup over optim.warmup_steps, then cosine decay to lr x min_lr_ratio at the last step."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    progress = (step - optim.warmup_steps) / max(1, steps - 1 - optim.warmup_steps)
    return optim.lr * (optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer: Any, lr: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


# ---------------------------------------------------------------- the report


def before_after(rows: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Held-out losses at step 0 and after the last step, from the metrics rows."""
    evals = {r["step"]: {k: v for k, v in r.items() if k.startswith("heldout/")} for r in rows
             if any(k.startswith("heldout/") for k in r)}
    trained = [r for r in rows if "train/tokens_total" in r]
    return {"steps": steps, "tokens_trained": trained[-1]["train/tokens_total"] if trained else 0.0,
            "before": evals.get(0, {}), "after": evals.get(steps, {})}


def print_report(say, report: dict[str, Any], run_dir: Path) -> None:
    say(f"held-out loss (mean NLL per token) before -> after {report['steps']} steps "
        f"({report['tokens_trained']:,.0f} tokens trained):")
    for key, before in report["before"].items():
        after = report["after"].get(key)
        shown = "-" if after is None else f"{after:.4f} ({after - before:+.4f})"
        say(f"  {key.removeprefix('heldout/'):<28} {before:.4f} -> {shown}")
    say(f"run directory: {run_dir} (config.toml, metrics.jsonl, eval/ per-file losses, plots/, checkpoints/)")

