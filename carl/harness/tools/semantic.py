"""semantic_search: find code by meaning with an embedding index of the repository.

    files (via the Sandbox) --content hash--> chunks --chunk hash--> vectors --cosine--> top k

- Python files are chunked by top-level function and class with `ast` (a long class is split into
  its header and its methods; module-level statements between definitions become line windows).
  Files that do not parse, and other text files, are cut into overlapping line windows.
- Every query re-reads the workspace through the sandbox, so edits are always seen. Nothing is
  re-done for unchanged content: chunks are cached by file content hash, vectors by chunk text
  hash, in memory and on disk (SQLite under the user's cache dir, shared by processes). After an
  edit only the chunks whose text changed are embedded again. The index therefore needs no
  per-sandbox state and is shared by all episodes of a process.
- What it does not do: files over `MAX_FILE_BYTES`, binary files, hidden and noise directories
  (.git, .venv, __pycache__, ...) are not indexed; a chunk longer than the embedder's input
  (256 word pieces for MiniLM) is embedded from its beginning only.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.harness.tools.embedder import Embedder, default_embedder
from carl.harness.tools.search import NOISE_DIRS
from carl.sandbox.base import Sandbox
from carl import pyast

MAX_FILE_BYTES = 200_000
MAX_FILES = 5000
WINDOW_LINES, WINDOW_STEP = 40, 30  # line windows overlap by 10 lines
MAX_CLASS_LINES = 60  # a longer class is split into header + methods
PREVIEW_LINES = 8
MAX_CACHED_FILES = 50_000  # chunked file versions kept in memory
MAX_MEMORY_VECTORS = 200_000  # ~300 MB of 384-d float32; the oldest are dropped past this


@dataclass(frozen=True)
class Chunk:
    path: str
    start_line: int  # 1-based, inclusive
    end_line: int
    label: str  # "def f", "class C", "class C / def m", "lines 1-40"
    text: str

    @property
    def embed_text(self) -> str:
        """What gets embedded: where the chunk lives and what it is, then its code."""
        return f"{self.path} {self.label}\n{self.text}"

    @property
    def key(self) -> str:
        return hashlib.sha256(self.embed_text.encode()).hexdigest()


# --------------------------------------------------------------------------- chunking


def chunk_file(path: str, text: str) -> list[Chunk]:
    lines = text.splitlines()
    if path.endswith(".py"):
        try:
            tree = pyast.parse(text)
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            return _python_chunks(path, lines, tree)
    return _windows(path, lines, 1, len(lines))


def _python_chunks(path: str, lines: list[str], tree: ast.Module) -> list[Chunk]:
    chunks: list[Chunk] = []
    loose_start = 1  # first line of module-level code not yet in a chunk
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        end = node.end_lineno or node.lineno
        chunks += _windows(path, lines, loose_start, start - 1)
        loose_start = end + 1
        if isinstance(node, ast.ClassDef):
            chunks += _class_chunks(path, lines, node, start, end)
        else:
            chunks.append(_chunk(path, lines, start, end, f"def {node.name}"))
    chunks += _windows(path, lines, loose_start, len(lines))
    return chunks


def _class_chunks(path: str, lines: list[str], node: ast.ClassDef, start: int, end: int) -> list[Chunk]:
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if end - start + 1 <= MAX_CLASS_LINES or not methods:
        return [_chunk(path, lines, start, end, f"class {node.name}")]
    first_method = min([methods[0].lineno] + [d.lineno for d in methods[0].decorator_list])
    out = [_chunk(path, lines, start, first_method - 1, f"class {node.name}")]
    for m in methods:
        m_start = min([m.lineno] + [d.lineno for d in m.decorator_list])
        out.append(
            _chunk(path, lines, m_start, m.end_lineno or m.lineno, f"class {node.name} / def {m.name}")
        )
    return [c for c in out if c.text.strip()]


def _windows(path: str, lines: list[str], first: int, last: int) -> list[Chunk]:
    out = []
    for start in range(first, last + 1, WINDOW_STEP):
        end = min(start + WINDOW_LINES - 1, last)
        chunk = _chunk(path, lines, start, end, None)
        if chunk.text.strip():
            out.append(chunk)
        if end == last:
            break
    return out


def _chunk(path: str, lines: list[str], start: int, end: int, label: str | None) -> Chunk:
    """Lines start..end without blank lines at either end; label None means "lines a-b"."""
    while start < end and not lines[start - 1].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return Chunk(path, start, end, label or f"lines {start}-{end}", "\n".join(lines[start - 1 : end]))


# --------------------------------------------------------------------------- vector cache


def default_cache_dir() -> Path:
    root = os.environ.get("CARL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "carl"
    )
    return Path(root) / "semantic"


class VectorCache:
    """chunk key -> embedding, in memory and in one SQLite file per directory (safe across threads
    and processes; SQLite does the locking)."""

    def __init__(self, embedder: Embedder, cache_dir: str | Path | None = None) -> None:
        self.embedder = embedder
        self.db_path = Path(cache_dir or default_cache_dir()) / "embeddings.sqlite"
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._memory: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (model TEXT, key TEXT, vec BLOB, PRIMARY KEY (model, key))"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=30)

    def get(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """Vectors [len(chunks), dim] for `chunks`, embedding only those never seen before."""
        keys = [c.key for c in chunks]
        with self._lock:
            missing = sorted({k for k in keys if k not in self._memory})
        if missing:
            self._load_from_disk(missing)
            with self._lock:
                missing = [k for k in missing if k not in self._memory]
        if missing:
            by_key = {c.key: c for c in chunks}
            vecs = np.asarray(self.embedder.embed([by_key[k].embed_text for k in missing]), dtype=np.float32)
            with self._connect() as db:
                db.executemany(
                    "INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                    [(self.embedder.name, k, v.tobytes()) for k, v in zip(missing, vecs)],
                )
            with self._lock:
                self._remember(dict(zip(missing, vecs)))
        with self._lock:
            if not keys:
                return np.zeros((0, self.embedder.dim), dtype=np.float32)
            return np.stack([self._memory[k] for k in keys])

    def _load_from_disk(self, keys: list[str]) -> None:
        found = {}
        with self._connect() as db:
            for i in range(0, len(keys), 500):  # SQLite caps the number of bound variables
                part = keys[i : i + 500]
                rows = db.execute(
                    f"SELECT key, vec FROM vectors WHERE model = ? AND key IN ({','.join('?' * len(part))})",
                    [self.embedder.name, *part],
                )
                found.update({k: np.frombuffer(v, dtype=np.float32) for k, v in rows})
        with self._lock:
            self._remember(found)

    def _remember(self, vectors: dict[str, np.ndarray]) -> None:
        self._memory.update(vectors)
        for k in list(self._memory)[: max(len(self._memory) - MAX_MEMORY_VECTORS, 0)]:
            del self._memory[k]


# --------------------------------------------------------------------------- index and tool


class SemanticIndex:
    """Chunks of the workspace's text files, re-read on every query (see module docstring)."""

    def __init__(self, vectors: VectorCache) -> None:
        self.vectors = vectors
        self._chunks_by_file: dict[str, list[Chunk]] = {}  # sha256(path + content) -> chunks
        self._lock = threading.Lock()

    def chunks(self, sandbox: Sandbox) -> list[Chunk]:
        out = []
        entries = [
            e for e in sandbox.list_files(".", recursive=True) if not e.is_dir and _indexable(e.path, e.size)
        ]
        for entry in sorted(entries, key=lambda e: e.path)[:MAX_FILES]:
            data = sandbox.read_file(entry.path)
            if b"\0" in data[:8192]:
                continue
            key = hashlib.sha256(entry.path.encode() + b"\0" + data).hexdigest()
            with self._lock:
                cached = self._chunks_by_file.get(key)
            if cached is None:
                cached = chunk_file(entry.path, data.decode("utf-8", errors="replace"))
                with self._lock:
                    if len(self._chunks_by_file) >= MAX_CACHED_FILES:  # long runs over many repos
                        self._chunks_by_file.clear()
                    self._chunks_by_file[key] = cached
            out += cached
        return out

    def search(self, sandbox: Sandbox, query: str, k: int) -> list[tuple[Chunk, float]]:
        chunks = self.chunks(sandbox)
        if not chunks:
            return []
        vecs_N_D = self.vectors.get(chunks)
        query_D = np.asarray(self.vectors.embedder.embed([query]), dtype=np.float32)[0]
        scores_N = vecs_N_D @ query_D
        top = np.argsort(-scores_N, kind="stable")[:k]
        return [(chunks[i], float(scores_N[i])) for i in top]


