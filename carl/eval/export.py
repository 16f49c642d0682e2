"""carl tasks as SWE-bench or SWE-smith task instances, for other tools.

SWE-bench (the fields of the princeton-nlp/SWE-bench dataset card on Hugging Face, and
SWE-bench/SWE-bench `swebench/harness/constants`): repo, instance_id, base_commit, patch (the
gold fix), test_patch, problem_statement, hints_text, created_at, version, FAIL_TO_PASS and
PASS_TO_PASS as JSON-encoded lists of test ids (the dataset's columns are strings), and
environment_setup_commit. carl knows no environment commit (the environment is pinned by the
record's requirements instead): it is written as "".

SWE-smith (SWE-bench/SWE-smith `swesmith/harness/gather.py` and the SWE-bench/SWE-smith dataset
card): instance_id, repo, base_commit, patch, FAIL_TO_PASS and PASS_TO_PASS as JSON lists,
problem_statement, created_at, image_name. SWE-smith's `patch` is the one that *introduces* the
bug (its harness applies the gold fix as `git apply --reverse`, swesmith/harness/utils.py
`_apply_patch`), so it is carl's gold patch reversed. carl tasks have no Docker image:
image_name is "".

In both, base_commit is carl's: the original's revision (or its source hash), not a commit of
the broken repo, which is that revision with the gold patch reversed (and carl's scrubbing).
`repo` is carl's repository or PyPI name, not a GitHub owner/name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from carl.tasks.record import TaskRecord

SWE_BENCH_FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
                    "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
                    "environment_setup_commit")
SWE_SMITH_FIELDS = ("instance_id", "repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                    "problem_statement", "created_at", "image_name")


def swe_bench_record(t: TaskRecord) -> dict[str, Any]:
    return {
        "repo": t.repo,
        "instance_id": t.instance_id,
        "base_commit": t.base_commit,
        "patch": t.patch,
        "test_patch": t.test_patch,
        "problem_statement": t.problem_statement,
        "hints_text": "",
        "created_at": t.created_at,
        "version": t.version,
        "FAIL_TO_PASS": json.dumps(list(t.FAIL_TO_PASS)),
        "PASS_TO_PASS": json.dumps(list(t.PASS_TO_PASS)),
        "environment_setup_commit": "",
    }


def swe_smith_record(t: TaskRecord) -> dict[str, Any]:
    return {
        "instance_id": t.instance_id,
        "repo": t.repo,
        "base_commit": t.base_commit,
        "patch": reverse_patch(t.patch),
        "FAIL_TO_PASS": list(t.FAIL_TO_PASS),
        "PASS_TO_PASS": list(t.PASS_TO_PASS),
        "problem_statement": t.problem_statement,
        "created_at": t.created_at,
        "image_name": "",
    }


FORMATS: dict[str, Callable[[TaskRecord], dict[str, Any]]] = {
    "swe-bench": swe_bench_record,
    "swe-smith": swe_smith_record,
}

_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def reverse_patch(diff: str) -> str:
    """The unified diff that undoes `diff` (what `patch -R` applies): headers swapped (a/ and b/
    prefixes kept in place, /dev/null for a created or deleted file), hunk ranges swapped, added
    and removed lines swapped. Hunk bodies are read by their counted lines, so a removed line
    that starts with "-- " is never taken for a header."""
    lines = diff.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line, m = lines[i], _HUNK.match(lines[i])
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:].strip(), lines[i + 1][4:].strip()
            out += [f"--- {_side(new, 'a/')}\n", f"+++ {_side(old, 'b/')}\n"]
            i += 2
            continue
        if m is None:
            swapped = {"new file mode": "deleted file mode", "deleted file mode": "new file mode"}
            head = next((k for k in swapped if line.startswith(k)), None)
            out.append(swapped[head] + line[len(head):] if head else line)
            i += 1
            continue
        old_left = int((m.group(2) or ",1")[1:])
        new_left = int((m.group(4) or ",1")[1:])
        out.append(f"@@ -{m.group(3)}{m.group(4) or ''} +{m.group(1)}{m.group(2) or ''} @@{line[m.end():]}")
        i += 1
        while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
            tag, body = lines[i][:1], lines[i][1:]
            if tag == "-":
                out.append("+" + body)
                old_left -= 1
            elif tag == "+":
                out.append("-" + body)
                new_left -= 1
            else:  # context, or "\ No newline at end of file" after the line it belongs to
                out.append(lines[i])
                if tag != "\\":
                    old_left, new_left = old_left - 1, new_left - 1
            i += 1
    return "".join(out)


def _side(name: str, prefix: str) -> str:
    """A header's file name with its first component replaced by `prefix` ("a/" or "b/")."""
    if name == "/dev/null" or "/" not in name:
        return name
    return prefix + name.split("/", 1)[1]
