"""Run one process with a wall-clock limit and capped output, shared by the local and bwrap backends.

The process starts in a new session (so in its own process group); when the time limit passes, the
whole group is killed with SIGKILL. After the main process exits, the group is killed too, so a
background child cannot outlive its command (under bwrap the PID namespace already guarantees
that). stdout and stderr are read as they come and each kept up to `max_output_bytes`; the rest is
counted and dropped, so a command that prints gigabytes cannot fill the host's memory.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence

from carl.sandbox.base import ExecResult, SandboxError

TIMEOUT_EXIT_CODE = 124
"""ExecResult.exit_code of a command killed at its time limit (as coreutils `timeout` reports)."""
OOM_EXIT_CODE = 137
"""ExecResult.exit_code of a command killed for going over its memory limit (128 + SIGKILL, as bash says)."""
_DRAIN_AFTER_EXIT_S = 1.0
"""How long to keep reading pipes after the main process exited (children that escaped the group)."""
_CHUNK = 65536


def run_process(
    argv: Sequence[str],
    *,
    timeout_s: float,
    max_output_bytes: int,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    running: set[int] | None = None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run argv to completion or until timeout_s passes, then kill its process group.

    running: a set the process group id is kept in while the command runs, so that the sandbox's
    close() can kill commands still running in other threads. pass_fds: host fds the process
    inherits (bwrap's status pipe).
    """
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except OSError as e:
        raise SandboxError(f"could not start {argv[0]!r}: {e}") from e
    if running is not None:
        running.add(proc.pid)
    try:
        return _wait(proc, start, timeout_s, max_output_bytes, stdin)
    finally:
        if running is not None:
            running.discard(proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; quiet when it is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(proc: subprocess.Popen, start: float, timeout_s: float, max_output_bytes: int, stdin: str | None):
    outputs = {
        proc.stdout.fileno(): _Capped(max_output_bytes),
        proc.stderr.fileno(): _Capped(max_output_bytes),
    }
    pending_stdin = memoryview(stdin.encode("utf-8")) if stdin is not None else None
    deadline = start + timeout_s
    timed_out = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        if pending_stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                kill_group(proc.pid)
            if exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT_S:
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                kill_group(proc.pid)
                exited_at = now
            for key, _ in sel.select(timeout=0.05):
                if key.fileobj is proc.stdin:
                    pending_stdin = _feed(proc.stdin, pending_stdin, sel)
                    continue
                chunk = os.read(key.fd, _CHUNK)
                if chunk:
                    outputs[key.fd].add(chunk)
                else:
                    sel.unregister(key.fileobj)
    kill_group(proc.pid)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    returncode = proc.wait()
    stdout_cap, stderr_cap = list(outputs.values())
    return ExecResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else returncode,
        stdout=stdout_cap.text(),
        stderr=stderr_cap.text(),
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        truncated=stdout_cap.dropped > 0 or stderr_cap.dropped > 0,
    )


class _Capped:
    """The first `limit` bytes of a stream and a count of the bytes dropped after them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.limit - self.kept
        if room > 0:
            self.chunks.append(chunk[:room])
            self.kept += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        text = b"".join(self.chunks).decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... output truncated: {self.dropped} more bytes not shown ...]\n"
        return text


def _feed(pipe, pending: memoryview | None, sel: selectors.BaseSelector) -> memoryview | None:
    try:
        written = os.write(pipe.fileno(), pending[:_CHUNK]) if pending else 0
    except (BrokenPipeError, BlockingIOError) as e:
        written = 0 if isinstance(e, BlockingIOError) else len(pending)
    pending = pending[written:] if pending else None
    if not pending:
        sel.unregister(pipe)
        pipe.close()
        return None
    return pending
