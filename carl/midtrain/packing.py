"""Documents -> token streams -> fixed-length rows: tokenize, mix in general data, pack, save/load.

Legend: N = tokens in a stream, D = documents in it, B = rows, T = data.seq_len.

    a document's tokens = [eos] + tokens("# <source>/<path>\\n" + text)
    stream_N            = the documents' tokens one after the other (training: seeded order)
    row i               = stream_N[i*T : i*T + T + 1]: inputs its first T tokens, targets its last T
                          (rows overlap by one token, so every token but the stream's first is a
                          target exactly once; the last row is padded, its pads have no target)

Document boundaries: each document starts with the tokenizer's eos token, and position ids restart
at 0 there (and at the start of each row). Given position ids and no attention mask, transformers
attends within runs of consecutive positions only (masking_utils.find_packed_sequence_indices):
a token never sees another document, so a packed row computes what each document alone would.
The leading eos is predicted from the end of the previous document (the model learns where files
end), and it predicts the document's first token (how files begin). A target counts towards the
document of the token that predicts it: a file's loss covers its own tokens and its end.

General data: the general files not held out, in a fixed seeded order, are added until their
tokens reach share / (1 - share) of the trained sources' training tokens (within one file).
Held-out documents are evaluated up to a token budget per source (`within`: whole files in hash
order, skipping any that would pass it).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carl.config import to_toml
from carl.io import atomic_write_bytes, atomic_write_json
from carl.midtrain.config import DataConfig
from carl.midtrain.data import Collection, Document, hash_order

IGNORE = -100  # a position without a target


@dataclass(frozen=True)
class PackedStream:
    tokens_N: np.ndarray
    """int32 token ids of every document, one after the other."""
    starts_D: np.ndarray
    """int64 offset of each document's first token in tokens_N (ascending, the first is 0)."""

    def num_rows(self, seq_len: int) -> int:
        return math.ceil((len(self.tokens_N) - 1) / seq_len) if len(self.tokens_N) > 1 else 0


@dataclass(frozen=True)
class Rows:
    """A batch of packed rows, as tensors."""

    input_ids_B_T: torch.Tensor
    targets_B_T: torch.Tensor
    """The next token of each input position; IGNORE where there is none (the last row's padding)."""
    position_ids_B_T: torch.Tensor
    """0 at each document start and each row start, +1 per token otherwise."""
    docs_B_T: torch.Tensor
    """Index (into the stream's documents) of the document each target counts towards; -1 for none."""


