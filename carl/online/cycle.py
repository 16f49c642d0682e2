"""`carl online`: the scheduled cycle that turns production feedback into a better deployed model.

    every cadence_s:
      1. rollback check   the deployed version's live kept-edit rate against the previous one's;
                          worse by more than rollback.z standard errors -> redeploy the previous
      2. data             requests the deployed version served since the last cycle, rewarded from
                          their signals (carl.online.signals), advantages from a baseline
                          (carl.online.batch), skipped while fewer than min_requests
      3. train            from the deployed weights, rl.steps steps of carl's RL step (Dr. GRPO on
                          the token-exact trajectories + self-distillation from the follow-ups)
      4. gate             candidate vs deployed, one sampler seed (paired):
                            held-out bench: pass@1 difference and its paired standard error
                            replay: recent production requests run again on both; the share the
                                    production monitor flags (no edit, no-op edit, broken calls)
                          pass iff neither regresses by more than gate.z standard errors
      5. deploy           publish the weights (lossless delta) to the service's weights dir and
                          `POST /v1/admin/deploy`: a hot swap between generations, no request dropped
      6. report           <run_dir>/cycles/cycle_NNNN.json (data, reward stats, gate, decision) and
                          plots/kept_rate.png (kept-edit rate per deployed version)

The run's state (`<run_dir>/state.json`, written atomically after every cycle) says which version
is deployed, the one before it, the last store id used and the baseline; a killed `carl online`
continues from it. Versions are numbered by the cycle that made them (0 = the base model), and a
rollback deploys the previous weights again under a new number.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carl.io import atomic_write_json
from carl.online.batch import BASELINES, Baseline, build_batch
from carl.online.signals import SignalWeights, production_flags, request_reward
from carl.online.store import FeedbackStore, StoreConfig
from carl.train.config import RLConfig


@dataclass(frozen=True)
class GateConfig:
    eval_tasks: str = ""
    """The held-out bench: a carl tasks JSONL (e.g. a micro world's eval.jsonl). Required."""
    samples_per_task: int = 2
    z: float = 1.64
    """A regression counts when it exceeds z standard errors of the paired difference (1.64: a
    candidate no better or worse than the deployed model is blocked about 5% of the time)."""
    replay_requests: int = 8
    """Recent production requests replayed on candidate and deployed (0: no replay)."""

    def __post_init__(self) -> None:
        if self.samples_per_task < 1:
            raise ValueError(f"gate.samples_per_task: got {self.samples_per_task}, expected >= 1")
        if self.z < 0 or self.replay_requests < 0:
            raise ValueError("gate.z and gate.replay_requests: expected >= 0")


@dataclass(frozen=True)
class RollbackConfig:
    min_requests: int = 8
    """Live requests (with a reward) of a new version before it is judged."""
    z: float = 1.0
    """Roll back when its kept-edit rate is below the previous version's by more than z standard errors."""


@dataclass(frozen=True)
class OnlineConfig:
    base: str
    """The model deployed when the loop starts (version 0): a carl run directory, RUN:STEP, a
    checkpoint or a model folder (as `carl agent run --checkpoint`). Its run's config gives the
    model settings, tools, limits and sampling temperature the cycle trains with."""
    weights_dir: str
    """The weights directory `carl serve --weights-dir` follows."""
    train_overrides: tuple[str, ...] = ()
    """`a.b=value` overrides of the base run's TrainConfig for the cycle (e.g. "limits.max_new_tokens=256",
    "model.trainable_layers=4"); without a base run they apply to TrainConfig's defaults."""
    run_dir: str = "runs/online"
    serve_url: str = "http://127.0.0.1:8400"
    token_env: str = "CARL_ONLINE_TOKEN"
    """Environment variable holding an admin token of the service (`carl serve add-user NAME --admin`)."""
    workspaces: str = ""
    """The service's workspaces root, for replays (empty: no replay)."""
    store: StoreConfig = field(default_factory=StoreConfig)
    cadence_s: float = 3600.0
    cycles: int = 0
    """Stop after this many cycles (0: run until interrupted)."""
    min_requests: int = 8
    max_requests: int = 512
    signal_wait_s: float = 3600.0
    """How long a served request may wait for its signals: a cycle trains on requests in store order
    up to the first one still waiting (younger than this, no reward yet); one older than this
    without a signal is passed by for good."""
    baseline: str = "prompt"
    """carl.online.batch: "prompt" (the group of requests asking the same text; the batch mean for a
    text asked once: the smallest squared advantages on served requests, docs/online.md), "batch",
    "running_mean", "distill"."""
    baseline_decay: float = 0.9
    signals: SignalWeights = field(default_factory=SignalWeights)
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=2, lr=1e-5))
    gate: GateConfig = field(default_factory=GateConfig)
    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    seed: int = 0
    temperature: float | None = None
    """The temperature the service samples at, which the trainer scores with and the gate evaluates
    at; None: the base run's eval.temperature (what `carl serve --checkpoint` uses by default)."""

    def __post_init__(self) -> None:
        if not self.base:
            raise ValueError("online.base: empty; expected the deployed model (a run dir, checkpoint or model folder)")
        if not self.weights_dir:
            raise ValueError("online.weights_dir: empty; expected the directory `carl serve --weights-dir` follows")
        if self.baseline not in BASELINES:
            raise ValueError(f"online.baseline: got {self.baseline!r}, expected one of {', '.join(BASELINES)}")
        if not 0.0 <= self.baseline_decay < 1.0:
            raise ValueError(f"online.baseline_decay: got {self.baseline_decay}, expected in [0, 1)")
        if self.cadence_s < 0 or self.cycles < 0 or self.min_requests < 1 or self.max_requests < self.min_requests:
            raise ValueError("online.cadence_s, cycles >= 0 and 1 <= min_requests <= max_requests expected; got "
                             f"{self.cadence_s}, {self.cycles}, {self.min_requests}, {self.max_requests}")


