"""`carl sandbox run` and `carl env serve` argument handling."""

import warnings

import pytest

from carl.cli import main
from carl.sandbox.bwrap import bwrap_available


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "f.txt").write_text("content\n")
    return tmp_path / "repo"


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not installed")
def test_sandbox_run_prints_output_and_exits_with_the_command_code(repo, capsys):
    code = main(["sandbox", "run", "--backend", "bwrap", "--workspace", str(repo), "--", "bash", "-c",
                 "cat f.txt; echo oops >&2; rm f.txt; exit 5"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 5
    assert out == "content\n"
    assert "oops" in err and "exit code 5" in err
    assert (repo / "f.txt").exists()


def test_sandbox_run_single_word_runs_under_bash(repo, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(
            ["sandbox", "run", "--backend", "local", "--workspace", str(repo), "--", "cat f.txt | wc -l"]
        )
    assert code == 0
    assert capsys.readouterr().out.strip() == "1"


def test_sandbox_run_bad_workspace_is_one_clear_line(tmp_path, capsys):
    assert main(["sandbox", "run", "--workspace", str(tmp_path / "nope"), "--", "true"]) == 2
    assert "--workspace" in capsys.readouterr().err


def test_env_serve_refuses_to_start_without_a_token(monkeypatch, capsys):
    monkeypatch.delenv("CARL_ENV_TOKEN", raising=False)
    assert main(["env", "serve", "--port", "1"]) == 2
    assert "no token" in capsys.readouterr().err
