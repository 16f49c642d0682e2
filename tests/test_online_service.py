"""`carl serve` over real HTTP (uvicorn on loopback): simulated users on micro tasks open sessions,
stream the agent's turns, apply its edits, judge them by the tests and send signals; the store
holds every session token-exact. Security: no token, a wrong token, another user's session,
workspace names that try to leave the user's folder: each refused, none reaching a sandbox or
the store. Hot weight swaps while requests run drop none of them."""

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from agent_fakes import tiny_chat_tokenizer

from carl.harness.agent import EpisodeLimits
from carl.online import service as service_module
from carl.online.client import ServeClient, ServeError
from carl.online.service import ServeConfig, Service, create_app
from carl.online.simulate import ExpertEngine, act, kept_rate, provision, workspace_name
from carl.online.store import StoreConfig
from carl.sandbox.base import SandboxConfig
from carl.types import Trajectory

SANDBOX = SandboxConfig(backend="local")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from carl.micro.world import build_micro_tasks

    out = tmp_path_factory.mktemp("micro")
    tasks = build_micro_tasks(out, seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=2, backend="local")["eval"]
    return tasks, tiny_chat_tokenizer(out / "tok")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(world, tmp_path):
    """A running `carl serve` with two users (alice, bob) and an admin, on the expert engine."""
    import uvicorn

    tasks, tokenizer = world
    users, admin_token = provision(tasks, ["alice", "bob"], tmp_path / "workspaces", tmp_path / "users",
                                   tmp_path / "home")
    config = ServeConfig(workspaces=str(tmp_path / "workspaces"), state_dir=str(tmp_path / "state"),
                         users_file=str(tmp_path / "users"), store=StoreConfig(url=f"sqlite:///{tmp_path / 'db.sqlite'}"),
                         sandbox=SANDBOX, limits=EpisodeLimits(max_turns=8, max_new_tokens=512))
    engine = ExpertEngine(tokenizer, tasks)
    service = Service(config, engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    yield {"url": url, "users": {u.name: u for u in users}, "admin": admin_token, "service": service,
           "engine": engine, "tasks": tasks, "tmp": tmp_path}
    server.should_exit = True
    thread.join(10)
    service.close()


def _client(served, name):
    return ServeClient(served["url"], served["users"][name].token)


def test_a_simulated_user_gets_the_fix_keeps_it_and_the_store_holds_it_token_exact(served):
    tasks, alice = served["tasks"], served["users"]["alice"]
    with _client(served, "alice") as client:
        outcome = act(alice, client, tasks[0], SANDBOX)
        assert outcome["passed"] and outcome["stop_reason"] == "finished" and outcome["turns"] >= 2
        stored = client.request(outcome["session"], outcome["request"])
    assert stored["stop_reason"] == "finished" and stored["edits"].startswith("--- a/")
    assert [s["kind"] for s in stored["signals"]] == ["tests", "kept"]
    assert len(stored["turns"]) == outcome["turns"]
    traj = Trajectory.from_dict(stored["trajectory"])
    gen = [t for s in traj.segments for t, m in zip(s.token_ids_T, s.generated_mask_T) if m]
    assert gen and all(len(s.token_ids_T) == len(s.logprobs_T) == len(s.generated_mask_T) for s in traj.segments)
    assert served["engine"].keys == [f"{outcome['session']}/0"]  # the request's own sampling stream
    # the session copy on the server has the fix too, the user's workspace is untouched
    repo = Path(served["tmp"]) / "state" / "sessions" / outcome["session"] / "repo"
    ws = Path(served["tmp"]) / "workspaces" / "alice" / workspace_name(tasks[0])
    changed = stored["edits"].split("\n", 1)[0].removeprefix("--- a/")
    assert (repo / changed).read_text() != (ws / changed).read_text()


def test_asking_again_after_keeping_a_fix_is_a_fresh_request(served):
    # the service's workspace stays broken; a checkout that still held the kept fix would make the
    # second patch conflict and count as reverted
    tasks, alice = served["tasks"], served["users"]["alice"]
    with _client(served, "alice") as client:
        outcomes = [act(alice, client, tasks[1], SANDBOX) for _ in range(2)]
    assert [o["passed"] for o in outcomes] == [True, True]


def test_a_lazy_model_is_reverted_with_a_followup_and_never_looks_better(served):
    tasks, bob = served["tasks"], served["users"]["bob"]
    served["engine"].lazy = True
    with _client(served, "bob") as client:
        outcomes = [act(bob, client, t, SANDBOX) for t in tasks]
        stored = [client.request(o["session"], o["request"]) for o in outcomes]
    assert not any(o["passed"] for o in outcomes) and kept_rate(outcomes) == (0.0, 0.0)
    for s in stored:
        assert [x["kind"] for x in s["signals"]] == ["tests", "reverted", "followup"]
        assert "did not change anything" in s["signals"][-1]["text"]


def test_requests_and_signals_are_checked_field_by_field(served):
    with _client(served, "alice") as client:
        sid = client.open_session(workspace_name(served["tasks"][0]))["id"]
        for text, field in (("", "text"), (None, "text"), ("x" * 20_001, "text")):
            with pytest.raises(ServeError) as e:
                list(client.ask(sid, text))
            assert e.value.status == 400 and e.value.message.startswith(field)
        done = client.run(sid, served["tasks"][0].problem_statement)
        for body, field in (({"kind": "love"}, "kind"), ({"kind": "thumbs", "value": "yes"}, "value"),
                            ({"kind": "comment", "text": 3}, "text")):
            with pytest.raises(ServeError) as e:
                client.signal(sid, done["request"], **body)
            assert e.value.status == 400 and e.value.message.startswith(field), e.value.message
        with pytest.raises(ServeError) as e:
            client.signal(sid, 7, "thumbs", value=1)
        assert e.value.status == 404


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer wrong-token", "Basic YWxpY2U6eA=="])
def test_a_missing_or_wrong_token_is_refused_before_anything_runs(served, header, monkeypatch):
    opened = []
    monkeypatch.setattr(service_module, "open_sandbox", lambda *a, **k: opened.append(a))
    headers = {"Authorization": header} if header else {}
    for method, path, body in (("GET", "/v1/sessions", None), ("POST", "/v1/sessions", {"workspace": "x"}),
                               ("POST", "/v1/sessions/abc/requests", {"text": "hi"}),
                               ("POST", "/v1/admin/deploy", {"version": 1})):
        r = httpx.request(method, served["url"] + path, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["kind"] == "auth"
    assert httpx.get(served["url"] + "/v1/health").status_code == 200  # the one open endpoint
    assert opened == [] and served["service"].store.list_sessions("alice") == []


def test_one_user_never_sees_or_touches_another_users_session(served, monkeypatch):
    with _client(served, "alice") as alice, _client(served, "bob") as bob:
        sid = alice.open_session(workspace_name(served["tasks"][0]))["id"]
        done = alice.run(sid, served["tasks"][0].problem_statement)
        opened = []
        monkeypatch.setattr(service_module, "open_sandbox", lambda *a, **k: opened.append(a))
        calls = [lambda: bob.session(sid), lambda: bob.request(sid, done["request"]),
                 lambda: list(bob.ask(sid, "delete everything")),
                 lambda: bob.signal(sid, done["request"], "thumbs", value=-1)]
        for call in calls:
            with pytest.raises(ServeError) as e:
                call()
            assert e.value.status == 404 and "no such session" in e.value.message  # as for an id that does not exist
        assert bob.sessions() == [] and [s["id"] for s in alice.sessions()] == [sid]
        assert [x["kind"] for x in alice.request(sid, done["request"])["signals"]] == []
        assert opened == []
        with pytest.raises(ServeError) as e:
            bob.deploy(3)
        assert e.value.status == 403


def test_workspace_names_cannot_leave_the_users_folder(served, monkeypatch):
    tmp = Path(served["tmp"])
    (tmp / "secret").mkdir()
    (tmp / "secret" / "key.txt").write_text("the host's secret")
    (tmp / "workspaces" / "alice" / "escape").symlink_to(tmp / "secret")  # a link out of the user's folder
    copied = []
    monkeypatch.setattr(service_module, "copy_workspace", lambda *a: copied.append(a))
    bob_ws = workspace_name(served["tasks"][0])
    with _client(served, "alice") as client:
        for name in ("../bob/" + bob_ws, "..", "../../secret", "/etc", "a/b", ".hidden", "escape",
                     "ws\x00", "missing", 7, None):
            with pytest.raises(ServeError) as e:
                client.open_session(name)
            assert e.value.status in (400, 404), (name, e.value)
            assert "workspace" in e.value.message
        assert copied == [] and client.sessions() == []


def test_busy_sessions_and_a_full_service_are_refused_with_what_to_do(served):
    served["engine"].slow_s = 0.3
    with _client(served, "alice") as client:
        sid = client.open_session(workspace_name(served["tasks"][0]))["id"]
        events = client.ask(sid, served["tasks"][0].problem_statement)
        assert next(events)["event"] == "start"
        with pytest.raises(ServeError) as e:
            list(client.ask(sid, "and another thing"))
        assert e.value.status == 409 and "wait for its 'done' event" in e.value.message
        assert [e["event"] for e in events][-1] == "done"
        list(client.ask(sid, "and another thing"))  # idle again: accepted


def test_a_hot_weight_swap_while_requests_run_drops_none(served):
    served["engine"].slow_s = 0.05
    tasks = served["tasks"]
    admin = ServeClient(served["url"], served["admin"])

    def one(name, task):
        with _client(served, name) as client:
            sid = client.open_session(workspace_name(task))["id"]
            return client.run(sid, task.problem_statement)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, n, t) for n in ("alice", "bob") for t in tasks]
        time.sleep(0.3)
        swaps = [admin.deploy(v) for v in (1, 2)]
        done = [f.result() for f in futures]
    assert [s["version"] for s in swaps] == [1, 2] and [s["previous"] for s in swaps] == [0, 1]
    assert all(d["stop_reason"] == "finished" for d in done) and len(done) == 4
    assert admin.health()["model_version"] == 2
    admin.close()


