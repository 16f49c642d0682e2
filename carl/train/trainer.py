"""The trainer role: fp32 master weights and the optimizer, on one rank or on N (torchrun).

    rank 0 (the run: tasks, engine, orchestrator, evals, logs)        ranks 1..N-1 (`follow`)
    trainer.rl_step(groups) ──────── ("rl_step", groups) ────────────> trainer._rl_step(groups)
         each rank trains its share of the micro-batches (carl.train.ranks), FSDP2 collectives
    trainer.full_state() ─────────── ("full_state",) ────────────────> gathers its shards to rank 0
    trainer.save(...) / sft_epoch / stop ... the same way

Every collective is one method: rank 0 first broadcasts its name and arguments, then every rank
runs it, so all ranks call the same collectives in the same order. On one rank nothing is sent.

Checkpoints have one format whatever the number of ranks (a Hugging Face model folder and the
optimizer's full state keyed by parameter name, torch.distributed.checkpoint's state-dict API),
so a run resumes on another number of ranks. `checkpoint_optimizer = "sharded"` keeps the
optimizer's state (2 fp32 tensors per parameter with AdamW: the largest part) sharded: every rank
writes its shards with torch.distributed.checkpoint, which any number of ranks reads back. The
model itself is gathered to rank 0 either way (rank 0 publishes it to the engines every step).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from carl.engine import lora
from carl.engine.hf import DTYPES, load_model
from carl.errors import UserError
from carl.systems.subscriber import published_state
from carl.train.checkpoint import load_trainer_state, save_checkpoint, sharded_optimizer_dir
from carl.train.config import TrainConfig
from carl.train.ranks import Ranks, make_optimizer, shard_model
from carl.train.state import RunState
from carl.train.step import rl_step
from carl.train.warm_start import TrunkCache, sft_epoch, sft_sequences


class Trainer:
    def __init__(self, cfg: TrainConfig, model_path: Path, ranks: Ranks | None = None):
        from carl.train.loop import set_trainable

        self.cfg = cfg
        self.ranks = ranks or Ranks.current()
        device = cfg.model.device
        if self.ranks.world > 1 and device.startswith("cuda"):
            device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"  # torchrun: one GPU per rank
        self.tokenizer, model = load_model(model_path, torch.float32, device)  # fp32 master weights
        self.lora = cfg.model.lora()
        if self.lora is not None:  # only the adapters train (carl.engine.lora)
            if self.ranks.world > 1:
                raise UserError(f"model.lora_rank={cfg.model.lora_rank}: LoRA trains on one trainer rank; "
                                f"this run has {self.ranks.world} (run without torchrun, or set model.lora_rank=0)")
            model = lora.attach(model, self.lora)
        else:
            set_trainable(model, cfg.model.trainable_layers)
        self.model = shard_model(model, self.ranks)
        self.optimizer = make_optimizer(cfg.rl.optimizer, self.model, cfg.rl.lr, cfg.rl.weight_decay,
                                        sharded=self.ranks.world > 1)
        self.compute_dtype = DTYPES[cfg.model.dtype]
        # MoE: train on the experts the engine routed to
        self.replay = router_replay_for(self.model) if cfg.rl.router_replay else None
        self.reference: Any = None  # the KL anchor (load_reference)
        self._on_batch = None  # rank 0's progress callback of sft_epoch; not sent to other ranks
        self._trunk: TrunkCache | None = None  # the warm start's frozen-trunk states (carl.train.warm_start)

    # ------------------------------------------------------------------ collectives (rank 0 drives)

    def rl_step(self, groups: list, token_normalizer: float, valid_tools: tuple[str, ...],
                pad_id: int = 0) -> dict[str, float]:
        return self._run("rl_step", groups, token_normalizer, valid_tools, pad_id)

    def load_reference(self, path: Path) -> str:
        """The KL reference (the weights RL started from, in the model folder `path`), on every rank;
        rl_step uses it from now on. Returns what it is, in words."""
        return self._run("load_reference", path)

    def sft_epoch(self, data: list, pad_id: int, epoch: int, on_batch=None) -> list[float]:
        """One warm-start epoch; `on_batch(loss)` after each batch, on this rank only (progress)."""
        self._on_batch = on_batch
        return self._run("sft_epoch", data, pad_id, epoch)

    def keeps_trunk(self) -> bool:
        """Whether the warm start runs the top blocks alone on kept trunk states (carl.train.warm_start
        .TrunkCache): a frozen trunk, no LoRA, one rank."""
        return self.cfg.model.trainable_layers > 0 and self.lora is None and self.ranks.world == 1

    def keep_trunk(self, data: list, pad_id: int, on_rows=None) -> int:
        """Before the first warm-start epoch: the frozen trunk's states of every sequence of `data`
        (`TrunkCache.fill`), `on_rows(n)` as they are kept; the sequences kept (0 where none are)."""
        if self._trunk is not None or not self.keeps_trunk():
            return 0
        self._trunk = TrunkCache(self.model, self.cfg.model.trainable_layers)
        return self._trunk.fill(sft_sequences(data), pad_id, self.cfg.rl.micro_batch_tokens, self.compute_dtype,
                                on_rows=on_rows)

    def full_state(self, checkpoint_names: bool = False) -> dict[str, torch.Tensor]:
        """Every published parameter, unsharded, on rank 0 ({} on the others). `checkpoint_names`: as
        the model's checkpoint files name them (transformers fuses some tensors when it loads, e.g.
        a MoE layer's experts into one `experts.gate_up_proj`; vLLM's loader takes the files' names)."""
        return self._run("full_state", checkpoint_names)

    def save(self, run_dir: Path, step: int, state: RunState) -> None:
        self._run("save", run_dir, step, state)

    def stop(self) -> None:
        """Release the followers (they return from `follow`)."""
        if self.ranks.world > 1 and self.ranks.rank == 0:
            self.ranks.broadcast(("stop", ()))

    def set_lr(self, lr: float) -> None:
        self._run("set_lr", lr)

    def clear_optimizer_state(self) -> None:
        self._run("clear_optimizer_state")

    def load(self, ckpt: Path) -> RunState:
        """Model weights, optimizer and RNG from `ckpt`; every rank reads it (a shared file system)."""
        return self._run("load", ckpt)

    def _run(self, name: str, *args):
        if self.ranks.world > 1 and self.ranks.rank == 0:
            self.ranks.broadcast((name, args))
        return getattr(self, "_" + name)(*args)

    # ------------------------------------------------------------------ what each rank does

    def _rl_step(self, groups, token_normalizer, valid_tools, pad_id):
        c = self.cfg
        return rl_step(self.model, self.optimizer, None, groups, c.rl, self.tokenizer, pad_id, token_normalizer,
                       valid_tools=valid_tools, temperature=c.rollout.temperature, compute_dtype=self.compute_dtype,
                       reference=self.reference, ranks=self.ranks, replay=self.replay)

    def _load_reference(self, path):
        from carl.train.reference import FullReference, load_reference

        if self.ranks.world == 1:
            self.reference = load_reference(path, self.model, self.cfg.model.trainable_layers, self.cfg.model.device)
        else:  # sharded like the policy; every rank runs its forward in each micro-batch (carl.train.step)
            reference = load_model(path, torch.float32, next(self.model.parameters()).device)[1].requires_grad_(False)
            self.reference = FullReference(shard_model(reference, self.ranks))
        return self.reference.describe() + (f", sharded over {self.ranks.world} ranks" if self.ranks.world > 1 else "")

    def _sft_epoch(self, data, pad_id, epoch):
        ws = self.cfg.warm_start
        rng = random.Random(self.cfg.seed * 1009 + epoch)
        self.keep_trunk(data, pad_id)  # every epoch runs only the trained blocks (kept already: nothing to do)
        try:
            return sft_epoch(self.model, self.optimizer, data, pad_id, ws.batch_size, self.cfg.rl.micro_batch_tokens,
                             self.cfg.rl.grad_clip, rng, on_batch=self._on_batch, compute_dtype=self.compute_dtype,
                             ranks=self.ranks, trunk=self._trunk, share_prefix=self.cfg.rl.share_prefix)
        finally:
            if epoch >= ws.epochs - 1:
                self._trunk = None  # the last epoch: free the states

    def _full_state(self, checkpoint_names=False):
        if self.lora is not None:  # only the adapters travel
            return lora.adapter_state(self.model)
        if self.ranks.world == 1:
            state = published_state(self.model)
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            torch.distributed.barrier()  # gloo: the next collective after a cpu_offload gather aborts without it
            names = set(dict(self.model.named_parameters()))  # tied weights once, as published_state
            state = {k: v for k, v in full.items() if k in names} if self.ranks.rank == 0 else {}
        return checkpoint_state(self.model, state) if checkpoint_names and state else state

    def _save(self, run_dir, step, state):
        if self.cfg.checkpoint_optimizer == "sharded":
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            shards = Path(self.ranks.broadcast(str(sharded_optimizer_dir(run_dir, step)) if self.ranks.rank == 0 else None))
            dcp.save({"optim": get_optimizer_state_dict(self.model, self.optimizer.optimizers)}, checkpoint_id=str(shards))
            model_state, optim_state = gathered_state(self.model, self.optimizer, self.ranks, with_optimizer=False)
        else:
            shards, (model_state, optim_state) = None, gathered_state(self.model, self.optimizer, self.ranks)
        if self.ranks.rank == 0:
            save_checkpoint(run_dir, step, self.model, self.tokenizer, SavedState(optim_state), None, state.to_dict(),
                            model_state=model_state, sharded_optimizer=shards)

    def _load(self, ckpt):
        if self.lora is not None:
            if not lora.is_adapter(Path(ckpt) / "model"):
                raise UserError(f"{ckpt}: not a LoRA checkpoint (model/ has no adapter); this run has "
                                f"model.lora_rank={self.cfg.model.lora_rank}")
            lora.load_adapter_into(self.model, Path(ckpt) / "model")
            weights = self.model.state_dict()
        else:
            weights = load_model(Path(ckpt) / "model", torch.float32, "cpu")[1].state_dict()
        optim = SavedState(None)
        _, trainer_state = load_trainer_state(ckpt, optim, None)
        set_state(self.model, self.optimizer, self.ranks, weights, optim.state)
        if (Path(ckpt) / "optimizer").is_dir():  # sharded: any number of ranks reads it (DCP reshards by name)
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

            optim_sd = get_optimizer_state_dict(self.model, self.optimizer.optimizers)  # this run's layout
            dcp.load({"optim": optim_sd}, checkpoint_id=str(Path(ckpt) / "optimizer"))
            set_optimizer_state_dict(self.model, self.optimizer.optimizers, optim_sd)
        return RunState.from_dict(trainer_state, where=str(ckpt))

    def _set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _clear_optimizer_state(self):
        self.optimizer.clear_state()



