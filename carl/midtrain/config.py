"""The config of `carl midtrain`: one frozen dataclass per component, nested in MidtrainConfig.

Runs are TOML files (configs/midtrain*.toml) with dotted command-line overrides:

    carl midtrain configs/midtrain.toml steps=40 data.general.share=0.2

The model section is `carl train`'s own (carl.train.config.ModelConfig): the same path, dtype,
device and trainable_layers mean the same thing in both commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carl.train.config import ModelConfig

OPTIMIZERS = ("adamw", "muon")  # carl.train.ranks.make_optimizer
TRACKERS = ("tensorboard", "wandb", "trackio")  # carl.train.metrics


@dataclass(frozen=True)
class GeneralDataConfig:
    """General data mixed into training against forgetting, and held out to measure it."""

    share: float = 0.0
    """Fraction of the training tokens that are general data (0 = none; 0.2 = one token in five).
    General files are taken in a fixed seeded order until their tokens reach share / (1 - share)
    times the team's training tokens (to within one file)."""
    path: str = "stdlib"
    """Where general data comes from: "stdlib" = the .py files of the running interpreter's standard
    library (sysconfig's "stdlib" folder; site-packages excluded): offline, and Python code of the
    kind code models are pretrained on, but only Python and no prose. Or a local directory."""
    heldout_tokens: int = 8192
    """General held-out tokens evaluated (whole files chosen as for data.max_heldout_tokens, none of
    them trained on): the forgetting measure. Evaluated whatever the share, so a run without general data shows its
    forgetting too. 0 = none."""

    def __post_init__(self) -> None:
        if not 0 <= self.share < 1:
            raise ValueError(f"data.general.share: got {self.share}, expected a fraction in [0, 1)")
        if not self.path:
            raise ValueError("data.general.path: got '', expected 'stdlib' or a directory")
        if self.heldout_tokens < 0:
            raise ValueError(f"data.general.heldout_tokens: got {self.heldout_tokens}, expected >= 0 (0 = none)")


@dataclass(frozen=True)
class DataConfig:
    sources: tuple[str, ...] = ()
    """Required: the team's repositories to train on, as `carl tasks build` takes them
    (carl.tasks.sources): a local directory, `DIR@REV` (a git revision) or
    `pypi:NAME==VERSION[#sha256=HEX]` (an sdist). Empty is an error naming this field."""
    heldout_sources: tuple[str, ...] = ()
    """Sources never trained on, all of whose files are held out: what training does to code the
    model did not see (a package of another team, say)."""
    extensions: tuple[str, ...] = (".py", ".pyi", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml")
    """How kept file names end: source, tests, docs, configs. Other files are dropped ("extension")."""
    max_file_bytes: int = 200_000
    """Larger files are dropped ("huge"): data dumps, generated tables, bundled minified code."""
    heldout_fraction: float = 0.1
    """Share of each trained source's files held out from training, chosen by a hash of (seed,
    path): the same files on every run with this seed; at least one of a source with two or more."""
    max_heldout_tokens: int = 16384
    """Most held-out tokens evaluated per source: whole files in hash order, skipping any that would
    pass the budget (the smallest file when none fits); bounds the eval's time. 0 = all held-out files."""
    seq_len: int = 512
    """Tokens per packed row: the context the model trains and is evaluated at."""
    general: GeneralDataConfig = field(default_factory=GeneralDataConfig)

    def __post_init__(self) -> None:
        for name in ("sources", "heldout_sources", "extensions"):
            if any(not s for s in getattr(self, name)):
                raise ValueError(f"data.{name}: got an empty string in {list(getattr(self, name))}")
        if self.max_file_bytes < 1:
            raise ValueError(f"data.max_file_bytes: got {self.max_file_bytes}, expected >= 1")
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"data.heldout_fraction: got {self.heldout_fraction}, expected a fraction in [0, 1)")
        if self.max_heldout_tokens < 0:
            raise ValueError(f"data.max_heldout_tokens: got {self.max_heldout_tokens}, expected >= 0 (0 = all)")
        if self.seq_len < 8:
            raise ValueError(f"data.seq_len: got {self.seq_len}, expected >= 8 tokens")


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    """"adamw", or "muon" (Muon on hidden matrices, AdamW on the rest; carl.train.ranks.make_optimizer)."""
    lr: float = 1e-4
    """Peak learning rate, reached after `warmup_steps`, then cosine decay to lr x min_lr_ratio at the last step."""
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Largest global gradient norm; larger gradients are scaled down to it."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optim.name: got {self.name!r}, expected one of {list(OPTIMIZERS)}")
        if self.lr <= 0:
            raise ValueError(f"optim.lr: got {self.lr}, expected > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps: got {self.warmup_steps}, expected >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio: got {self.min_lr_ratio}, expected a fraction in [0, 1]")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay: got {self.weight_decay}, expected >= 0")
        if self.grad_clip <= 0:
            raise ValueError(f"optim.grad_clip: got {self.grad_clip}, expected > 0")


@dataclass(frozen=True)
class MidtrainConfig:
    run_dir: str = "runs/midtrain"
    seed: int = 0
    """Seeds the held-out split, the general-data sample, the document order and the row order."""
    steps: int = 100
    """Optimizer steps; rows are drawn in a fresh seeded order each epoch over the training rows."""
    batch_size: int = 8
    """Rows per optimizer step (batch_size x data.seq_len tokens)."""
    micro_batch_size: int = 1
    """Rows per forward and backward pass (gradients accumulate over a step's micro-batches); bounds memory.
    On N ranks each rank runs every N-th micro-batch."""
    eval_every: int = 0
    """Evaluate held-out loss every this many steps; 0 = only before the first step and after the last."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many steps (and after the last)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept (older ones are deleted once a newer one is written)."""
    tracking: tuple[str, ...] = ()
    """Trackers that get every metrics row besides metrics.jsonl: "tensorboard", "wandb", "trackio"."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to continue training (`carl train`'s model section; LoRA is not supported here)."""
    data: DataConfig = field(default_factory=DataConfig)
    """What to train on; data.sources is required."""
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if not self.data.sources:
            raise ValueError("data.sources: got [], expected at least one directory, DIR@REV or "
                             "pypi:NAME==VERSION[#sha256=HEX]")
        for name in ("steps", "batch_size", "micro_batch_size", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected >= 1")
        if self.eval_every < 0:
            raise ValueError(f"eval_every: got {self.eval_every}, expected >= 0 (0 = before and after training)")
        if self.model.lora_rank != 0:
            raise ValueError(f"model.lora_rank: got {self.model.lora_rank}, expected 0 (midtrain trains the "
                             "weights themselves; set model.trainable_layers to train fewer)")
        bad = [t for t in self.tracking if t not in TRACKERS]
        if bad:
            raise ValueError(f"tracking: got {bad[0]!r}, expected some of {list(TRACKERS)}")
