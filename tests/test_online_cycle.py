"""`carl online` end to end on a tiny random model: `carl serve` (HFEngine following a weights dir)
driven over HTTP by simulated users; a cycle trains a candidate on the stored token-exact
sessions, gates it (held-out bench + production replay, paired) and hot-swaps it in; bad live
signals after the deploy roll it back; a killed loop continues from its state. The decision rules
themselves are checked on constructed inputs."""

import socket
import threading
import time

import pytest
import torch
from tiny_hf import save_tiny_model

from carl.engine.hf import HFEngine, HFEngineConfig, load_model
from carl.harness.agent import EpisodeLimits
from carl.online.client import ServeClient
from carl.online.cycle import (
    GateConfig,
    OnlineConfig,
    OnlineLoop,
    RollbackConfig,
    gate_decision,
    kept,
    paired_binary,
    rollback_decision,
    settled,
)
from carl.online.service import ServeConfig, Service, create_app
from carl.online.signals import SignalWeights
from carl.online.simulate import act, provision
from carl.online.store import StoreConfig
from carl.sandbox.base import SandboxConfig
from carl.train.config import RLConfig

SANDBOX = SandboxConfig(backend="local")
LIMITS = ["limits.max_turns=2", "limits.max_new_tokens=24", "limits.context_budget_tokens=4096",
          "model.dtype=float32", "model.trainable_layers=2", "tools=['read_file','edit_file','finish']",
          "sandbox.backend=local", "rollout.concurrency=4"]


def test_the_gate_blocks_a_regression_beyond_its_noise_and_passes_noise():
    assert gate_decision({"diff": -0.05, "se": 0.1}, None, z=1.0)["pass"]  # within noise
    blocked = gate_decision({"diff": -0.3, "se": 0.1}, None, z=1.0)
    assert not blocked["pass"] and "bench pass@1 fell by 0.300" in blocked["reasons"][0]
    assert not gate_decision({"diff": -0.1, "se": 0.0}, None, z=1.0)["pass"]  # no noise: any fall counts
    assert not gate_decision({"diff": 0.0, "se": 0.0}, {"diff": 0.5, "se": 0.1}, z=1.0)["pass"]  # replay flags rose
    assert gate_decision({"diff": 0.2, "se": 0.1}, {"diff": -0.2, "se": 0.1}, z=1.0)["pass"]


def test_rollback_waits_for_enough_live_requests_then_compares_kept_rates():
    cfg = RollbackConfig(min_requests=4, z=1.0)
    assert not rollback_decision([False] * 3, [True] * 4, cfg)["rollback"]  # too few yet
    assert rollback_decision([False] * 4, [True] * 3 + [False], cfg)["rollback"]
    assert not rollback_decision([True, False] * 2, [True, False, True, True], cfg)["rollback"]  # within noise
    assert not rollback_decision([False] * 8, [], cfg)["rollback"]  # nothing to go back to


def test_paired_differences_and_kept_verdicts():
    d = paired_binary([True, False, False, True], [True, True, False, True])
    assert d["diff"] == 0.25 and abs(d["se"] - 0.25) < 1e-12  # sd 0.5 of (0, 1, 0, 0), / sqrt 4
    assert kept({"signals": [{"kind": "kept", "value": 1.0}, {"kind": "reverted", "value": 1.0}]}) is False
    assert kept({"signals": [{"kind": "thumbs", "value": 1.0}]}) is None


def test_a_cycle_waits_for_requests_still_waiting_for_their_signals():
    now = 1000.0
    reqs = [{"id": 1, "finished_at": 0.0, "signals": [{"kind": "kept", "value": 1.0}], "edits": "x", "trajectory": {}},
            {"id": 2, "finished_at": 990.0, "signals": [], "edits": "x", "trajectory": {}},
            {"id": 3, "finished_at": 990.0, "signals": [{"kind": "kept", "value": 1.0}], "edits": "x", "trajectory": {}}]
    assert [r["id"] for r in settled(reqs, SignalWeights(), wait_s=60, now=now)] == [1]
    assert [r["id"] for r in settled(reqs, SignalWeights(), wait_s=5, now=now)] == [1, 2, 3]  # passed by


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from carl.micro.world import build_micro_tasks

    out = tmp_path_factory.mktemp("micro")
    tasks = build_micro_tasks(out, seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=2, backend="local")["eval"]
    return tasks, out / "eval.jsonl", save_tiny_model(tmp_path_factory.mktemp("tiny"), head_dim=64)