def test_a_kill_9_mid_load_loses_no_record_a_client_was_given(tmp_path):
    """benchmarks/serve_load.py, small: concurrent sessions on a `carl serve` process, hot swaps every
    second, SIGKILL once half the users have an answer; every session and every finished request a
    client heard of is in the store afterwards, and the database is intact."""
    from benchmark_modules import load

    result = load("serve_load").run_load(tmp_path, sessions=4, rounds=3, backend="local", latency_s=0.05, kill=True)
    s = result["summary"]
    assert s["killed"] and s["done"] >= 2 and s["dropped"] > 0  # the kill landed mid-load
    assert s["store"] == {"missing_sessions": 0, "lost_finished_requests": 0, "integrity": "ok"}


def test_edits_are_applied_inside_the_session_copy_only(tmp_path):
    from carl.online.workspaces import apply_changes
    from carl.rewards.diff import FileChange, WorkspaceDiff

    root, outside = tmp_path / "repo", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)  # a directory link the agent left in the workspace
    changes = WorkspaceDiff(changes=tuple(FileChange(p, "added", None, b"x") for p in (
        "../escape.txt", "/etc/evil", "a/../../b.txt", "link/through.txt", "ok/new.txt")) + (
        FileChange("made_link", "added", None, b"/etc/passwd", symlink=True),))
    skipped = apply_changes(root, changes)
    assert sorted(skipped) == sorted(["../escape.txt", "/etc/evil", "a/../../b.txt", "link/through.txt", "made_link"])
    assert (root / "ok" / "new.txt").read_bytes() == b"x"
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape.txt").exists() and not (tmp_path / "b.txt").exists()
    assert not (root / "made_link").exists()


def test_edits_keep_the_mode_of_the_file_they_change(tmp_path):
    from carl.online.workspaces import apply_changes
    from carl.rewards.diff import FileChange, WorkspaceDiff

    (tmp_path / "run.sh").write_text("#!/bin/sh\necho old\n")
    (tmp_path / "run.sh").chmod(0o755)
    changes = WorkspaceDiff(changes=(FileChange("run.sh", "modified", b"#!/bin/sh\necho old\n", b"#!/bin/sh\necho new\n"),
                                     FileChange("new.py", "added", None, b"x = 1\n")))
    old_umask = os.umask(0o022)
    try:
        assert apply_changes(tmp_path, changes) == []
    finally:
        os.umask(old_umask)
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o755  # still executable after the edit
    assert (tmp_path / "new.py").stat().st_mode & 0o777 == 0o644  # what the user's checkout would give it
