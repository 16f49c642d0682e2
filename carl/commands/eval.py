"""`carl eval --checkpoint DIR --tasks FILE`: pass@1, pass@k, tokens, tool calls, wall time per task.
`carl compare A.json B.json`: two such reports of the same tasks, sample by sample (carl.eval.paired).

The agent's flags and their resolution (`add_agent_args`, `agent_setup`, `load_policy`) are shared
with `carl bench run`, which scores the same way on a suite (carl.commands.bench)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carl.sandbox.base import BACKENDS, SandboxConfig

if TYPE_CHECKING:
    from carl.harness.agent import EpisodeLimits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint or endpoint on tasks (pass@1, pass@k, ...)")
    p.add_argument("--tasks", required=True, help="tasks JSONL (carl tasks build output)")
    add_agent_args(p)
    p.add_argument("--out", default="eval_report.json", help="where to write the JSON report")
    p.set_defaults(func=run)
    c = sub.add_parser("compare", help="difference of two eval reports, sample by sample, with its standard error")
    c.add_argument("a", help="the baseline's report (carl eval --out), e.g. the warm start's")
    c.add_argument("b", help="the report to compare with it, scored with the same --seed for a paired comparison")
    c.set_defaults(func=compare)


def add_agent_args(p: argparse.ArgumentParser) -> None:
    """The agent being scored and its episode settings (`carl eval`, `carl bench run`)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint dir (runs/X/checkpoints/step_N) or a HF model folder")
    src.add_argument("--policy", help="openai:URL#MODEL for an OpenAI-compatible endpoint")
    p.add_argument("--run-config", help="a training run's config.toml: score as that run's own eval does (its "
                                        "episode limits, tools, sandbox, eval temperature and samples, sampler dtype, "
                                        "device and concurrency); the flags below still win where given")
    p.add_argument("--samples", type=int, default=None, help="samples per task (n); pass@k uses k = n (default 4)")
    p.add_argument("--temperature", type=float, default=None, help="(default 0.7)")
    p.add_argument("--sandbox", default=None, choices=list(BACKENDS), help="(default bwrap)")
    p.add_argument("--max-turns", type=int, default=None, help="(default 12)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="(default 512)")
    p.add_argument("--wall-time-s", type=float, default=None,
                   help="an episode's time limit (default 3600, or the run's). An episode cut by it fails, and "
                        "how soon it is cut depends on the machine's load: give evals that are compared a limit "
                        "they never reach")
    p.add_argument("--tools", default="", help="comma-separated tool names (default: all)")
    p.add_argument("--device", default=None,
                   help="where a checkpoint samples, e.g. cuda:0 (default: the run config's, else cpu)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the sampler: each episode draws from its own stream (task, sample, turn), so "
                        "the same seed repeats an eval, and two checkpoints scored with one seed share their "
                        "random numbers")


def compare(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from carl.errors import UserError
    from carl.eval.paired import in_words, over_tasks, paired_difference

    reports = []
    for name, path in (("a", args.a), ("b", args.b)):
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{name}: {path!r} is not a readable eval report ({type(e).__name__}: {e})") from e
        if not isinstance(reports[-1], dict) or not isinstance(reports[-1].get("tasks"), list):
            raise UserError(f"{name}: {path!r} has no 'tasks' list (expected the JSON of `carl eval --out`)")
    try:
        d = paired_difference(*reports)
    except ValueError as e:
        raise UserError(str(e)) from e
    from carl.eval.report import add_columns

    changed = Table(title="tasks whose pass rate changed (passes / paired samples)")
    add_columns(changed, ("task", "a", "b"), "task")
    for task_id, passes_a, passes_b, n in d.per_task:
        if passes_a != passes_b:
            changed.add_row(task_id, f"{passes_a}/{n}", f"{passes_b}/{n}")
    console = Console()
    console.print(changed)
    print(f"pass@1 {d.pass_a:.3f} -> {d.pass_b:.3f}: {d.diff:+.3f} ± {d.se_paired:.3f} (paired standard "
          f"error; {d.se_independent:.3f} had the evals drawn independent random numbers) over {d.tasks} "
          f"tasks and {d.pairs} paired samples; {d.tasks_better} tasks better, {d.tasks_worse} worse; "
          f"{d.identical} episodes identical, {d.agree} with the same outcome")
    t = over_tasks(d)
    print(f"over tasks (which tasks were drawn counts too, as for a claim about held-out tasks of their kind): "
          f"{d.diff:+.3f} ± {t.se_paired:.3f}; {in_words(d.diff, t.se_paired)}")
    return 0


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.errors import UserError
    from carl.eval.bench import evaluate
    from carl.eval.report import render_table
    from carl.io import atomic_write_json
    from carl.tasks import load_tasks

    setup = agent_setup(args)
    if not Path(args.tasks).is_file():
        raise UserError(f"--tasks: {args.tasks!r} does not exist")
    tasks = load_tasks(args.tasks, require_repos=True)
    policy = load_policy(args, setup.run)
    console = Console()
    report, _ = evaluate(setup.name, policy, tasks, setup.samples, setup.limits, setup.tools, setup.sandbox,
                         max_workers=setup.concurrency)
    console.print(render_table(report))
    atomic_write_json(args.out, report.to_dict())
    console.print(f"report written to {args.out}")
    if hasattr(policy, "close"):
        policy.close()
    if not any(t.n for t in report.tasks):
        console.print("[red]no sample was scored: every episode failed in the infrastructure (see above)[/]")
        return 1
    return 0


@dataclass(frozen=True)
class AgentSetup:
    """What `add_agent_args`' flags resolve to, before any model is loaded."""

    name: str
    """The checkpoint's folder name, or the endpoint spec's last part."""
    samples: int
    limits: EpisodeLimits
    tools: dict[str, Any]
    sandbox: SandboxConfig
    concurrency: int
    """Episodes at once: the run's rollout concurrency with --run-config, else 16."""
    run: Any
    """The TrainConfig of --run-config, or None."""

    def settings(self, args: argparse.Namespace) -> dict[str, Any]:
        """What decides the samples (a resumed bench run must not mix two of these): the agent,
        its sampling and limits, the tools and the sandbox backend."""
        return {"agent": args.checkpoint and str(Path(args.checkpoint).resolve()) or args.policy,
                "run_config": args.run_config and str(Path(args.run_config).resolve()),
                "temperature": args.temperature, "seed": args.seed, "samples_per_task": self.samples,
                "limits": dataclasses.asdict(self.limits), "tools": sorted(self.tools),
                "sandbox": self.sandbox.backend, **({"device": args.device} if args.device else {})}


def agent_setup(args: argparse.Namespace) -> AgentSetup:
    """Resolve and check `add_agent_args`' flags (the run config's eval settings fill those not
    given); UserError naming the flag for a bad one. Loads no model (`load_policy` does)."""
    from carl.errors import UserError
    from carl.harness.agent import EpisodeLimits
    from carl.harness.tools import default_tools

    run = _run_config(args.run_config)
    if run is not None:  # the run's own eval settings fill every flag not given
        args.samples = args.samples if args.samples is not None else run.eval.samples_per_task
        args.temperature = args.temperature if args.temperature is not None else run.eval.temperature
        args.sandbox = args.sandbox or run.sandbox.backend
        args.tools = args.tools or ",".join(run.tools)
    args.samples = 4 if args.samples is None else args.samples
    args.temperature = 0.7 if args.temperature is None else args.temperature
    args.sandbox = args.sandbox or "bwrap"
    if args.samples < 1:
        raise UserError(f"--samples: got {args.samples}, expected >= 1")
    if args.wall_time_s is not None and not args.wall_time_s > 0:
        raise UserError(f"--wall-time-s: got {args.wall_time_s:g}, expected a positive number of seconds")
    tools = default_tools()
    if args.tools:
        unknown = sorted(set(args.tools.split(",")) - set(tools))
        if unknown:
            raise UserError(f"--tools: unknown {unknown}; expected names from {sorted(tools)}")
        tools = {k: v for k, v in tools.items() if k in args.tools.split(",")}
    if run is not None:
        from carl.train.loop import eval_limits

        limits = eval_limits(run)
    else:
        limits = EpisodeLimits(max_turns=12, max_new_tokens=512)
    limits = replace(limits, **{k: v for k, v in (("max_turns", args.max_turns),
                                                  ("max_new_tokens", args.max_new_tokens),
                                                  ("wall_time_s", args.wall_time_s)) if v is not None})
    return AgentSetup(name=Path(args.checkpoint or args.policy).name, samples=args.samples, limits=limits,
                      tools=tools, sandbox=SandboxConfig(backend=args.sandbox),
                      concurrency=run.rollout.concurrency if run is not None else 16, run=run)


def _run_config(path: str | None):
    """The TrainConfig of a run's config.toml, or None without --run-config."""
    if path is None:
        return None
    from carl.config import load_config
    from carl.errors import UserError
    from carl.train.config import TrainConfig

    if not Path(path).is_file():
        raise UserError(f"--run-config: {path!r} does not exist (a run directory's config.toml)")
    return load_config(TrainConfig, path, [])


def load_policy(args: argparse.Namespace, run: Any = None) -> Any:
    """The policy of --checkpoint (an HFEngine; with --run-config sampling as that run's eval) or --policy."""
    return policy_recipe(args, run).build()


@dataclass(frozen=True)
class PolicyRecipe:
    """How to build the agent's policy, picklable: built once in each process that samples (this
    one, or each Ray actor of `carl bench run --ray`)."""

    policy: str = ""
    """--policy's spec (carl.commands.agent.parse_policy), or "" for a checkpoint."""
    temperature: float = 0.0
    seed: int | None = None
    engine: dict[str, Any] | None = None
    """A checkpoint's carl.engine.hf.HFEngineConfig fields, made into the config where it is built, so
    that dtype "auto" is resolved on the device that samples (a Ray actor's GPU, not the head's CPU)."""

    def build(self) -> Any:
        if self.policy:
            from carl.commands.agent import parse_policy

            return parse_policy(self.policy, temperature=self.temperature, seed=self.seed)
        from transformers.utils import logging as hf_logging

        from carl.engine.hf import HFEngine, HFEngineConfig

        hf_logging.disable_progress_bar()  # a bar per weights load fills logs; the command's own progress says more
        return HFEngine(HFEngineConfig(**self.engine))


def policy_recipe(args: argparse.Namespace, run: Any = None) -> PolicyRecipe:
    """--checkpoint's or --policy's recipe, checked (UserError naming the flag) but not built."""
    from carl.errors import UserError

    if args.policy:
        from carl.commands.agent import parse_policy

        parse_policy(args.policy, temperature=args.temperature, seed=args.seed)  # a bad spec fails here, once
        return PolicyRecipe(policy=args.policy, temperature=args.temperature, seed=args.seed)
    path = Path(args.checkpoint)
    if (path / "model" / "config.json").is_file() or (path / "model" / "adapter_config.json").is_file():
        path = path / "model"
    if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        raise UserError(f"--checkpoint: {args.checkpoint!r} holds no model (expected config.json, or a LoRA "
                        "adapter's adapter_config.json, in it or in model/)")
    if run is None:
        return PolicyRecipe(engine={"path": str(path.resolve()), "temperature": args.temperature, "seed": args.seed,
                                    "device": args.device or "cpu"})
    from carl.train.loop import sampler_config

    # a LoRA run's checkpoint loads merged (carl.engine.hf.load_model): no adapters on top
    config = sampler_config(run, path.resolve(), args.temperature, seed=args.seed)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)} | {"lora": None}
    return PolicyRecipe(engine=fields | ({"device": args.device} if args.device else {}))