def pack(token_lists: list[list[int]]) -> PackedStream:
    lengths = np.array([len(t) for t in token_lists], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
    tokens = np.fromiter((t for ids in token_lists for t in ids), dtype=np.int32, count=int(lengths.sum()))
    return PackedStream(tokens, starts)


def make_rows(stream: PackedStream, row_ids: list[int], seq_len: int, pad_id: int) -> Rows:
    """The rows `row_ids` of `stream` (see the module docstring)."""
    B, T, N = len(row_ids), seq_len, len(stream.tokens_N)
    inputs = np.full((B, T), pad_id, dtype=np.int64)
    targets = np.full((B, T), IGNORE, dtype=np.int64)
    positions = np.zeros((B, T), dtype=np.int64)
    docs = np.full((B, T), -1, dtype=np.int64)
    for b, i in enumerate(row_ids):
        lo, hi = i * T, min(i * T + T + 1, N)  # the row's tokens: inputs [lo, hi - 1), targets [lo + 1, hi)
        n = hi - lo - 1
        inputs[b, :n] = stream.tokens_N[lo : hi - 1]
        targets[b, :n] = stream.tokens_N[lo + 1 : hi]
        doc = np.searchsorted(stream.starts_D, np.arange(lo, lo + T), side="right") - 1
        docs[b, :n] = doc[:n]
        segment_start = np.maximum(stream.starts_D[doc], lo)  # padding continues the last document
        positions[b] = np.arange(lo, lo + T) - segment_start
    return Rows(*(torch.from_numpy(a) for a in (inputs, targets, positions, docs)))


def step_rows(step: int, batch_size: int, num_rows: int, seed: int) -> list[int]:
    """The training rows of optimizer step `step` (0-based): rows are drawn without replacement in a
    fresh seeded order each epoch, so the rows of a step depend on the step alone (exact resume)."""
    orders: dict[int, np.ndarray] = {}  # epoch -> its row order
    out = []
    for g in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(g, num_rows)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([seed, 2, epoch]).permutation(num_rows)
        out.append(int(orders[epoch][i]))
    return out


def tokenize(docs: list[Document], tokenizer: Any, log: Callable[[str], None], what: str) -> list[list[int]]:
    """[eos] + tokens of each document's header and text; a progress line every 10 s."""
    sep = tokenizer.eos_token_id
    if sep is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos token to separate documents")
    out: list[list[int]] = []
    t0 = last = time.monotonic()
    for start in range(0, len(docs), 32):
        texts = [f"# {d.key}\n{d.text}" for d in docs[start : start + 32]]
        out += [[sep] + ids for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]
        if time.monotonic() - last > 10:
            last = time.monotonic()
            log(f"  tokenizing {what}: {len(out)}/{len(docs)} files, {sum(map(len, out)):,} tokens")
    if docs:
        log(f"  tokenized {what}: {len(docs)} files, {sum(map(len, out)):,} tokens ({time.monotonic() - t0:.1f} s)")
    return out


def tokenized(docs: list[Document], tokenizer: Any) -> Iterator[tuple[Document, list[int]]]:
    """(document, its tokens) in order, tokenized 32 at a time as they are asked for."""
    for start in range(0, len(docs), 32):
        chunk = docs[start : start + 32]
        yield from zip(chunk, tokenize(chunk, tokenizer, lambda _: None, ""))


def fill(docs: list[Document], tokenizer: Any, need: int) -> tuple[list[Document], list[list[int]]]:
    """Documents from the front of `docs` until their tokens reach `need` (or `docs` ends)."""
    taken: list[tuple[Document, list[int]]] = []
    total = 0
    for doc, ids in tokenized(docs, tokenizer):
        if total >= need:
            break
        taken.append((doc, ids))
        total += len(ids)
    return [d for d, _ in taken], [t for _, t in taken]


def within(docs: list[Document], tokenizer: Any, budget: int) -> tuple[list[Document], list[list[int]]]:
    """The documents of `docs`, in order, that fit into `budget` tokens together: one that would
    pass it is skipped and later ones are still tried (0 = all). When none fits, the smallest one."""
    taken: list[tuple[Document, list[int]]] = []
    total, smallest = 0, None
    for doc, ids in tokenized(docs, tokenizer):
        if not budget or total + len(ids) <= budget:
            taken.append((doc, ids))
            total += len(ids)
        if smallest is None or len(ids) < len(smallest[1]):
            smallest = (doc, ids)
    taken = taken or ([smallest] if smallest else [])
    return [d for d, _ in taken], [t for _, t in taken]


@dataclass(frozen=True)
class Dataset:
    train: PackedStream
    heldout: PackedStream
    heldout_docs: list[dict[str, str]]
    """{"source", "path", "group"} of each held-out document, in stream order."""
    train_files: list[str]
    """"source/path" of each training document, in stream order."""
    summary: dict[str, Any]
    """Files and tokens per source and split, files dropped per reason, the general-data share."""


def build_dataset(collection: Collection, cfg: DataConfig, seed: int, tokenizer: Any,
                  log: Callable[[str], None]) -> Dataset:
    """Tokenize the collection's documents, add general data to its share, and pack both streams."""
    train_docs = [d for d in collection.docs if d.group == "trained" and not d.heldout]
    train_tokens = tokenize(train_docs, tokenizer, log, "training files of the trained sources")
    team_total = sum(map(len, train_tokens))
    general_pool = hash_order([d for d in collection.docs if d.group == "general" and not d.heldout], seed)
    if cfg.general.share > 0:
        need = math.ceil(cfg.general.share / (1 - cfg.general.share) * team_total)
        general, general_tokens = fill(general_pool, tokenizer, need)
        log(f"  general training files: {len(general)} files, {sum(map(len, general_tokens)):,} tokens "
            f"(wanted {need:,} for share {cfg.general.share})")
        train_docs, train_tokens = train_docs + general, train_tokens + general_tokens
    order = np.random.default_rng([seed, 1]).permutation(len(train_docs))
    train = pack([train_tokens[i] for i in order])

    heldout_docs: list[Document] = []
    heldout_tokens: list[list[int]] = []
    for source in dict.fromkeys(d.source for d in collection.docs):  # sources in config order, general last
        docs = hash_order([d for d in collection.docs if d.source == source and d.heldout], seed)
        general = source == "general"
        budget = cfg.general.heldout_tokens if general else cfg.max_heldout_tokens
        if not docs or (general and budget == 0):  # for general data 0 means none, not all
            continue
        taken, tokens = within(docs, tokenizer, budget)
        log(f"  held-out files of {source}: {len(taken)} of {len(docs)} evaluated, {sum(map(len, tokens)):,} tokens")
        heldout_docs += taken
        heldout_tokens += tokens
    summary = {
        "train_tokens": int(len(train.tokens_N)),
        "general_train_tokens": int(len(train.tokens_N)) - team_total,
        "general_share": (len(train.tokens_N) - team_total) / max(1, len(train.tokens_N)),
        "heldout_tokens": int(sum(map(len, heldout_tokens))),
        "sources": _per_source(collection, list(zip(train_docs, train_tokens)), list(zip(heldout_docs, heldout_tokens))),
        "general_root": collection.general_root,
    }
    log(f"training stream: {summary['train_tokens']:,} tokens ({summary['general_share']:.1%} general); "
        f"held-out: {summary['heldout_tokens']:,} tokens in {len(heldout_docs)} files")
    return Dataset(train, pack(heldout_tokens), [{"source": d.source, "path": d.path, "group": d.group}
                                                 for d in heldout_docs], [train_docs[i].key for i in order], summary)


def _per_source(collection: Collection, trained: list[tuple[Document, list[int]]],
                evaluated: list[tuple[Document, list[int]]]) -> dict[str, dict[str, Any]]:
    """Per source: files kept (after filters and deduplication) and held out, files and tokens
    trained on and evaluated, files dropped by reason."""
    out: dict[str, dict[str, Any]] = {}
    for d in collection.docs:
        s = out.setdefault(d.source, {"group": d.group, "kept_files": 0, "heldout_files": 0, "trained_files": 0,
                                      "trained_tokens": 0, "evaluated_files": 0, "evaluated_tokens": 0,
                                      "dropped": dict(collection.dropped.get(d.source, {}))})
        s["kept_files"] += 1
        s["heldout_files"] += d.heldout
    for what, pairs in (("trained", trained), ("evaluated", evaluated)):
        for d, ids in pairs:
            out[d.source][f"{what}_files"] += 1
            out[d.source][f"{what}_tokens"] += len(ids)
    return out


# ---------------------------------------------------------------- a run's prepared data on disk


def fingerprint(cfg: DataConfig, seed: int, tokenizer: Any) -> str:
    """What the prepared data depends on: the data config, the seed and the tokenizer's vocabulary."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    text = to_toml(cfg) + f"\nseed = {seed}\n" + hashlib.sha256(vocab).hexdigest()
    return hashlib.sha256(text.encode()).hexdigest()


def save_dataset(data: Dataset, data_dir: Path, fingerprint: str) -> None:
    """The streams as .npy files, then manifest.json (written last: the data is complete once it exists)."""
    for name, stream in (("train", data.train), ("heldout", data.heldout)):
        for part, array in (("tokens", stream.tokens_N), ("starts", stream.starts_D)):
            buf = io.BytesIO()
            np.save(buf, array)
            atomic_write_bytes(data_dir / f"{name}_{part}.npy", buf.getvalue())
    atomic_write_json(data_dir / "manifest.json", {"fingerprint": fingerprint, "summary": data.summary,
                                                   "heldout_docs": data.heldout_docs, "train_files": data.train_files})


def load_dataset(data_dir: Path) -> tuple[Dataset, str] | None:
    """(the prepared data, its fingerprint), or None when `data_dir` holds no complete data."""
    if not (data_dir / "manifest.json").is_file():
        return None
    manifest = json.loads((data_dir / "manifest.json").read_text())
    streams = [PackedStream(np.load(data_dir / f"{name}_tokens.npy"), np.load(data_dir / f"{name}_starts.npy"))
               for name in ("train", "heldout")]
    return Dataset(*streams, manifest["heldout_docs"], manifest["train_files"], manifest["summary"]), \
        manifest["fingerprint"]

