"""Re-check a stored task from its record alone (`carl tasks validate`).

In a fresh sandbox on the broken repo: every FAIL_TO_PASS test fails and every PASS_TO_PASS test
passes; then, with the gold patch applied, all of them pass.
"""

from __future__ import annotations

import re
import tempfile
from contextlib import closing
from pathlib import Path

from carl.sandbox.base import Sandbox, SandboxConfig, SandboxPathError
from carl.tasks.patch import apply_patch
from carl.tasks.record import TaskRecord
from carl.tasks.store import broken_repo_dir, sandbox_config_for
from carl.tasks.suite import run_suite

_FILE = re.compile(r"^(?:---|\+\+\+) (?:a|b)/(.+)$", re.MULTILINE)


def recheck_task(task: TaskRecord, base: SandboxConfig, open_sandbox=None) -> str | None:
    """None when the task holds, else what is wrong."""
    if open_sandbox is None:
        from carl.sandbox import open_sandbox
    targets = sorted(set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS))
    pythonpath = tuple(task.environment.get("pythonpath") or ())
    cfg = sandbox_config_for(task, base)
    with closing(open_sandbox(broken_repo_dir(task), cfg)) as sb:
        run = run_suite(sb, task.test_command, targets, timeout_s=cfg.timeout_s, pythonpath=pythonpath)
        if not run.completed:
            return "broken run did not finish" + (" (timeout)" if run.timed_out else "")
        passing = [t for t in task.FAIL_TO_PASS if run.passed(t)]
        if passing:
            return f"FAIL_TO_PASS test passes on the broken repo: {passing[0]}"
        failing = [t for t in task.PASS_TO_PASS if not run.passed(t)]
        if failing:
            return f"PASS_TO_PASS test fails on the broken repo: {failing[0]}"
        apply_gold_patch(sb, task.patch)
        run = run_suite(sb, task.test_command, targets, timeout_s=cfg.timeout_s, pythonpath=pythonpath)
        failing = [t for t in targets if not run.passed(t)]
        if not run.completed or failing:
            return f"with the gold patch, {failing[0] if failing else 'the run'} fails"
    return None


def apply_gold_patch(sb: Sandbox, patch: str) -> None:
    """Apply a patch to the files of a sandbox (read out, patched on the host, written back)."""
    files = sorted(set(_FILE.findall(patch)))
    with tempfile.TemporaryDirectory() as tmp:
        for rel in files:
            try:
                data = sb.read_file(rel)
            except SandboxPathError:  # the patch creates it
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(data)
        for rel in apply_patch(Path(tmp), patch):
            if (Path(tmp) / rel).exists():
                sb.write_file(rel, (Path(tmp) / rel).read_bytes())
            else:
                sb.exec(["rm", "-f", "--", rel])
