"""Where episodes run: threads of this process, or Ray actors anywhere in a Ray cluster.

Both give the orchestrator one call, `submit(task index, sample index, version) -> Future[Rollout]`.

- `ThreadWorkers`: `concurrency` episode threads sharing the run's engine object (any engine,
  the in-process HF one included). The default on one machine.
- `RayWorkers`: `actors` Ray actors, each building its own episode runner from a picklable spec
  sent once (`spec.runner()`: RL's `EpisodeSpec` gives each actor its own engine client, the vLLM
  engine's HTTP address, and its own sandboxes; `carl bench run --ray` sends
  carl.eval.bench.BenchEpisodes, whose actors build their own policy), each running up to
  `per_actor` episodes at once. Each actor asks
  Ray for `cpus_per_actor` CPUs (fractional on small machines: a 2-core box holds several
  actors, which spend most of their time waiting on the engine and on test processes). An actor
  that dies (killed, its node lost) is replaced, and its episodes in flight are started again on
  a live actor, at most `max_retries` times each; a finished episode is never run twice.
  Actors are spread over the cluster's nodes (Ray's SPREAD strategy): Ray's default packs
  fractional-CPU actors onto one node until half its CPUs are taken, which on a cluster of
  16-core nodes would put 16 actors of 0.5 CPU on the head node and leave the others idle.

Ray is an optional dependency (`pip install ray`); `carl train rollout.workers=ray` without it is a
one-line error. On one machine carl starts a local Ray; `rollout.ray_address` joins a cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from carl.errors import UserError
from carl.rollout.rollout import Rollout


class ThreadWorkers:
    def __init__(self, run_one: Callable[[int, int], Rollout], concurrency: int):
        self.run_one = run_one
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="carl-episode")

    def submit(self, task_index: int, sample_index: int, version: int) -> Future:
        return self.pool.submit(self.run_one, task_index, sample_index)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class EpisodeSpec:
    """Everything a rollout actor needs to run episodes of a run, sent to it once (pickled)."""

    tasks: list[Any]
    limits: Any
    tool_names: tuple[str, ...]
    sandbox: Any
    monitor: Any
    shaping: Any
    engine_url: str
    model_path: str
    max_model_len: int
    seed: int
    sampling: Any
    record_routes: bool = False
    """MoE router replay: fetch each generation's expert routes from the engine's worker."""
    lora_rank: int = 0
    """LoRA runs: sample with the run's adapter (carl.engine.vllm.LORA_NAME)."""
    seeded: bool = True
    """rollout.seeded: each rollout samples from streams named by its task and number (`rollout_policy`)."""


    def runner(self) -> Callable[[int, int, int], Rollout]:
        """run(task index, rollout number, version): one RL episode against the engine at
        `engine_url`, in its own sandbox (built once per actor: an engine client and the tools)."""
        from carl.engine.config import EngineConfig
        from carl.engine.vllm import VLLMEngine
        from carl.harness.tools import default_tools
        from carl.rewards.reward import RewardConfig
        from carl.rollout.rollout import run_rollout

        engine = VLLMEngine(self.model_path, "", EngineConfig(url=self.engine_url), "",
                            max_model_len=self.max_model_len, seed=self.seed, sampling=self.sampling,
                            record_routes=self.record_routes, lora_rank=self.lora_rank, log=lambda m: None)
        tools = {n: t for n, t in default_tools().items() if n in self.tool_names}

        def run(task_index: int, rollout_index: int, version: int) -> Rollout:
            engine.policy_version = version  # the version its first turn samples with (the server's now)
            task = self.tasks[task_index]
            return run_rollout(rollout_policy(engine, task, rollout_index, self.seeded), task, self.limits, tools,
                               self.sandbox, RewardConfig(), self.monitor, self.shaping)

        return run


