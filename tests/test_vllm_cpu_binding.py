"""How many cores a CPU vLLM server's worker gets (carl.engine.vllm_server.cpu_binding)."""

import os

import pytest

from carl.engine.vllm_server import SMALL_MACHINE_CPUS, cpu_binding


def test_a_small_machine_gives_the_scheduler_core_to_the_worker():
    """vLLM keeps a core for its scheduler: on 2 cores that left the model one core (measured: an
    eval 133 s with one worker thread, 109 s with two)."""
    for cpus in range(1, SMALL_MACHINE_CPUS + 1):
        assert cpu_binding(0, cpus) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def test_a_big_machine_keeps_vllms_binding_and_a_set_thread_count_binds_those_cores():
    assert cpu_binding(0, SMALL_MACHINE_CPUS + 1) == {}
    assert cpu_binding(0, 64) == {}
    assert cpu_binding(3, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0-2"}
    assert cpu_binding(3, 64) == {"VLLM_CPU_OMP_THREADS_BIND": "0-2"}


def test_the_users_environment_wins_over_the_automatic_choice(monkeypatch, tmp_path):
    """VLLMServer.start: a variable already in the environment is left as the user set it; an
    explicit engine.cpu_threads is applied."""
    import carl.engine.vllm_server as server

    def server_env(cpu_threads: int) -> dict[str, str]:
        """The environment VLLMServer.start launches the server with (the launch itself stopped)."""
        seen = {}

        def launch(argv, env, **kw):
            seen.update(env)
            raise RuntimeError("stop here")

        monkeypatch.setattr(server, "_launch", launch)
        try:
            server.VLLMServer(server.ServerSpec(model=str(tmp_path), cpu_threads=cpu_threads),
                              tmp_path / "vllm.log").start()
        except RuntimeError:
            pass
        return seen

    monkeypatch.setattr(server, "vllm_python", lambda log: tmp_path / "python")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    assert server_env(0)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "2")
    assert server_env(0)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert server_env(2)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_cpu_server_gets_small_kv_blocks_and_a_gpu_server_keeps_vllms_unless_set(monkeypatch):
    from pathlib import Path

    from carl.engine import vllm_server
    from carl.engine.config import EngineConfig
    from carl.engine.vllm_server import CPU_BLOCK_SIZE, ServerSpec

    def block(spec: ServerSpec) -> str | None:
        argv = spec.argv(Path("python"), 1)
        return argv[argv.index("--block-size") + 1] if "--block-size" in argv else None

    monkeypatch.setattr(vllm_server, "has_cuda", lambda: False)
    assert block(ServerSpec(model="m")) == str(CPU_BLOCK_SIZE) == "32"
    assert block(ServerSpec(model="m", block_size=128)) == "128"
    monkeypatch.setattr(vllm_server, "has_cuda", lambda: True)
    assert block(ServerSpec(model="m")) is None and block(ServerSpec(model="m", block_size=64)) == "64"
    with pytest.raises(ValueError, match="engine.block_size: got -1"):
        EngineConfig(block_size=-1)
    monkeypatch.setattr(vllm_server, "has_cuda", lambda: False)  # vLLM's CPU attention takes multiples of 32 only
    with pytest.raises(vllm_server.EngineError, match="engine.block_size: got 16, expected a multiple of 32 on a CPU"):
        vllm_server.VLLMServer(ServerSpec(model="m", block_size=16), "unused.log").start()


def test_carl_train_refuses_a_cpu_block_size_before_building_anything(tmp_path, monkeypatch, capsys):
    """vLLM's CPU worker dies on such a block only after loading the model, and `carl train` starts
    the engine after the world: without this check the run would fail minutes in."""
    from carl.cli import main
    from carl.engine import vllm_server

    monkeypatch.setattr(vllm_server, "has_cuda", lambda: False)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "engine.block_size=48"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("carl: engine: engine.block_size: got 48, expected a multiple of 32 on a CPU")
    assert "\n" not in err and not run.exists()