def _indexable(path: str, size: int) -> bool:
    parts = path.split("/")
    return size <= MAX_FILE_BYTES and not any(p in NOISE_DIRS or p.startswith(".") for p in parts)


class SemanticSearch:
    def __init__(
        self, embedder: Embedder | None = None, cache_dir: str | Path | None = None, default_k: int = 8
    ) -> None:
        self._embedder = embedder
        self._cache_dir = cache_dir
        self._index: SemanticIndex | None = None
        self._lock = threading.Lock()
        self.default_k = default_k
        self.spec = ToolSpec(
            name="semantic_search",
            description=(
                "Find the code most related to a natural-language query (an embedding index "
                "of functions, classes and text files); shows the best matches with a preview."
            ),
            params=(
                ParamSpec("query", "str", "what you are looking for, e.g. 'where the config file is parsed'"),
                ParamSpec("k", "int", "number of results", required=False, default=default_k),
            ),
        )

    @property
    def index(self) -> SemanticIndex:
        with self._lock:  # built on first use: the default embedder loads torch (see embedder.py)
            if self._index is None:
                if self._embedder is None:
                    self._embedder = default_embedder()
                self._index = SemanticIndex(VectorCache(self._embedder, self._cache_dir))
            return self._index

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        query, k = params["query"].strip(), params.get("k", self.default_k)
        if not query:
            raise ToolFailure("<query> is empty")
        if not 1 <= k <= 50:
            raise ToolFailure(f"<k> must be between 1 and 50, got {k}")
        hits = self.index.search(sandbox, query, k)
        if not hits:
            return "No indexable text files in the repository."
        out = []
        for rank, (c, score) in enumerate(hits, 1):
            preview = c.text.splitlines()[:PREVIEW_LINES]
            more = c.end_line - c.start_line + 1 - len(preview)
            out.append(f"{rank}. {c.path}:{c.start_line}-{c.end_line}  {c.label}  (score {score:.3f})")
            out += [f"{c.start_line + i:6d}\t{line}" for i, line in enumerate(preview)]
            if more > 0:
                out.append(f"       [... {more} more lines]")
        return "\n".join(out)
