"""carl.io: atomic writes keep file modes; JSONL appends survive torn lines."""

import os
import stat

import pytest

from carl.io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_open_default_mode_not_temp_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        assert _mode(tmp_path / "a.txt") == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
        assert _mode(tmp_path / "b.txt") == 0o600
    finally:
        os.umask(old)


def test_replacing_a_file_keeps_its_mode(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o755)
    atomic_write_bytes(script, b"#!/bin/sh\necho new\n")
    assert script.read_text().endswith("new\n")
    assert _mode(script) == 0o755
    private = tmp_path / "key"
    private.write_text("a")
    private.chmod(0o600)
    atomic_write_text(private, "b")
    assert _mode(private) == 0o600


def test_explicit_mode_wins(tmp_path):
    path = tmp_path / "f"
    path.write_text("a")
    path.chmod(0o644)
    atomic_write_text(path, "b", mode=0o600)
    assert _mode(path) == 0o600


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_append_after_torn_line_starts_a_new_line(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"a": 1})
    with open(path, "a") as f:
        f.write('{"b": 2')  # a crash mid-append
    with pytest.warns(UserWarning, match="torn last line"):
        append_jsonl(path, {"c": 3})
    assert read_jsonl(path) == [{"a": 1}, {"c": 3}]
