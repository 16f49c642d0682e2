"""Policies: token-level Hugging Face models (hf.py, batching.py) and the SmolLM2 default (smollm2.py)."""
