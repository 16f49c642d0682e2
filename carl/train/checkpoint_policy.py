"""A checkpoint carl trained, as a production policy that behaves as it did in training.

    load_checkpoint_policy("runs/default")      -> the run's latest checkpoint
    load_checkpoint_policy("runs/default:8")    -> its step 8 (as `carl train --branch-from RUN:STEP`)
    load_checkpoint_policy("runs/default/checkpoints/step_000008")   a checkpoint folder (or its model/)
    load_checkpoint_policy("/models/SmolLM2-135M-Instruct")          a plain Hugging Face folder

returns `(engine, limits, info)`: carl's own token-level engine (`carl.engine.hf.HFEngine`) over
the checkpoint's weights, the episode limits the run evaluated with, and what was read (`info`:
model folder, run directory, step, sampling settings, the run's tools and sandbox config).

What a run's held-out eval measured is what production gets: the same engine and chat rendering
(`carl.harness.chat_tokens.TokenContext`: token ids, never re-tokenized text), the eval's
sampling (temperature `eval.temperature`, top-p `rollout.top_p`, the run's seed and sampler
dtype/device, read from `<run_dir>/config.toml`), its episode limits (`carl.train.loop.eval_limits`,
the repetition guard included) and tools (`tools`: the system prompt lists them). The engine's
`policy_version` is the checkpoint's step, as in the run's own eval. An episode run with
`engine.episode("<task id>/<j>")` draws the random numbers of sample j of that task in
`carl eval`/`carl train`'s eval under the same seed (`carl.engine.streams`), so on the same task,
repository and tools it writes the same episode (tests/test_checkpoint_policy.py checks this
through `carl agent run --checkpoint`).

A plain model folder has no run: the harness's `EpisodeLimits()`, all tools, and greedy sampling
(as `carl agent run --policy openai:...`), unless the arguments say otherwise.

Not covered: vLLM (the engine is in-process; a run trained with `engine.kind = "vllm"` samples
from the same weights here, but through transformers' kernels, not vLLM's), and a LoRA run's
adapters: its checkpoint loads merged into the base (`carl.engine.hf.load_model`), where training
sampled with unmerged adapters (equal up to rounding).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from carl.engine.hf import HFEngine, HFEngineConfig
from carl.errors import UserError
from carl.harness.agent import EpisodeLimits

STEP_PREFIX = "step_"


def load_checkpoint_policy(spec: str, *, temperature: float | None = None, top_p: float | None = None,
                           seed: int | None = None, dtype: str | None = None, device: str | None = None,
                           weights_dir: str | Path | None = None) -> tuple[HFEngine, EpisodeLimits, dict[str, Any]]:
    """(engine, limits, info) for `spec` (see module docstring); the sampling and placement arguments
    given override the run's settings (None: the run's). `weights_dir`: a weight store the engine
    can load later versions from (`HFEngine.update_weights`, a service's hot swap). UserError
    naming `spec` when it holds no model."""
    model_dir, run_dir, step = resolve_checkpoint(spec)
    if run_dir is None:
        limits, tools, sandbox = EpisodeLimits(), None, None
        config = HFEngineConfig(path=str(model_dir), temperature=0.0 if temperature is None else temperature,
                                seed=0 if seed is None else seed)
    else:
        from carl.config import load_config
        from carl.train.config import TrainConfig
        from carl.train.loop import eval_limits, sampler_config

        cfg = load_config(TrainConfig, run_dir / "config.toml", [])
        limits, tools, sandbox = eval_limits(cfg), tuple(cfg.tools), cfg.sandbox
        # the run's eval sampler (`run_eval` samples at eval.temperature with the rollout top-p); a
        # LoRA run's checkpoint is loaded merged, so no adapters go on top
        config = dataclasses.replace(sampler_config(cfg, model_dir, cfg.eval.temperature if temperature is None
                                                    else temperature, seed=seed), lora=None)
    overrides = {k: v for k, v in (("top_p", top_p), ("dtype", dtype), ("device", device)) if v is not None}
    config = dataclasses.replace(config, **overrides)
    engine = HFEngine(config, weights_dir=weights_dir)
    engine.policy_version = step or 0  # the weights version the run's eval sampled this checkpoint as
    info = {"model": str(model_dir), "run_dir": str(run_dir) if run_dir else None, "step": step,
            "temperature": config.temperature, "top_p": config.top_p, "seed": config.seed,
            "dtype": config.dtype, "device": config.device, "tools": tools, "sandbox": sandbox}
    return engine, limits, info


def resolve_checkpoint(spec: str) -> tuple[Path, Path | None, int | None]:
    """(model folder, run directory or None, checkpoint step or None) of a checkpoint spec."""
    from carl.train.checkpoint import latest_checkpoint

    source, _, step_text = spec.partition(":")  # as `carl train --branch-from RUN_DIR[:STEP]`
    path = Path(source)
    if step_text:
        if not step_text.isdigit():
            raise UserError(f"--checkpoint: got {spec!r}, expected PATH or RUN_DIR:STEP (a number)")
        if not is_run_dir(path):
            raise UserError(f"--checkpoint: {source!r} is not a carl run directory (no config.toml and "
                            "checkpoints/), so it has no step to pick; expected RUN_DIR:STEP")
        ckpt = path / "checkpoints" / f"{STEP_PREFIX}{int(step_text):06d}"
        if not (ckpt / "trainer.pt").is_file():
            raise UserError(f"--checkpoint: {source} has no checkpoint {ckpt.name}; it has {checkpoint_names(path)}")
        return ckpt / "model", path, int(step_text)
    if is_run_dir(path):
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise UserError(f"--checkpoint: the run {source!r} has no complete checkpoint yet "
                            f"(checkpoints/latest is missing or points at none; it has {checkpoint_names(path)})")
        return ckpt / "model", path, _step(ckpt)
    if has_model(path) and path.name == "model" and (path.parent / "trainer.pt").is_file():
        path = path.parent  # a checkpoint's model/ folder: the checkpoint it belongs to
    if (path / "trainer.pt").is_file() and has_model(path / "model"):  # a checkpoint folder
        run = path.parent.parent
        return path / "model", run if is_run_dir(run) else None, _step(path)
    if has_model(path):
        return path, None, None
    raise UserError(f"--checkpoint: {spec!r} holds no model; expected a carl run directory (config.toml and "
                    "checkpoints/), RUN_DIR:STEP, a checkpoint folder (model/ and trainer.pt), or a Hugging "
                    "Face model folder (config.json, or a LoRA adapter's adapter_config.json)")


def is_run_dir(path: Path) -> bool:
    return (path / "config.toml").is_file() and (path / "checkpoints").is_dir()


def has_model(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob(f"{STEP_PREFIX}*") if ".tmp-" not in p.name)


def _step(ckpt: Path) -> int | None:
    """The step a checkpoint folder's name says (step_000012 -> 12); None for another name."""
    digits = ckpt.name.removeprefix(STEP_PREFIX)
    return int(digits) if ckpt.name.startswith(STEP_PREFIX) and digits.isdigit() else None
