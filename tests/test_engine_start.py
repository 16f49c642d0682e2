"""carl train starts a vLLM server on a thread as the warm start begins, and always stops it."""

import dataclasses
import signal
import threading

import pytest
from rich.console import Console

import carl.engine.vllm_server as vllm_server
import carl.train.loop as loop
from carl.train.config import TrainConfig
from carl.train.progress import RunProgress


class FakeEngine:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def _config(kind: str) -> TrainConfig:
    cfg = TrainConfig()
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kind=kind))


@pytest.fixture
def opened(monkeypatch):
    """open_engine replaced: records the thread it ran on; `release` lets a start finish."""
    calls = {"threads": [], "release": threading.Event(), "started": threading.Event(), "error": None}
    calls["release"].set()

    def open_engine(cfg, model_path, run_dir, log):
        calls["threads"].append(threading.current_thread().name)
        calls["started"].set()
        calls["release"].wait(10)
        if calls["error"] is not None:
            raise calls["error"]
        return FakeEngine(), "store"

    monkeypatch.setattr(loop, "open_engine", open_engine)
    monkeypatch.setattr(vllm_server, "_PREVIOUS", {})
    previous = signal.getsignal(signal.SIGTERM)
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_a_vllm_server_starts_on_a_thread_before_it_is_needed_and_is_stopped_once(opened, tmp_path):
    opened["release"].clear()
    start = loop.EngineStart(_config("vllm"), tmp_path, tmp_path, Console())
    assert opened["started"].wait(10)  # started before anyone asked for it
    assert opened["threads"] == ["carl-engine-start"]
    assert signal.getsignal(signal.SIGTERM) is vllm_server._on_sigterm  # set from the main thread
    opened["release"].set()
    with RunProgress(Console()) as progress:
        engine, store = start.get(progress)
        assert start.get(progress)[0] is engine  # one engine, however often asked
    assert store == "store" and engine.closed == 0
    start.close()
    start.close()
    assert engine.closed == 1


def test_a_run_that_fails_before_the_engine_is_needed_still_stops_it(opened, tmp_path):
    opened["release"].clear()
    start = loop.EngineStart(_config("vllm"), tmp_path, tmp_path, Console(record=True))
    assert opened["started"].wait(10)
    threading.Timer(0.2, opened["release"].set).start()
    start.close()  # waits for the start in progress, then stops the server
    assert start._engine is None and len(opened["threads"]) == 1


def test_a_failed_start_is_raised_where_the_engine_is_needed(opened, tmp_path):
    opened["error"] = vllm_server.EngineError("the vLLM server exited with code 1 while starting")
    start = loop.EngineStart(_config("vllm"), tmp_path, tmp_path, Console())
    with RunProgress(Console()) as progress, pytest.raises(vllm_server.EngineError, match="exited with code 1"):
        start.get(progress)
    start.close()


def test_the_in_process_engine_is_made_when_asked_for_on_the_run_thread(opened, tmp_path):
    start = loop.EngineStart(_config("hf"), tmp_path, tmp_path, Console())
    assert opened["threads"] == []  # nothing may draw from the trainer's random state meanwhile
    with RunProgress(Console()) as progress:
        engine, _ = start.get(progress)
    assert opened["threads"] == [threading.current_thread().name]
    start.close()
    assert engine.closed == 1
