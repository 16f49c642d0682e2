"""Sandboxes for the tool tests: a repo written from a dict, opened with the real backends."""

from __future__ import annotations

import hashlib
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from carl.sandbox import SandboxConfig, open_sandbox


def make_repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def open_test_sandbox(source: Path, backend: str = "local"):
    """A sandbox over a copy of `source` whose python (and ruff, next to it) is this venv's."""
    with warnings.catch_warnings():  # the local backend warns that it isolates nothing; we know
        warnings.simplefilter("ignore")
        return open_sandbox(str(source), SandboxConfig(backend=backend, timeout_s=30, python_env=sys.prefix))


class HashingEmbedder:
    """Deterministic bag-of-words embedder: each word hashes to one of 256 dimensions."""

    name = "test-hashing-256"
    dim = 256

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def embed(self, texts):
        self.embedded += list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