def rl_submit(workers: Any, group_size: int) -> Callable[[int, int, int, int], Future]:
    """The orchestrator's `submit(task index, sample index, version, position)` for RL on `workers`:
    sample j of the group at task-stream position p is the run's rollout number p * G + j, which the
    RL runners are given in place of a sample index (it names the rollout's random numbers)."""
    return lambda t, j, version, pos: workers.submit(t, pos * group_size + j, version)


def rollout_policy(engine: Any, task: Any, rollout_index: int, seeded: bool) -> Any:
    """What RL rollout number `rollout_index` of `task` samples from. `seeded`: the engine's episode
    view whose turn t draws from seed stream_seed(engine seed, "<task id>/rl/<number>", t)
    (`carl.engine.streams`), so two runs from one checkpoint with one seed give their n-th rollouts
    the same random numbers whatever the threads' timing, and a branch differs from its source by
    the recipe, not by the draw (common random numbers, as evals have). Not seeded: the engine's
    own stream (HF: by arrival order; vLLM: one generator for the batch, which on a GPU saves a
    per-request generator in the sampler; cost not measured here)."""
    return engine.episode(f"{task.instance_id}/rl/{rollout_index}") if seeded else engine


class RolloutActor:
    """A Ray actor's body (wrapped with `ray.remote` by RayWorkers): the episodes of `spec.runner()`."""

    def __init__(self, spec: Any):
        self.run_one = spec.runner()

    def run(self, task_index: int, sample_index: int, version: int) -> Rollout:
        return self.run_one(task_index, sample_index, version)

    def pid(self) -> int:
        import os

        return os.getpid()

    def node(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


class RayWorkers:
    def __init__(self, spec: Any, actors: int, per_actor: int, cpus_per_actor: float,
                 address: str = "", max_retries: int = 3, gpus_per_actor: float = 0.0,
                 needed_by: str = "rollout.workers=ray (or rollout.workers=threads)"):
        """`spec`: anything picklable with a `runner()` that returns run(task index, sample index,
        version) -> Rollout, called once in each actor (EpisodeSpec, carl.eval.bench.BenchEpisodes).
        `needed_by` names the setting that asked for Ray, for the error when it is not installed."""
        try:
            import ray
        except ImportError:
            raise UserError(f"Ray is not installed (pip install ray); it is needed by {needed_by}") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, configure_logging=False)
        self.spec_ref = ray.put(spec)
        # one slot more than the episodes: control calls (pid, node) never wait behind them
        self.remote_cls = ray.remote(max_concurrency=per_actor + 1, num_cpus=cpus_per_actor, num_gpus=gpus_per_actor,
                                     max_restarts=0, scheduling_strategy="SPREAD")(RolloutActor)
        self.max_retries = max_retries
        self.actors = [self._new_actor() for _ in range(actors)]
        self.replaced = 0
        self._next = 0
        self._lock = threading.Lock()

    def _new_actor(self):
        return self.remote_cls.remote(self.spec_ref)

    def submit(self, task_index: int, sample_index: int, version: int) -> Future:
        out: Future = Future()
        self._attempt(out, task_index, sample_index, version, 0)
        return out

    def _attempt(self, out: Future, t: int, j: int, version: int, tries: int) -> None:
        with self._lock:
            slot = self._next % len(self.actors)
            self._next += 1
            actor = self.actors[slot]
        ref = actor.run.remote(t, j, version)

        def done(fut: Future) -> None:
            try:
                out.set_result(fut.result())
            except self.ray.exceptions.RayActorError as e:  # the actor died: replace it, run the episode again
                with self._lock:
                    if self.actors[slot] is actor:
                        self.actors[slot] = self._new_actor()
                        self.replaced += 1
                if tries + 1 > self.max_retries:
                    out.set_exception(RuntimeError(f"episode ({t}, {j}) lost {tries + 1} rollout actors: {e}"))
                else:
                    self._attempt(out, t, j, version, tries + 1)
            except BaseException as e:  # noqa: BLE001 - handed to the orchestrator
                out.set_exception(e)

        ref.future().add_done_callback(done)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
