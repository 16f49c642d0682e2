"""`carl agent run`: a scripted episode end to end, sampling flags sent to an endpoint, and clear errors
for bad arguments (`--checkpoint` end to end: tests/test_checkpoint_policy.py)."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from carl.cli import main
from carl.types import StopReason, Trajectory

SCRIPT = [
    'Looking. <tool name="read_file"><path>calc.py</path></tool>',
    '<tool name="edit_file"><path>calc.py</path><old>return 0</old><new>return a + b</new></tool>',
    '<tool name="run_terminal"><command>grep -c "a + b" calc.py</command></tool>',
    '<tool name="finish"><message>fixed add</message></tool>',
]


@pytest.fixture
def repo(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    (d / "calc.py").write_text("def add(a, b):\n    return 0\n")
    return d


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "script.json"
    p.write_text(json.dumps(SCRIPT))
    return p


@pytest.mark.parametrize("backend", ["local", "bwrap"])
def test_agent_run_writes_the_trajectory(backend, repo, script, tmp_path, capsys):
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    out = tmp_path / "out" / "traj.json"
    rc = main(["agent", "run", "--repo", str(repo), "--task", "Fix add.", "--policy", f"scripted:{script}",
               "--sandbox", backend, "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    traj = Trajectory.from_dict(json.loads(out.read_text()))
    assert traj.stop_reason == StopReason.FINISHED
    assert [t.calls[0].name for t in traj.turns] == ["read_file", "edit_file", "run_terminal", "finish"]
    assert traj.turns[2].results[0].output.startswith("1")  # the edit happened inside the sandbox
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return 0\n"  # the source is untouched
    assert "turn 4" in printed and "stop: finished" in printed and traj.metadata["sandbox"] == backend


def test_max_turns_flag(repo, script, tmp_path):
    out = tmp_path / "t.json"
    assert main(["agent", "run", "--repo", str(repo), "--task", "x", "--policy", f"scripted:{script}",
                 "--sandbox", "local", "--out", str(out), "--max-turns", "2"]) == 0
    assert json.loads(out.read_text())["stop_reason"] == "max_turns"


def test_policy_failure_exits_1_and_still_writes(repo, tmp_path):
    script = tmp_path / "short.json"
    script.write_text(json.dumps(SCRIPT[:1]))  # runs out of replies: a policy error
    out = tmp_path / "t.json"
    assert main(["agent", "run", "--repo", str(repo), "--task", "x", "--policy", f"scripted:{script}",
                 "--sandbox", "local", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["stop_reason"] == "policy_error"


@pytest.mark.parametrize("policy,message", [
    ("gpt4", "expected openai:URL#MODEL"),
    ("magic:foo", "unknown scheme 'magic'"),
    ("openai:http://127.0.0.1:8000/v1", "with the model name after '#'"),
    ("openai:127.0.0.1:8000/v1#m", "expected http://"),
    ("scripted:/nonexistent/replies.json", "does not exist"),
])
def test_bad_policy_spec_is_a_clear_error(policy, message, repo, tmp_path, capsys):
    rc = main(["agent", "run", "--repo", str(repo), "--task", "x", "--policy", policy, "--sandbox", "local",
               "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


def test_missing_repo_and_bad_script_file(tmp_path, script, capsys):
    assert main(["agent", "run", "--repo", str(tmp_path / "nope"), "--task", "x", "--policy", f"scripted:{script}",
                 "--out", str(tmp_path / "t.json")]) == 2
    assert "--repo" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    assert main(["agent", "run", "--repo", str(tmp_path), "--task", "x", "--policy", f"scripted:{bad}",
                 "--out", str(tmp_path / "t.json")]) == 2
    assert "expected a non-empty JSON list" in capsys.readouterr().err


@pytest.fixture
def endpoint():
    """A stdlib HTTP server speaking /v1/chat/completions over a real socket: (its /v1 URL, the
    requests it saw), answering with SCRIPT's replies in order."""
    replies = list(SCRIPT)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, **body})
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": replies.pop(0)}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    thread.join()


def test_agent_run_against_a_real_http_endpoint(repo, tmp_path, endpoint):
    url, seen = endpoint
    out = tmp_path / "t.json"
    assert main(["agent", "run", "--repo", str(repo), "--task", "Fix add.", "--policy", f"openai:{url}#tiny-model",
                 "--sandbox", "local", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["stop_reason"] == "finished"
    assert [(b["path"], b["model"], len(b["messages"])) for b in seen] == \
        [("/v1/chat/completions", "tiny-model", n) for n in (2, 4, 6, 8)]
    assert all(b["temperature"] == 0.0 and "seed" not in b for b in seen)  # greedy, no seed: the defaults


def test_sampling_flags_reach_the_endpoint_with_seeds_named_by_the_episode(repo, tmp_path, endpoint):
    from carl.engine.streams import stream_seed

    url, seen = endpoint
    assert main(["agent", "run", "--repo", str(repo), "--task", "Fix add.", "--policy", f"openai:{url}#m",
                 "--sandbox", "local", "--out", str(tmp_path / "t.json"), "--temperature", "0.7", "--top-p", "0.9",
                 "--seed", "5", "--task-id", "calc-1"]) == 0
    assert [(b["temperature"], b["top_p"]) for b in seen] == [(0.7, 0.9)] * 4
    # sample 0 of task calc-1, turn by turn: the seeds `carl eval --seed 5` sends for that sample
    assert [b["seed"] for b in seen] == [stream_seed(5, "calc-1/0", turn, bits=31) for turn in range(4)]


@pytest.mark.parametrize("extra,message", [
    ([], "expected exactly one of --checkpoint PATH"),
    (["--policy", "scripted:x.json", "--checkpoint", "runs/x"], "got both"),
    (["--policy", "SCRIPT", "--temperature", "0.5"], "--temperature: a scripted policy replays its file"),
    (["--policy", "openai:http://127.0.0.1:9/v1#m", "--top-p", "0"], "--top-p: got 0, expected a value in (0, 1]"),
    (["--policy", "openai:http://127.0.0.1:9/v1#m", "--temperature", "-1"], "--temperature: got -1, expected >= 0"),
    (["--policy", "openai:http://127.0.0.1:9/v1#m", "--device", "cuda:0"], "--device: only for --checkpoint"),
    (["--checkpoint", "/nonexistent/run"], "holds no model; expected a carl run directory"),
    (["--checkpoint", "/nonexistent/run:x"], "expected PATH or RUN_DIR:STEP (a number)"),
])
def test_what_acts_and_how_it_samples_are_checked_before_anything_runs(extra, message, repo, script, tmp_path,
                                                                        capsys):
    extra = [f"scripted:{script}" if a == "SCRIPT" else a for a in extra]
    rc = main(["agent", "run", "--repo", str(repo), "--task", "x", "--sandbox", "local",
               "--out", str(tmp_path / "t.json"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "t.json").exists()
