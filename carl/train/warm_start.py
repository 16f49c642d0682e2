"""Supervised warm start on expert trajectories (loss on model-generated tokens only).

    training tasks --scripted expert (carl.micro.expert), real sandboxes + harness + reward-->
        token-exact trajectories in the policy's chat template
    keep the ones that scored reward 1 --> next-token loss on the expert's (generated) tokens

The expert runs through the same `collect_groups` as RL rollouts, so its data has exactly the
prompt, tools and observations the policy will see.

When only the top N blocks train (`model.trainable_layers`), the embedding and the blocks below
them never change, so what enters block -N is the same numbers every epoch. `TrunkCache` computes
it once, before the first epoch, and every epoch runs only the top N blocks:

    before:    ids -> embed -> trunk (frozen, no gradient) -> h_T_D (kept)
    epoch 1+:                                    h_T_D (kept) -> top N (trained) -> norm -> head

That pass runs the tokens every sequence starts with (the system prompt and tool list) through
the trunk once for the whole data set, not once per micro-batch (`TrunkCache.fill`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import DynamicCache

from carl.harness.agent import EpisodeLimits
from carl.harness.tools.base import Tool
from carl.micro.expert import ExpertMistakes, expert_token_policy
from carl.rl.logprobs import pad_right, sequence_logprobs
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.rollout.rollout import Rollout, collect_groups
from carl.train.prefix import checked_prefix_len, common_prefix_len
from carl.train.ranks import Ranks, idle_micro_batch
from carl.train.reference import entering_block
from carl.train.step import TrainSequence, autocast, micro_batches, pad_rows


def expert_rollouts(tasks: list[TaskRecord], tokenizer: Any, num_episodes: int, mistakes: ExpertMistakes,
                    limits: EpisodeLimits, tools: dict[str, Tool], sandbox: SandboxConfig,
                    seed: int, on_done: Callable[[Rollout], None] = lambda r: None,
                    summary: str = "notes") -> list[Rollout]:
    spread = round_robin_by_repo(tasks)
    chosen = [spread[i % len(spread)] for i in range(num_episodes)]
    groups = collect_groups(lambda t, j: expert_token_policy(tokenizer, chosen[t], mistakes, seed=seed * 7919 + t,
                                                             summary=summary),
                            chosen, 1, limits, tools, sandbox, on_done=on_done)
    return [g[0] for g in groups]


def round_robin_by_repo(tasks: list[TaskRecord]) -> list[TaskRecord]:
    """The tasks reordered to take one task of each repo in turn (repos in first-seen order), so
    that a few episodes already cover many repos: the agent must learn to copy names and paths
    from the task, not a few repos' names by heart."""
    by_repo: dict[str, list[TaskRecord]] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    rounds = itertools.zip_longest(*by_repo.values())
    return [t for r in rounds for t in r if t is not None]