# ---------------------------------------------------------------------- decisions (pure)


def gate_decision(bench: dict[str, float], replay: dict[str, float] | None, z: float) -> dict[str, Any]:
    """Pass iff the bench's pass@1 does not fall by more than z paired SEs and (with a replay) the
    flagged share does not rise by more than z paired SEs."""
    reasons, eps = [], 1e-9  # a fall of exactly z SEs is not beyond them (in floating point either)
    if bench["diff"] < -z * bench["se"] - eps:
        reasons.append(f"bench pass@1 fell by {-bench['diff']:.3f} (paired SE {bench['se']:.3f})")
    if replay is not None and replay["diff"] > z * replay["se"] + eps:
        reasons.append(f"replay: flagged share rose by {replay['diff']:.3f} (paired SE {replay['se']:.3f})")
    return {"pass": not reasons, "reasons": reasons}


def rollback_decision(live: list[bool], previous: list[bool], cfg: RollbackConfig) -> dict[str, Any]:
    """Compare the kept-edit rates of the deployed version (`live`) and the previous one."""
    out = {"live_n": len(live), "previous_n": len(previous), "rollback": False}
    if len(live) < cfg.min_requests or not previous:
        return {**out, "reason": f"waiting for {cfg.min_requests} live requests" if len(live) < cfg.min_requests
                else "no previous version to compare with"}
    p_live, p_prev = sum(live) / len(live), sum(previous) / len(previous)
    se = (p_live * (1 - p_live) / len(live) + p_prev * (1 - p_prev) / len(previous)) ** 0.5
    worse = p_live < p_prev - cfg.z * se if se > 0 else p_live < p_prev
    return {**out, "live_kept": p_live, "previous_kept": p_prev, "se": se, "rollback": worse,
            "reason": f"kept {p_live:.3f} vs {p_prev:.3f} (SE {se:.3f})"}


def paired_binary(a: list[bool], b: list[bool]) -> dict[str, float]:
    """Mean of b - a over pairs and its standard error (sample standard deviation / sqrt n)."""
    d = [float(y) - float(x) for x, y in zip(a, b)]
    n = len(d)
    if n == 0:
        return {"n": 0, "a": 0.0, "b": 0.0, "diff": 0.0, "se": 0.0}
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return {"n": n, "a": sum(map(float, a)) / n, "b": sum(map(float, b)) / n, "diff": mean, "se": (var / n) ** 0.5}


def settled(requests: list[dict[str, Any]], weights: SignalWeights, wait_s: float, now: float) -> list[dict[str, Any]]:
    """The requests (in store order) before the first one still waiting for its signals."""
    for i, r in enumerate(requests):
        if request_reward(r, weights) is None and now - (r.get("finished_at") or now) < wait_s:
            return requests[:i]
    return requests


def kept(request: dict[str, Any]) -> bool | None:
    """Was the request's edit kept, as its last kept/reverted signal says (None: no such signal)."""
    verdict = None
    for s in request.get("signals", []):
        if s["kind"] == "kept":
            verdict = s.get("value") is None or s["value"] > 0
        elif s["kind"] == "reverted":
            verdict = not (s.get("value") is None or s["value"] > 0)
    return verdict


# ---------------------------------------------------------------------- the loop


