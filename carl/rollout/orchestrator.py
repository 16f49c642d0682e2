"""The rollout orchestrator: groups of rollouts produced ahead of the trainer, within a staleness bound.

Legend: G = rollouts per group (one task), T = tasks (groups) per trainer step, v = the engine's
weights version (= the trainer's step), S = max_staleness, end = rl.steps (no group for a step past it).

    orchestrator thread                         workers (threads, or Ray actors)
    next task k of the order ──start group──>   G episodes, each: sandbox -> harness -> engine
       while started < T min(v+S+1, end) + extra   -> reward + monitor -> Rollout
       ("pace"; "drop": while the buffer has room)        │ the G-th one done
                                                          v
    trainer step s  <──take(s)── GroupBuffer [g g g ...] (bounded, FIFO by completion)
       too old (s - min version > S): dropped, one more group allowed
       no group with signal: one more batch of T allowed (dynamic sampling)
       rl_step -> weights s + 1 to the engine -> set_version(s + 1)

Episodes already running when the weights change go on: their next turns (and, on vLLM, the rest
of a running generation) sample from the new version, and every turn records the version that
sampled it (`Segment.versions`). Synchronous RL is S = 0 on this same path: with "pace", groups
for step s start only once the engine holds version s, and the trainer takes exactly those.

A worker that crashes (a Ray actor dies) fails only its episodes in flight; they are started
again on another worker, so no rollout is lost; a rollout that failed in the infrastructure
(sandbox, engine, reward) comes back as an invalid Rollout, masked from training, and is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from carl.rollout.buffer import Group, GroupBuffer
from carl.rollout.rollout import Rollout, has_signal

STALE_MODES = ("pace", "drop")
MAX_DROPS_PER_STEP = 4
"""A step that dropped this many batches' worth of too-old groups stops the run with an error
instead of rolling out forever (an engine stuck at an old version would never catch up)."""


@dataclass
class StepGroups:
    """What the trainer took for one step."""

    groups: list[Group]
    batches: int
    dropped: int
    wait_s: float
    """Seconds the trainer waited for groups (its idle time this step)."""
    task_pos: int
    """One past the furthest task position consumed so far (a resume starts there)."""
    staleness: dict[str, float] = field(default_factory=dict)


class Orchestrator:
    def __init__(self, submit: Callable[[int, int, int, int], Future], num_tasks: int, order: list[int],
                 group_size: int, tasks_per_step: int, max_staleness: int, stale: str, start_pos: int,
                 start_version: int, buffer_groups: int = 0, max_extra_batches: int = 0, end_step: int | None = None):
        """`submit(task index, sample index, version, position)` starts one episode and returns a Future of
        its Rollout; position: its group's place in the task order stream (`start_pos` on), the same for
        a group started again after a resume, so (position, sample index) names one rollout of a run.
        `end_step`: the run's last step + 1 (rl.steps); with "pace" no group starts for a step at or past
        it (they would run, unused, while the run ends and its workers wait for them)."""
        if stale not in STALE_MODES:
            raise ValueError(f"rollout.stale: got {stale!r}, expected one of {list(STALE_MODES)}")
        self.submit, self.num_tasks, self.order = submit, num_tasks, order
        self.G, self.T, self.S, self.stale = group_size, tasks_per_step, max_staleness, stale
        self.max_extra_batches, self.end_step = max_extra_batches, end_step
        self.buffer = GroupBuffer(buffer_groups or tasks_per_step * (max_staleness + 1 + max_extra_batches))
        self.version = start_version
        self._pos = start_pos  # next position in the task order to start
        self._consumed_pos = start_pos
        self._started = 0
        self._target_extra = 0  # groups allowed beyond the staleness window (extra batches, replacements)
        self._base = start_version  # version at which this orchestrator's numbering starts
        self._outstanding = 0  # groups started and not yet taken
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="carl-orchestrator", daemon=True)

    # ------------------------------------------------------------------ trainer side

    def start(self) -> Orchestrator:
        self._thread.start()
        return self

    def set_version(self, version: int) -> None:
        """The engine now holds `version` (after a weight update): more groups may start."""
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def take(self, step: int, max_batches: int | None = None) -> StepGroups:
        """The groups of trainer step `step`: T groups, or more batches of T until one has signal
        (at most `max_extra_batches` more, and at most `max_batches` in all: a rollout budget's
        last step), none older than S versions (older ones are dropped)."""
        extra = self.max_extra_batches if max_batches is None else min(self.max_extra_batches, max_batches - 1)
        groups: list[Group] = []
        dropped, wait_s, batches = 0, 0.0, 1
        while True:
            while len(groups) < batches * self.T:
                t0 = time.monotonic()
                group = self.buffer.take()
                wait_s += time.monotonic() - t0
                with self._cond:
                    self._outstanding -= 1  # room for one more in the buffer: wake the producer
                    self._consumed_pos = max(self._consumed_pos, group.pos + 1)
                    self._cond.notify_all()
                if step - group.min_version > self.S:
                    dropped += 1
                    if dropped > MAX_DROPS_PER_STEP * self.T:
                        raise RuntimeError(
                            f"step {step}: {dropped} groups in a row arrived more than rollout.max_staleness="
                            f"{self.S} versions old (the last one sampled at version {group.min_version}): the "
                            "engine is not following the trainer's weights, or rollouts take longer than "
                            "max_staleness steps; raise rollout.max_staleness or use rollout.stale=pace")
                    self._allow(1)
                    continue
                groups.append(group)
            if any(has_signal(g.rollouts) for g in groups) or batches > extra:
                break
            batches += 1
            self._allow(self.T)
        groups.sort(key=lambda g: g.seq)
        return StepGroups(groups, batches, dropped, wait_s, self._consumed_pos, staleness_metrics(groups, step))

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.buffer.close()

    # ------------------------------------------------------------------ producer side

    def _allow(self, n: int) -> None:
        with self._cond:
            self._target_extra += n
            self._cond.notify_all()

    def _may_start(self) -> bool:
        if self._outstanding >= self.buffer.capacity:  # room for it in the buffer once done
            return False
        if self.stale == "drop":
            return True
        ahead = self.version + self.S + 1 if self.end_step is None else min(self.version + self.S + 1, self.end_step)
        window = self.T * (ahead - self._base)
        return self._started < window + self._target_extra

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or self._may_start())
                    if self._stop:
                        return
                    seq, pos = self._started, self._pos
                    self._started += 1
                    self._pos += 1
                    self._outstanding += 1
                    version = self.version
                self._start_group(seq, pos, version)
        except BaseException as e:  # noqa: BLE001 - the trainer re-raises it from take()
            self.buffer.fail(e)

    def _start_group(self, seq: int, pos: int, version: int) -> None:
        task_index = self.order[pos % self.num_tasks]
        futures = [self.submit(task_index, j, version, pos) for j in range(self.G)]
        results: list[Rollout | None] = [None] * self.G
        remaining = [self.G]
        lock = threading.Lock()

        def done(j: int, fut: Future) -> None:
            try:
                results[j] = fut.result()
            except BaseException as e:  # noqa: BLE001 - a worker's own failure, not the episode's
                self.buffer.fail(e)
                return
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self.buffer.put(Group(task_index, list(results), version, seq, pos, time.monotonic()))

        for j, fut in enumerate(futures):
            fut.add_done_callback(lambda f, j=j: done(j, f))


def staleness_metrics(groups: list[Group], step: int) -> dict[str, float]:
    """Per generated token: how many versions behind trainer step `step` its sampler was."""
    pairs = [(step - v, n) for g in groups for v, n in g.token_versions if n]
    tokens = sum(n for _, n in pairs)
    if not tokens:
        return {}
    return {
        "staleness/token_mean": sum(s * n for s, n in pairs) / tokens,
        "staleness/token_max": float(max(s for s, _ in pairs)),
        "staleness/stale_token_frac": sum(n for s, n in pairs if s > 0) / tokens,
        "staleness/group_max": float(max(step - g.min_version for g in groups)),
    }

