"""How many cores a CPU vLLM server's worker gets (carl.engine.vllm_server.cpu_binding)."""

import os

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

    seen = {}

    def launch(argv, env, **kw):
        seen.update(env)
        raise RuntimeError("stop here")

    monkeypatch.setattr(server, "_launch", launch)
    monkeypatch.setattr(server, "vllm_python", lambda log: tmp_path / "python")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for environ, threads, want in ((None, 0, "0"), ("2", 0, "2")):
        if environ is None:
            monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
        else:
            monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", environ)
        seen.clear()
        s = server.VLLMServer(server.ServerSpec(model=str(tmp_path), cpu_threads=threads), tmp_path / "vllm.log")
        try:
            s.start()
        except RuntimeError:
            pass
        assert seen["VLLM_CPU_NUM_OF_RESERVED_CPU"] == want
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    seen.clear()
    try:
        server.VLLMServer(server.ServerSpec(model=str(tmp_path), cpu_threads=2), tmp_path / "vllm.log").start()
    except RuntimeError:
        pass
    assert seen["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