def gathered_state(model: torch.nn.Module, optimizer: Any, ranks: Ranks,
                   with_optimizer: bool = True) -> tuple[dict | None, dict | None]:
    """What a checkpoint saves of a model on 1 or N ranks (`optimizer`: carl.train.ranks.Optimizers):
    (full model state, or None for save_pretrained's own on one rank; full optimizer state keyed by
    parameter name, or None when not asked for). Every rank calls it; the states land on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    full = ranks.world > 1
    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    if with_optimizer:
        model_sd, optim_sd = get_state_dict(model, optimizer.optimizers, options=options)
    else:
        model_sd, optim_sd = (get_model_state_dict(model, options=options) if full else None), None
    if full:
        torch.distributed.barrier()
    return (model_sd if full else None), optim_sd


def set_state(model: torch.nn.Module, optimizer: Any, ranks: Ranks, weights: dict, optim_sd: dict | None) -> None:
    """Load full `weights` and a full optimizer state (as `gathered_state` gives them) into a model
    sharded over any number of ranks; every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    if optim_sd is not None and not _keyed_by_name(optim_sd):  # a checkpoint from before this module
        if ranks.world > 1:
            raise RuntimeError("this checkpoint's optimizer state predates multi-rank training; resume it on one rank")
        model.load_state_dict(weights)
        optimizer.load_state_dict(optim_sd)
        return
    options = StateDictOptions(full_state_dict=True, strict=False)
    if optim_sd:
        set_state_dict(model, optimizer.optimizers, model_state_dict=weights, optim_state_dict=optim_sd,
                       options=options)
    else:  # the optimizer state comes from shards (Trainer._load), or there is none
        set_model_state_dict(model, weights, options=options)


def _keyed_by_name(optim_sd: dict) -> bool:
    """An optimizer state from torch.distributed.checkpoint's API (keyed by parameter name), not a
    plain `optimizer.state_dict()` (keyed by position)."""
    groups = optim_sd.get("param_groups") or []
    return bool(groups) and all(isinstance(p, str) for g in groups for p in g.get("params", []))


def checkpoint_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the model's parameters by name) named and shaped as in its checkpoint files: what
    `save_pretrained` writes (transformers' reverse weight conversion; the identity for most dense
    models)."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, dict(state))


def router_replay_for(model: torch.nn.Module):
    """A RouterReplay of a MoE model (None for dense models)."""
    from carl.systems.router_replay import RouterReplay

    try:
        return RouterReplay(model)
    except ValueError:
        return None


class SavedState:
    """What checkpoint.py expects of an optimizer (state_dict / load_state_dict), holding a dict."""

    def __init__(self, state: dict | None):
        self.state = state

    def state_dict(self) -> dict | None:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def follow(trainer: Trainer) -> None:
    """Ranks 1..N-1: run what rank 0 runs until it stops."""
    while True:
        name, args = trainer.ranks.broadcast(None)
        if name == "stop":
            return
        getattr(trainer, "_" + name)(*args)
