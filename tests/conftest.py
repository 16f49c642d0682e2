"""Markers: `slow` runs only with CARL_SLOW=1; `gpu` only when CUDA is present; `vllm` only when
vLLM's environment is built (`carl engine setup`), or always with CARL_REQUIRE_VLLM=1 (`make test`
and CI set it, so a missing environment fails there instead of skipping)."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    run_slow = os.environ.get("CARL_SLOW") == "1"
    has_gpu = _has_cuda()
    has_vllm = os.environ.get("CARL_REQUIRE_VLLM") == "1" or _has_vllm()
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: set CARL_SLOW=1 to run"))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device"))
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(pytest.mark.skip(reason="vllm: no vLLM environment (run `carl engine setup`)"))
    heaviest_files_first(items)


# What a test starts, in rough seconds on 2 cores; tests that start none count ~0.
HEAVY = {"vllm": 20.0, "distributed": 20.0, "one_task": 10.0}


def heaviest_files_first(items) -> None:
    """Order the test files by what their tests start (a vLLM server, torch ranks, a tiny `carl
    train` run), heaviest first; tests keep their order within a file. `make test` hands one file
    at a time to each pytest-xdist worker in this order, so the long files start first instead of
    one of them running alone at the end (longest-first list scheduling)."""
    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    cost: dict[str, float] = {}
    for item in items:
        if not item.get_closest_marker("skip"):
            c = sum(w for name, w in HEAVY.items() if item.get_closest_marker(name) or name in item.fixturenames)
            cost[file_of(item)] = cost.get(file_of(item), 0.0) + c
    items.sort(key=lambda item: -cost.get(file_of(item), 0.0))  # stable: ties keep their order


@pytest.fixture(scope="session")
def one_task(tmp_path_factory):
    """One validated micro task (tests/tiny_run.py), built once for every tiny `carl train` run;
    the runs only read it."""
    from tiny_run import one_micro_task

    return one_micro_task(tmp_path_factory.mktemp("micro"))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _has_vllm() -> bool:
    from carl.engine.vllm_env import built_venv

    return built_venv() is not None
