"""Groups of rollouts between the rollout workers and the trainer, with the versions that made them.

Legend: G = rollouts per group (one task), T = tasks per step.

A `Group` is the G rollouts of one task; `Group.min_version` is the oldest weights version that
sampled any of its tokens (turn by turn: `Segment.versions`), so the group's staleness at trainer
step s is s - min_version. `GroupBuffer` is a thread-safe FIFO with a capacity: producers block on
`put` while it is full, the trainer blocks on `take` until a group arrives (or the producers fail).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from carl.rollout.rollout import Rollout


@dataclass
class Group:
    task_index: int
    """Position of the task in the run's task order (the data position a resume continues from)."""
    rollouts: list[Rollout]
    started_version: int
    """The engine's weights version when the group's first episode started."""
    seq: int = 0
    """Production order of this orchestrator (0, 1, 2, ...): a step's groups are trained in it."""
    pos: int = 0
    """Position in the task order (its task is order[pos % len]): a resume starts after the last one taken."""
    finished_at: float = 0.0

    @property
    def token_versions(self) -> list[tuple[int, int]]:
        """(version, generated tokens) runs of every rollout's every segment."""
        out = []
        for r in self.rollouts:
            for seg in r.trajectory.segments:
                if seg.versions:
                    out += [(v, n) for _, n, v in seg.versions]
                elif any(seg.generated_mask_T):  # an engine that records no versions
                    out.append((r.trajectory.policy_version, sum(seg.generated_mask_T)))
        return out

    @property
    def min_version(self) -> int:
        versions = [v for v, n in self.token_versions if n]
        return min(versions) if versions else self.started_version


@dataclass
class GroupBuffer:
    capacity: int
    _items: deque = field(default_factory=deque)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _error: BaseException | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity: got {self.capacity}, expected >= 1")

    def put(self, group: Group) -> None:
        with self._cond:
            while len(self._items) >= self.capacity and not self._closed:
                self._cond.wait()
            if self._closed:
                return
            self._items.append(group)
            self._cond.notify_all()

    def take(self, timeout_s: float | None = None) -> Group:
        """The oldest group; raises the producers' error if they failed, TimeoutError after `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._error is not None or self._closed, timeout_s):
                raise TimeoutError(f"no rollout group arrived within {timeout_s} s")
            if self._items:
                group = self._items.popleft()
                self._cond.notify_all()
                return group
            if self._error is not None:
                raise RuntimeError(f"the rollout workers failed: {self._error}") from self._error
            raise RuntimeError("the rollout buffer was closed")

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
