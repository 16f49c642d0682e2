"""The local backend: a private copy, limits and process-group kill (it isolates nothing else)."""

import os
import time
import warnings

import pytest

from carl.sandbox import SandboxConfig, SandboxPathError, open_sandbox
from carl.sandbox import local as local_module


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 41\n")
    return src


def sandbox(repo, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return open_sandbox(repo, SandboxConfig(backend="local", **kw))


def test_warns_that_it_isolates_nothing(repo, monkeypatch):
    monkeypatch.setattr(local_module, "_warned", False)
    with pytest.warns(UserWarning, match="isolates NOTHING"):
        open_sandbox(repo, SandboxConfig(backend="local")).close()


def test_runs_in_private_copy_and_source_is_untouched(repo):
    with sandbox(repo) as a, sandbox(repo) as b:
        res = a.exec("python3 -c 'import pkg; print(pkg.VALUE)' && echo 0 > pkg/__init__.py && pwd")
        assert res.stdout.splitlines()[0] == "41"
        assert res.stdout.splitlines()[1] == a.workdir
        assert b.read_file("pkg/__init__.py") == b"VALUE = 41\n"
    assert (repo / "pkg" / "__init__.py").read_text() == "VALUE = 41\n"


def test_timeout_kills_the_process_group(repo):
    with sandbox(repo) as sb:
        res = sb.exec("(sleep 1; touch late_child) & sleep 30", timeout_s=0.5)
        assert res.timed_out and res.exit_code == 124
        time.sleep(1.5)
        assert "late_child" not in {e.path for e in sb.list_files()}


def test_memory_hog_is_stopped(repo):
    with sandbox(repo, memory_mb=256) as sb:
        res = sb.exec(["python3", "-c", "x = bytearray(1024 * 1024 * 1024); print('allocated')"])
    assert res.exit_code != 0 and "MemoryError" in res.stderr


def test_paths_cannot_escape_the_workspace(repo, tmp_path):
    (tmp_path / "outside.txt").write_text("host")
    with sandbox(repo) as sb:
        sb.exec(f"ln -s {tmp_path / 'outside.txt'} link")
        for bad in ("../outside.txt", str(tmp_path / "outside.txt"), "link"):
            with pytest.raises(SandboxPathError):
                sb.read_file(bad)
        with pytest.raises(SandboxPathError):
            sb.write_file("../outside.txt", b"x")
    assert (tmp_path / "outside.txt").read_text() == "host"


def test_close_deletes_the_copy(repo):
    sb = sandbox(repo)
    workdir = sb.workdir
    sb.close()
    assert not os.path.exists(workdir)


def test_host_variables_that_steer_python_or_pytest_stay_outside(repo, monkeypatch):
    """A PYTEST_ADDOPTS naming a plugin the task's environment lacks made every micro task's suite
    fail ("usage: pytest.main()") when carl ran under it; a host PYTHONSTARTUP would run host code."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "--timeout 5")
    monkeypatch.setenv("PYTHONSTARTUP", "/host/startup.py")
    monkeypatch.setenv("CARL_PROBE", "kept")
    with sandbox(repo, env={"PYTHONHASHSEED": "0"}) as box:
        names = dict(line.split("=", 1) for line in box.exec("env").stdout.splitlines() if "=" in line)
    assert "PYTEST_ADDOPTS" not in names and "PYTHONSTARTUP" not in names
    assert names["CARL_PROBE"] == "kept"  # everything else passes, as before
    assert names["PYTHONHASHSEED"] == "0" and names["PYTHONPATH"] == box.workdir  # what carl sets still holds