@dataclass
class OnlineState:
    deployed: dict[str, Any]
    """{"version", "model" (folder), "deployed_at" (unix s)}"""
    previous: dict[str, Any] | None = None
    last_id: int = 0
    next_version: int = 1
    cycle: int = 0
    baseline: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    """One row per cycle: version deployed after it, decision, live kept rate of what was deployed."""

    @classmethod
    def load(cls, path: Path) -> OnlineState | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, path: Path) -> None:
        atomic_write_json(path, dataclasses.asdict(self))


class OnlineLoop:
    """The cycle's machinery; `run_cycle` is the readable top level (see the module docstring)."""

    def __init__(self, cfg: OnlineConfig, deploy: Callable[[int], dict[str, Any]] | None = None,
                 log: Callable[[str], None] = print):
        from carl.config import load_config
        from carl.train.checkpoint_policy import resolve_checkpoint
        from carl.train.config import TrainConfig

        self.cfg, self.log = cfg, log
        self.run_dir = Path(cfg.run_dir)
        (self.run_dir / "cycles").mkdir(parents=True, exist_ok=True)
        model_dir, base_run, _ = resolve_checkpoint(cfg.base)
        train = load_config(TrainConfig, base_run / "config.toml" if base_run else None, list(cfg.train_overrides))
        # the trainer scores the served tokens at the temperature `carl serve` sampled them at: the
        # run's eval temperature (carl.train.checkpoint_policy), unless online.temperature says otherwise
        temperature = train.eval.temperature if cfg.temperature is None else cfg.temperature
        self.train_cfg = dataclasses.replace(train, run_dir=str(self.run_dir), rl=cfg.rl, seed=cfg.seed,
                                             model=dataclasses.replace(train.model, path=str(model_dir)),
                                             rollout=dataclasses.replace(train.rollout, temperature=temperature),
                                             eval=dataclasses.replace(train.eval, temperature=temperature))
        self.store = FeedbackStore(cfg.store)
        self.deploy_fn = deploy or self._deploy_over_http
        self._weights = None
        self._bench_outcomes: dict[str, list[bool]] = {}  # model folder -> its bench outcomes (one seed)
        self.state_path = self.run_dir / "state.json"
        self.state = OnlineState.load(self.state_path) or OnlineState(
            deployed={"version": 0, "model": str(model_dir), "deployed_at": time.time()})

    # ---------------------------------------------------------------- top level

    def run(self) -> None:
        done = 0
        while not self.cfg.cycles or done < self.cfg.cycles:
            started = time.monotonic()
            self.run_cycle()
            done += 1
            if self.cfg.cycles and done >= self.cfg.cycles:
                break
            time.sleep(max(0.0, self.cfg.cadence_s - (time.monotonic() - started)))

    def run_cycle(self) -> dict[str, Any]:
        s, cfg = self.state, self.cfg
        s.cycle += 1
        report: dict[str, Any] = {"cycle": s.cycle, "started_at": time.time(), "deployed": s.deployed["version"]}
        live = self._live_outcomes(s.deployed["version"])
        report["live"] = {"version": s.deployed["version"], "n": len(live), "kept_rate": _rate(live)}

        rollback = rollback_decision(live, self._live_outcomes(s.previous["version"]) if s.previous else [],
                                     cfg.rollback)
        report["rollback"] = rollback
        if rollback["rollback"]:
            bad = s.deployed
            self._deploy(s.previous, reason="rollback")
            s.previous = None  # compare the restored version afresh
            return self._finish(report, "rollback", f"rolled back v{bad['version']}: {rollback['reason']}")

        requests = self.store.finished_requests(model_version=s.deployed["version"], after_id=s.last_id,
                                                limit=cfg.max_requests)
        requests = settled(requests, cfg.signals, cfg.signal_wait_s, time.time())
        baseline = Baseline.from_dict(s.baseline)
        batch = build_batch(requests, self._cluster_of, cfg.signals, baseline, cfg.baseline, cfg.baseline_decay)
        report["data"] = batch.stats
        if len(batch.rollouts) < cfg.min_requests:
            return self._finish(report, "wait", f"{len(batch.rollouts)} rewarded requests, need {cfg.min_requests}")

        version = s.next_version
        s.next_version += 1
        self.log(f"cycle {s.cycle}: training v{version} on {len(batch.rollouts)} requests served by "
                 f"v{s.deployed['version']} (reward mean {batch.stats['reward_mean']:+.2f}, "
                 f"kept {batch.stats['kept_rate']:.2f})")
        candidate, metrics = self.train_candidate(batch.rollouts, version)
        s.last_id, s.baseline = batch.last_id, baseline.to_dict()
        report["train"] = metrics
        report["gate"] = gate = self.gate(candidate, requests)
        if not gate["pass"]:
            return self._finish(report, "blocked", "; ".join(gate["reasons"]))
        self._deploy({"version": version, "model": str(candidate)}, reason="gate passed")
        return self._finish(report, "deployed", f"v{version} deployed")

    # ---------------------------------------------------------------- steps

    def train_candidate(self, rollouts: list, version: int) -> tuple[Path, dict[str, float]]:
        """Train from the deployed weights on `rollouts`; the candidate saved as a model folder."""
        from carl.engine.hf import pad_token_id
        from carl.train.trainer import Trainer

        trainer = Trainer(self.train_cfg, Path(self.state.deployed["model"]))
        pad_id = pad_token_id(trainer.tokenizer)
        normalizer = float(len(rollouts) * self.train_cfg.limits.max_new_tokens)
        metrics: dict[str, float] = {}
        for _ in range(self.cfg.rl.steps):
            metrics = trainer.rl_step([[r] for r in rollouts], normalizer, tuple(self.train_cfg.tools), pad_id)
        out = self.run_dir / "models" / f"v{version:06d}"
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        trainer.model.save_pretrained(partial, safe_serialization=True)
        trainer.tokenizer.save_pretrained(partial)
        shutil.rmtree(out, ignore_errors=True)  # a cycle that was killed after saving, run again
        partial.rename(out)
        return out, {k: float(v) for k, v in metrics.items()}

    def gate(self, candidate: Path, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """The candidate against the deployed model: held-out bench and a production replay, paired."""
        from carl.eval.bench import evaluate
        from carl.harness.tools import default_tools
        from carl.tasks import load_tasks
        from carl.train.loop import eval_limits

        cfg, tc = self.cfg, self.train_cfg
        if not cfg.gate.eval_tasks:
            raise ValueError("gate.eval_tasks: empty; expected the held-out bench's tasks JSONL")
        tasks = load_tasks(cfg.gate.eval_tasks, require_repos=True)
        tools = {n: t for n, t in default_tools().items() if n in tc.tools}
        outcomes: dict[str, list[bool]] = {}
        flags: dict[str, list[bool]] = {}
        replays = self._replay_requests(requests)
        for name, model in (("deployed", Path(self.state.deployed["model"])), ("candidate", candidate)):
            cached = self._bench_outcomes.get(str(model))  # a model's bench episodes repeat under one seed
            self.log(f"gate: {name}{'' if cached else f' on {len(tasks)} bench tasks x {cfg.gate.samples_per_task}'}"
                     f"{f' and {len(replays)} replayed requests' if replays else ''}")
            if cached is not None and not replays:
                outcomes[name] = cached
                continue
            engine = self._engine(model)
            try:
                if cached is None:
                    _, rollouts = evaluate(name, engine, tasks, cfg.gate.samples_per_task, eval_limits(tc), tools,
                                           tc.sandbox, max_workers=tc.rollout.concurrency)
                    cached = self._bench_outcomes[str(model)] = [r.passed for r in rollouts]
                outcomes[name] = cached
                flags[name] = [bool(self._replay_flags(engine, r, tools)) for r in replays]
            finally:
                engine.close()
        bench = paired_binary(outcomes["deployed"], outcomes["candidate"])
        replay = paired_binary(flags["deployed"], flags["candidate"]) if replays else None
        samples = [f"{t.instance_id}/{j}" for t in tasks for j in range(cfg.gate.samples_per_task)]
        per_sample = {"bench": {"samples": samples, **outcomes}}  # what a reviewer needs to redo the numbers
        if replays:
            per_sample["replay"] = {"requests": [f"{r['session_id']}/{r['request_index']}" for r in replays], **flags}
        return {"bench": bench, "replay": replay, **gate_decision(bench, replay, cfg.gate.z), "per_sample": per_sample}

    # ---------------------------------------------------------------- helpers

    def _engine(self, model: Path):
        from carl.engine.hf import HFEngine
        from carl.train.loop import sampler_config

        tc = self.train_cfg
        return HFEngine(dataclasses.replace(sampler_config(tc, model, tc.eval.temperature, seed=self.cfg.seed),
                                            lora=None))

    def _replay_requests(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.cfg.workspaces or not self.cfg.gate.replay_requests:
            return []
        return requests[-self.cfg.gate.replay_requests:]

    def _replay_flags(self, engine, request: dict[str, Any], tools) -> list[str]:
        """Run a stored request again (its workspace as it is now, its text) and flag the result."""
        from carl.harness.agent import TextTask, run_episode
        from carl.online.workspaces import workspace_dir
        from carl.rewards.diff import workspace_changes
        from carl.sandbox import open_sandbox

        session = self.store.get_session(request["session_id"])
        source = workspace_dir(self.cfg.workspaces, session["user"], session["workspace"])
        key = f"replay/{request['session_id']}/{request['request_index']}"
        with open_sandbox(str(source), self.train_cfg.sandbox) as sandbox:
            traj = run_episode(engine.episode(key), sandbox, TextTask(key, request["text"]), self.train_cfg.limits, tools)
            edits = "" if traj.stop_reason.is_infra_failure else workspace_changes(sandbox, str(source)).text
        return production_flags({"edits": edits, "stop_reason": traj.stop_reason.value,
                                 "trajectory": traj.to_dict()}, self.cfg.signals)

    def _cluster_of(self, request: dict[str, Any]) -> str:
        session = self.store.get_session(request["session_id"]) or {}
        return f"{session.get('user', '?')}/{session.get('workspace', '?')}"

    def _live_outcomes(self, version: int) -> list[bool]:
        """Kept (True) / reverted (False) of every signalled request served by `version`."""
        outcomes = (kept(r) for r in self.store.finished_requests(model_version=version))
        return [k for k in outcomes if k is not None]

    def _deploy(self, target: dict[str, Any], reason: str) -> None:
        s = self.state
        version = target["version"]
        if reason == "rollback":  # the previous weights again, under a new number
            version = s.next_version
            s.next_version += 1
        self.publish(Path(target["model"]), version)
        self.deploy_fn(version)
        s.previous, s.deployed = s.deployed, {"version": version, "model": target["model"], "deployed_at": time.time()}

    def publish(self, model: Path, version: int) -> None:
        """Write `model`'s weights as `version` to the weights dir the service follows."""
        import torch

        from carl.engine.hf import DTYPES, load_model
        from carl.engine.weights import WeightStore

        if self._weights is None:
            # keep what is there: a restarted service reloads the deployed version from it
            self._weights = WeightStore(self.cfg.weights_dir, DTYPES[self.train_cfg.model.dtype], keep_existing=True)
        _, module = load_model(model, torch.float32)
        self._weights.publish(module, version)

    def _deploy_over_http(self, version: int) -> dict[str, Any]:
        import os

        from carl.online.client import ServeClient

        token = os.environ.get(self.cfg.token_env)
        if not token:
            raise ValueError(f"online.token_env: ${self.cfg.token_env} is not set; expected an admin token of "
                             "the service (`carl serve add-user NAME --admin`)")
        with ServeClient(self.cfg.serve_url, token) as client:
            return client.deploy(version)

    def _finish(self, report: dict[str, Any], decision: str, why: str) -> dict[str, Any]:
        s = self.state
        report.update(decision=decision, why=why, deployed_after=s.deployed["version"], finished_at=time.time())
        s.history.append({"cycle": s.cycle, "decision": decision, "deployed": s.deployed["version"],
                          "live_version": report["live"]["version"], "live_n": report["live"]["n"],
                          "live_kept": report["live"]["kept_rate"]})
        atomic_write_json(self.run_dir / "cycles" / f"cycle_{s.cycle:04d}.json", report)
        s.save(self.state_path)
        plot_kept_rates(self.store, s, self.run_dir / "plots" / "kept_rate.png")
        self.log(f"cycle {s.cycle}: {decision}: {why}")
        return report

    def close(self) -> None:
        self.store.close()


def plot_kept_rates(store: FeedbackStore, state: OnlineState, path: Path) -> None:
    """Kept-edit rate (with a binomial standard error) of every version that served requests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = sorted({h["live_version"] for h in state.history} | {state.deployed["version"]})
    rows = []
    for v in versions:
        outcomes = [k for k in (kept(r) for r in store.finished_requests(model_version=v)) if k is not None]
        if outcomes:
            p = sum(outcomes) / len(outcomes)
            rows.append((v, p, (p * (1 - p) / len(outcomes)) ** 0.5, len(outcomes)))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.errorbar([f"v{v}" for v, *_ in rows], [p for _, p, _, _ in rows], yerr=[se for *_, se, _ in rows],
                fmt="o-", capsize=4)
    for i, (_, p, _, n) in enumerate(rows):
        ax.annotate(f"n={n}", (i, p), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("deployed version")
    ax.set_ylabel("kept-edit rate (+- SE)")
    ax.set_title("carl online: edits users kept, per deployed version")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".tmp.png"), dpi=100)
    plt.close(fig)
    path.with_suffix(".tmp.png").replace(path)


def _rate(outcomes: list[bool]) -> float | None:
    return sum(outcomes) / len(outcomes) if outcomes else None