def sft_loss(logprobs_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood of the masked (model-generated) tokens."""
    maskf = mask_B_T.float()
    n = maskf.sum().clamp(min=1)
    loss = -(logprobs_B_T.float() * maskf).sum() / n
    return loss, {"nll": float(loss.detach()), "num_tokens": float(maskf.sum())}


def sft_sequences(rollouts: list[Rollout]) -> list[TrainSequence]:
    """The supervised sequences of the successful rollouts: their segments with generated tokens."""
    return [TrainSequence(s.token_ids_T, s.generated_mask_T, s.logprobs_T, 0.0)
            for r in rollouts if r.valid and r.passed for s in r.trajectory.segments if any(s.generated_mask_T)]


def distinct_sequences(rollouts: list[Rollout]) -> int:
    """Distinct supervised sequences of the rollouts: the rows `TrunkCache.fill` keeps."""
    return len({tuple(s.token_ids_T) for s in sft_sequences(rollouts)})


def sft_batches(rollouts: list[Rollout], batch_size: int) -> int:
    """Batches of one `sft_epoch` over `rollouts`."""
    return -(-len(sft_sequences(rollouts)) // batch_size)


FILL_RTOL = 1e-2
"""Largest relative difference (Frobenius norm, per row) `check` allows between the states `fill`
kept and the full pass's: bf16 rounding of different batch shapes gave 2.7e-4 on SmolLM2; a trunk
pass that misplaces the prefix's keys and values is off by whole units."""

log = logging.getLogger(__name__)


class _TrunkDone(Exception):
    """Ends a trunk-only pass at the first trained block (TrunkCache._trunk_pass)."""


def _length_groups(seqs: list[TrainSequence], prefix_len: int, max_tokens: int) -> list[list[TrainSequence]]:
    """`seqs` by length, cut into runs whose padded rests (tokens after `prefix_len`) fit `max_tokens`."""
    groups: list[list[TrainSequence]] = []
    for s in sorted(seqs, key=lambda s: len(s.token_ids_T)):
        rest = len(s.token_ids_T) - prefix_len
        if groups and (len(groups[-1]) + 1) * rest <= max_tokens:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


class TrunkCache:
    """What enters the policy's block -`num_layers` for each warm-start sequence (its frozen
    trunk's output), kept before the first epoch (`fill`) or while a full pass runs (`capture`),
    and fed to the top blocks alone after.

    The first micro-batch is checked on a full pass: the states `fill` kept must be that pass's up
    to rounding, and the top blocks on them must give its log-probs (an architecture that treats
    `inputs_embeds` differently, e.g. scales them, fails this), else the cache turns itself off and
    every pass stays full. States are kept in host memory, at most `max_bytes` of them; sequences
    beyond that take the full pass."""

    def __init__(self, model: Any, num_layers: int, max_bytes: float = 2 * 2**30):
        self.model, self.num_layers, self.max_bytes = model, num_layers, max_bytes
        self.hidden: dict[tuple[int, ...], torch.Tensor] = {}  # token ids -> h_T_D
        self.bytes = 0
        self.checked = False
        self.share_ok: bool | None = None  # top-only passes with a shared prefix: checked once, on first use
        self._fresh: dict[tuple[int, ...], torch.Tensor] = {}  # a full pass's states of rows `fill` kept, for `check`
        layers = getattr(getattr(model, "model", None), "layers", None)
        self.enabled = layers is not None and 0 < num_layers < len(layers)

    def fill(self, seqs: list[TrainSequence], pad_id: int, max_tokens: int,
             compute_dtype: torch.dtype | None = None, on_rows: Callable[[int], None] | None = None) -> int:
        """Keep the trunk's output for every sequence of `seqs` now, without gradient: the tokens
        they all start with (the system prompt and tool list, before any scored token) through
        the trunk once, at batch 1, then the rows' rests against those keys and values, rows of
        similar length together, at most `max_tokens` (padded) per call. Epoch 1 then runs the top
        blocks alone too; its first micro-batch still takes the full pass, which `check` compares
        with the kept states (the cache turns off where they differ). Returns the sequences kept
        (distinct ones: `distinct_sequences`); `on_rows(n)` after each call's n rows.

        Against keeping the states during epoch 1's full passes (before 2026-12-07), the prefix runs
        through the trunk once instead of once per micro-batch, and the rests pad less."""
        todo = list({tuple(s.token_ids_T): s for s in seqs if tuple(s.token_ids_T) not in self.hidden}.values())
        if not self.enabled or not todo:
            return 0
        P = common_prefix_len([s.token_ids_T for s in todo], [s.generated_mask_T for s in todo])
        device = next(self.model.parameters()).device
        prefix_cache, h_1_P_D = None, None
        kept = 0
        with torch.no_grad(), autocast(self.model, compute_dtype):
            if P:
                prefix_cache = DynamicCache(config=self.model.config)
                ids_1_P = torch.as_tensor([list(todo[0].token_ids_T[:P])], dtype=torch.long, device=device)
                h_1_P_D = self._trunk_pass(ids_1_P, None, prefix_cache)
            for rows in _length_groups(todo, P, max_tokens):
                ids_B_T, attn_B_T = (t.to(device) for t in pad_right([s.token_ids_T[P:] for s in rows], pad_id))
                cache = None
                if prefix_cache is not None:
                    cache = copy.deepcopy(prefix_cache)
                    cache.batch_repeat_interleave(len(rows))
                    attn_B_T = torch.cat([attn_B_T.new_ones((len(rows), P)), attn_B_T], dim=1)
                h_B_T_D = self._trunk_pass(ids_B_T, attn_B_T, cache)
                for b, s in enumerate(rows):
                    if self.bytes >= self.max_bytes:
                        return kept
                    h_T_D = h_B_T_D[b, : len(s.token_ids_T) - P]
                    if h_1_P_D is not None:
                        h_T_D = torch.cat([h_1_P_D[0], h_T_D])
                    self._keep(tuple(s.token_ids_T), h_T_D)
                    kept += 1
                if on_rows is not None:
                    on_rows(len(rows))
        return kept

    def _trunk_pass(self, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """What enters block -num_layers for `ids_B_T` (after the tokens `cache` holds, whose
        trunk keys and values it gains): the base model's forward, stopped there."""
        kept: list[torch.Tensor] = []

        def stop(h_B_T_D: torch.Tensor) -> None:
            kept.append(h_B_T_D)
            raise _TrunkDone

        with entering_block(self.model, -self.num_layers, stop):
            try:
                self.model.model(input_ids=ids_B_T, attention_mask=attn_B_T, cache=cache, use_cache=cache is not None)
            except _TrunkDone:
                pass
        if not kept:
            raise RuntimeError(f"{type(self.model).__name__}: its forward never reached block -{self.num_layers}")
        return kept[0]

    def _keep(self, key: tuple[int, ...], h_T_D: torch.Tensor) -> None:
        """Keep a sequence's states in host memory (not a GPU's), counted toward max_bytes."""
        h_T_D = h_T_D.to("cpu", copy=True)
        self.hidden[key] = h_T_D
        self.bytes += h_T_D.numel() * h_T_D.element_size()

    def needs_check(self, prefix_len: int) -> bool:
        """Whether a full pass of a micro-batch with this shared prefix is still to be compared
        (`check`): the first one, and the first with a shared prefix."""
        return not self.checked or bool(prefix_len and self.share_ok is None)

    def has(self, micro: list[TrainSequence]) -> bool:
        return self.enabled and all(tuple(s.token_ids_T) in self.hidden for s in micro)

    @contextlib.contextmanager
    def capture(self, micro: list[TrainSequence], prefix_len: int = 0) -> Iterator[None]:
        """While the full forward pass of `micro` runs inside, keep each row's states entering
        block -num_layers (its real tokens only: padding differs from batch to batch). With
        `prefix_len` P the pass is two calls (carl.train.prefix): the shared P tokens at batch 1,
        then the rows' rest; each row keeps the prefix's states followed by its own."""
        if not self.enabled or self.bytes >= self.max_bytes:
            yield
            return
        calls: list[torch.Tensor] = []

        def keep(h_B_T_D: torch.Tensor) -> None:
            calls.append(h_B_T_D)
            if prefix_len and len(calls) == 1:  # the shared prefix's pass: the rows' rest comes next
                return
            checking = self.needs_check(prefix_len)
            for b, s in enumerate(micro):
                key = tuple(s.token_ids_T)
                if key in self.hidden and not checking:
                    continue
                if key not in self.hidden and self.bytes >= self.max_bytes:
                    continue
                h_T_D = h_B_T_D[b, : len(key) - prefix_len]
                if prefix_len:
                    h_T_D = torch.cat([calls[0][0], h_T_D])
                if key in self.hidden:  # kept by `fill`: `check` compares the two
                    self._fresh[key] = h_T_D.to("cpu", copy=True)
                else:
                    self._keep(key, h_T_D)

        with entering_block(self.model, -self.num_layers, keep):
            yield

    def top_logprobs(self, micro: list[TrainSequence], ids_B_T: torch.Tensor, attn_B_T: torch.Tensor,
                     mask_B_T: torch.Tensor, prefix_len: int = 0) -> torch.Tensor:
        """`sequence_logprobs` of `micro` through the top blocks alone, on the kept states (their
        common first `prefix_len` tokens run once: pass 0 until `share_ok`)."""
        rows = [self.hidden[tuple(s.token_ids_T)] for s in micro]
        h_B_T_D = torch.zeros((*ids_B_T.shape, rows[0].shape[-1]), dtype=rows[0].dtype, device=ids_B_T.device)
        for b, h_T_D in enumerate(rows):
            h_B_T_D[b, : len(h_T_D)] = h_T_D.to(ids_B_T.device)
        with self._top_only():
            return sequence_logprobs(self.model, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T, inputs_embeds_B_T_D=h_B_T_D,
                                     prefix_len=prefix_len)

    @contextlib.contextmanager
    def _top_only(self) -> Iterator[None]:
        """The policy with only its top blocks, renumbered from 0 for that pass (a key/value cache,
        as a shared prefix uses, counts the tokens it holds by its first layer's)."""
        inner = self.model.model
        layers = inner.layers
        top = list(layers[-self.num_layers:])
        numbered = [(m, m.layer_idx, i) for i, block in enumerate(top) for m in block.modules()
                    if isinstance(getattr(m, "layer_idx", None), int)]
        inner.layers = torch.nn.ModuleList(top)
        for m, _, i in numbered:
            m.layer_idx = i
        try:
            yield
        finally:
            inner.layers = layers
            for m, old, _ in numbered:
                m.layer_idx = old

    def check(self, micro: list[TrainSequence], ids_B_T: torch.Tensor, attn_B_T: torch.Tensor,
              mask_B_T: torch.Tensor, full_B_T: torch.Tensor, prefix_len: int = 0) -> None:
        """On the first micro-batch kept, the top-only pass must equal the full pass (else the
        cache turns off); on the first kept with a shared prefix, so must the shared top-only pass
        (else top-only passes run every row whole). Each compares like with like: the full pass ran
        with `prefix_len`, so does the top-only pass it is checked against (a shared and an unshared
        pass differ by more than the tolerance under bf16 autocast, which once turned the cache off
        on every bf16 run)."""
        if not self.enabled or not self.has(micro):
            return
        fresh, self._fresh = self._fresh, {}
        if fresh:  # `fill` kept these rows' states: they must be this full pass's, up to rounding
            worst = max(float((h.float() - self.hidden[k].float()).norm() / h.float().norm().clamp(min=1e-12))
                        for k, h in fresh.items())
            if worst > FILL_RTOL:
                log.warning("trunk states kept before the epoch differ from the full pass's (relative %.2g > %g): "
                            "every warm-start pass stays full", worst, FILL_RTOL)
                self.enabled, self.hidden, self.bytes = False, {}, 0
                return
            self.hidden.update(fresh)  # like with like below
        with torch.no_grad():
            if self.needs_check(prefix_len):
                same = torch.allclose(self.top_logprobs(micro, ids_B_T, attn_B_T, mask_B_T, prefix_len),
                                      full_B_T.detach(), atol=1e-3, rtol=0)
                if not self.checked and not same:
                    self.enabled, self.hidden, self.bytes = False, {}, 0
                    return
                self.checked = True
                if prefix_len:
                    self.share_ok = same


def sft_epoch(model: Any, optimizer: Any, rollouts: list[Rollout], pad_id: int, batch_size: int,
              micro_batch_tokens: int, grad_clip: float, rng: random.Random, on_batch=None,
              compute_dtype: torch.dtype | None = None, ranks: Ranks = Ranks(),
              trunk: TrunkCache | None = None, share_prefix: bool = False) -> list[float]:
    """One pass over the successful rollouts' segments in random order; returns the batch losses.
    On N `ranks` each trains its share of every batch's micro-batches (carl.train.ranks). With a
    `trunk` cache, micro-batches it holds run the top blocks only and the others fill it. With
    `share_prefix` (one rank), the tokens a micro-batch's sequences all start with run once
    (carl.train.prefix)."""
    share_prefix = share_prefix and ranks.world == 1  # FSDP ranks must run the same passes
    seqs = sft_sequences(rollouts)
    rng.shuffle(seqs)
    losses = []
    model.train()
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start : start + batch_size]
        total_tokens = sum(sum(s.generated_mask_T) for s in batch)
        optimizer.zero_grad(set_to_none=True)
        batch_loss = 0.0
        device = next(model.parameters()).device
        for micro in ranks.share(micro_batches(batch, micro_batch_tokens, share_prefix=share_prefix)):
            if micro is None:  # this rank has fewer micro-batches than the others
                idle_micro_batch(model, pad_id, device)
                continue
            ids_B_T, attn_B_T = (t.to(device) for t in pad_right([s.token_ids_T for s in micro], pad_id))
            mask_B_T = pad_rows([s.generated_mask_T for s in micro], ids_B_T.shape[1], torch.bool).to(device)
            P = common_prefix_len([s.token_ids_T for s in micro], [s.generated_mask_T for s in micro]) if share_prefix else 0
            P = checked_prefix_len(model, ids_B_T, attn_B_T, mask_B_T, P)  # outside the capture: its check's passes
            # the first micro-batch (and the first with a shared prefix) takes the full pass: `check` compares it
            if trunk is not None and trunk.has(micro) and not trunk.needs_check(P):
                with autocast(model, compute_dtype):
                    logprobs_B_T = trunk.top_logprobs(micro, ids_B_T, attn_B_T, mask_B_T, P if trunk.share_ok else 0)
            else:
                with autocast(model, compute_dtype):
                    with trunk.capture(micro, P) if trunk else contextlib.nullcontext():
                        logprobs_B_T = sequence_logprobs(model, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T, prefix_len=P)
                    if trunk is not None:
                        trunk.check(micro, ids_B_T, attn_B_T, mask_B_T, logprobs_B_T, P)
            loss, m = sft_loss(logprobs_B_T, mask_B_T)
            loss = loss * (m["num_tokens"] / max(total_tokens, 1))  # token-weighted mean over the batch
            (loss * ranks.world).backward()  # FSDP averages gradients over ranks: this makes it their sum
            batch_loss += float(loss.detach())
        batch_loss = sum(ranks.gather(batch_loss))
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
        optimizer.step()
        losses.append(batch_loss)
        if on_batch is not None:
            on_batch(batch_loss)
    return losses
