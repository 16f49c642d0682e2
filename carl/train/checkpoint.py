"""Exact checkpoint and resume: model, optimizer, scheduler, RNG streams, data position, step.

Layout under `<run_dir>/checkpoints/`:
  step_000012/         one complete checkpoint (written as step_000012.tmp-*, then renamed)
    model/             a Hugging Face folder (save_pretrained, safetensors) + tokenizer
    trainer.pt         optimizer, scheduler, RNG states, trainer state (step, data position, ...)
    optimizer/         instead of trainer.pt's optimizer: its state sharded over the trainer ranks
                       (torch.distributed.checkpoint; checkpoint_optimizer = "sharded")
  latest               the name of the newest complete checkpoint (atomically replaced)

A crash while writing leaves only a *.tmp-* directory that resume ignores, so at most the
current step is lost; a full disk removes it at once and stops the run with a UserError saying
which checkpoint a rerun resumes from. Older checkpoints beyond `keep` are deleted after a new one
is complete, except the steps in `pinned` (step 0: the warm start, which `carl eval` and RL
variants reuse).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carl.errors import UserError, is_disk_full
from carl.io import atomic_write_text


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, scheduler,
                    trainer_state: dict[str, Any], keep: int = 2, pinned: tuple[int, ...] = (0,),
                    model_state: dict[str, torch.Tensor] | None = None, sharded_optimizer: Path | None = None) -> Path:
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=ckpt_root))
    try:
        # `model_state`: the full weights of a sharded model, gathered by the caller (carl.train.trainer)
        model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=model_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        if sharded_optimizer is not None:  # written by every rank (sharded_optimizer_dir), moved in whole
            Path(sharded_optimizer).rename(tmp / "optimizer")
        torch.save(
            {
                "step": step,
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "rng": rng_state(),
                "trainer_state": trainer_state,
            },
            tmp / "trainer.pt",
        )
    except Exception as e:  # OSError, or safetensors' own SafetensorError (not an OSError)
        if not is_disk_full(e):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # the partial checkpoint: give its space back at once
        raise disk_full(ckpt_root, step) from e
    final = ckpt_root / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    atomic_write_text(ckpt_root / "latest", name + "\n")
    pinned_names = {f"step_{s:06d}" for s in pinned}
    complete = sorted(p for p in ckpt_root.glob("step_*") if ".tmp-" not in p.name and p.name not in pinned_names)
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_root.glob("step_*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def disk_full(ckpt_root: Path, step: int) -> Exception:
    """The disk filled while checkpoint `step` was written: what to do, in a sentence."""
    pointer = ckpt_root / "latest"
    latest = pointer.read_text().strip() if pointer.exists() else None
    free_gb = shutil.disk_usage(ckpt_root).free / 1e9
    resume = f"it resumes from {latest}" if latest else "it starts again (no checkpoint was complete)"
    return UserError(f"no space left on the device of {ckpt_root} while writing checkpoint step {step} "
                     f"({free_gb:.1f} GB free now, the partial checkpoint removed); free some space and run "
                     f"the same command again: {resume}")


def sharded_optimizer_dir(run_dir: str | Path, step: int) -> Path:
    """A fresh directory for the ranks' optimizer shards of checkpoint `step`, before save_checkpoint
    moves it into the checkpoint (left behind by a crash, the next save removes it)."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"step_{step:06d}.tmp-optimizer-", dir=ckpt_root))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpt_root = Path(run_dir) / "checkpoints"
    pointer = ckpt_root / "latest"
    if not pointer.exists():
        return None
    path = ckpt_root / pointer.read_text().strip()
    return path if (path / "trainer.pt").exists() else None


def load_trainer_state(ckpt: Path, optimizer, scheduler) -> tuple[int, dict[str, Any]]:
    """Restore optimizer, scheduler and RNG from `ckpt`; returns (step, trainer_state)."""
    blob = torch.load(ckpt / "trainer.pt", weights_only=False)
    if optimizer is not None and blob["optimizer"] is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return blob["step"], blob["trainer_state"]


def load_state(ckpt: Path):
    """The RunState a checkpoint holds (without touching the optimizer or the RNG)."""
    from carl.train.state import RunState

    blob = torch.load(Path(ckpt) / "trainer.pt", weights_only=False)
    return RunState.from_dict(blob["trainer_state"], where=str(Path(ckpt) / "trainer.pt"))


def save_state(ckpt: Path, state) -> None:
    """Replace the RunState in a checkpoint's trainer.pt (atomically; the rest is kept)."""
    path = Path(ckpt) / "trainer.pt"
    blob = torch.load(path, weights_only=False)
    blob["trainer_state"] = state.to_dict()
    tmp = path.with_suffix(".pt.tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
