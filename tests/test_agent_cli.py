"""`carl agent run`: a scripted episode end to end, and clear errors for bad arguments."""

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


def test_agent_run_against_a_real_http_endpoint(repo, tmp_path):
    """openai:URL#MODEL over a real socket: a stdlib HTTP server speaking /v1/chat/completions."""
    replies = list(SCRIPT)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body["model"], len(body["messages"])))
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
    try:
        out = tmp_path / "t.json"
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert main(["agent", "run", "--repo", str(repo), "--task", "Fix add.", "--policy", f"openai:{url}#tiny-model",
                     "--sandbox", "local", "--out", str(out)]) == 0
    finally:
        server.shutdown()
        thread.join()
    assert json.loads(out.read_text())["stop_reason"] == "finished"
    assert seen == [("/v1/chat/completions", "tiny-model", n) for n in (2, 4, 6, 8)]
