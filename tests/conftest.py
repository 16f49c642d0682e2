"""Markers: `slow` runs only with CARL_SLOW=1; `gpu` only when CUDA is present."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    run_slow = os.environ.get("CARL_SLOW") == "1"
    has_gpu = _has_cuda()
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: set CARL_SLOW=1 to run"))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device"))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
