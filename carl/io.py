"""Crash-safe file writes (write to a temp file in the same directory, fsync, rename), and JSONL
files that are appended to and survive a crash mid-append.

A crash while appending leaves a torn last line: no newline at its end, usually not valid JSON.
Readers drop it with a warning naming the file and line; the next append cuts it off first, so
the new line does not join it. Anything else that is not one JSON value a line is an error
naming the file and line.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    """Replace `path` with `data` atomically. The file gets `mode` when given, else the mode of the
    file it replaces (an executable script stays executable), else what `open()` would give a new
    file (0o666 less the umask), not the 0o600 of the temp file it is written to."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = _existing_mode(path)
    if mode is None:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _existing_mode(path: Path) -> int | None:
    try:
        st = os.stat(path)  # the target's mode, through a symlink as open() would write it
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode)


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc, 4.7+); elsewhere
    set and put straight back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode(), mode)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: str | Path, rows: list[Any]) -> None:
    """Replace a JSONL file with `rows`, one JSON object a line, atomically."""
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON line and fsync: a crash loses at most the line being written.

    Appends are serialized by an flock on the file, so that one never cuts off another's line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _end_torn_line(f, path)
        f.write((json.dumps(obj, sort_keys=True) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[Any]:
    """Read a JSONL file, dropping a torn last line left by a crash (with a warning)."""
    return [obj for _, obj in read_jsonl_numbered(path)]


def read_jsonl_numbered(path: str | Path) -> list[tuple[int, Any]]:
    """(line number, value) for each non-blank line; ValueError naming the file and line for a
    line that is not UTF-8 or not JSON, except a torn last line, which is dropped with a warning."""
    lines = Path(path).read_bytes().split(b"\n")  # the last element is b"" after a final newline
    out = []
    for i, raw in enumerate(lines):
        try:
            text = raw.decode()
            if text.strip():
                out.append((i + 1, json.loads(text)))
        except ValueError as e:  # UnicodeDecodeError or JSONDecodeError
            if i == len(lines) - 1:  # no newline at its end: torn
                # Shown once per file and line (warnings repeats no message from one place).
                warnings.warn(f"{path}:{i + 1}: dropped a torn last line (cut short, as by a crash while "
                              f"appending)", stacklevel=2)  # fmt: skip
                break
            what = (f"not UTF-8 ({e.reason} at byte {e.start})" if isinstance(e, UnicodeDecodeError)
                    else f"not valid JSON ({e.msg} at column {e.colno})")  # fmt: skip
            raise ValueError(f"{path}:{i + 1}: {what}; expected one JSON value a line") from None
    return out


def _end_torn_line(f, path: Path) -> None:
    """Before an append: cut off a torn last line, or end a whole one that lacks its newline."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    f.seek(0)  # only after a crash (or a hand edit): reading the whole file is fine
    start = f.read().rfind(b"\n") + 1
    f.seek(start)
    try:
        json.loads(f.read())
    except ValueError:  # torn, as readers take it
        warnings.warn(
            f"{path}: cut off a torn last line ({size - start} bytes) before appending", stacklevel=3
        )
        os.ftruncate(f.fileno(), start)
        return
    f.write(b"\n")  # a whole record written without its newline (by hand): keep it