def test_serve_train_gate_deploy_then_roll_back_on_bad_live_signals(world, tmp_path, monkeypatch):
    import uvicorn

    tasks, eval_file, model = world
    torch.manual_seed(0)
    users, admin = provision(tasks, ["alice", "bob"], tmp_path / "ws", tmp_path / "users", tmp_path / "home")
    store = StoreConfig(url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    engine = HFEngine(HFEngineConfig(path=str(model), dtype="float32", temperature=1.0), weights_dir=tmp_path / "weights")
    service = Service(ServeConfig(workspaces=str(tmp_path / "ws"), state_dir=str(tmp_path / "state"),
                                  users_file=str(tmp_path / "users"), store=store, sandbox=SANDBOX,
                                  limits=EpisodeLimits(max_turns=2, max_new_tokens=24, context_budget_tokens=4096)),
                      engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("CARL_ONLINE_TOKEN", admin)
    cfg = OnlineConfig(base=str(model), weights_dir=str(tmp_path / "weights"), run_dir=str(tmp_path / "online"),
                       serve_url=url, workspaces=str(tmp_path / "ws"), store=store, min_requests=4, baseline="batch",
                       rl=RLConfig(steps=1, lr=1e-3), train_overrides=tuple(LIMITS),
                       gate=GateConfig(eval_tasks=str(eval_file), samples_per_task=1, replay_requests=2),
                       rollback=RollbackConfig(min_requests=4), signal_wait_s=0.0, cycles=1, cadence_s=0)

    clients = {u.name: ServeClient(url, u.token) for u in users}

    def traffic():
        return [(clients[u.name], act(u, clients[u.name], t, SANDBOX)) for u in users for t in tasks]

    try:
        served = traffic()  # a random model: every edit reverted (or none made)
        assert [o["model_version"] for _, o in served] == [0] * 4 and not any(o["passed"] for _, o in served)
        client, first = served[0]  # one user liked what they saw anyway
        client.signal(first["session"], first["request"], "thumbs", value=1)

        loop = OnlineLoop(cfg, log=lambda m: None)
        report = loop.run_cycle()
        assert report["decision"] == "deployed", report["why"]
        assert report["data"]["trained"] == 4 and report["data"]["reward_std"] > 0
        assert report["gate"]["bench"]["n"] == len(tasks) and report["gate"]["replay"]["n"] == 2
        assert report["train"]["rl/num_sequences"] >= 4
        assert engine.policy_version == 1  # hot-swapped through POST /v1/admin/deploy
        _, trained = load_model(tmp_path / "online" / "models" / "v000001", torch.float32)
        assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), engine.model.state_dict().values()))

        after = traffic()  # served by v1 and all reverted, while the users now keep what v0 did
        assert [o["model_version"] for _, o in after] == [1] * 4
        for client, o in served:
            client.signal(o["session"], o["request"], "kept", value=1.0)
        loop.close()
        loop = OnlineLoop(cfg, log=lambda m: None)  # a restarted `carl online` continues from state.json
        report = loop.run_cycle()
        assert report["cycle"] == 2 and report["decision"] == "rollback", report
        assert report["rollback"]["live_kept"] == 0.0 and report["rollback"]["previous_kept"] == 1.0
        assert engine.policy_version == 2  # v0's weights again, under a new number
        _, base = load_model(model, torch.float32)
        assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), engine.model.state_dict().values()))
        assert loop.run_cycle()["decision"] == "wait"  # nothing served by the restored version yet
        assert sorted(p.name for p in (tmp_path / "online" / "cycles").iterdir()) == [
            "cycle_0001.json", "cycle_0002.json", "cycle_0003.json"]
        assert (tmp_path / "online" / "plots" / "kept_rate.png").stat().st_size > 0
        loop.close()
    finally:
        for c in clients.values():
            c.close()
        server.should_exit = True
        service.close()
        engine.close()
