"""A scripted expert that solves feature-deletion tasks with the harness's tools.

It knows the answer (the task's gold patch) and acts like a careful engineer: read the file,
edit the deleted code back in, run the failing tests, finish. With configurable probabilities it
makes the mistakes a model makes, and recovers from them the way we want a model to:

  bad_call     a malformed tool call (an unknown tool name), then the right call
  wrong_edit   an edit with a wrong constant, a test run that shows the failure, the fix
  sibling_body another function's body of the same file, a test run that shows the failure, the
               right body (a third of a trained model's wrong first edits)
  skip_read    edits without reading the file first (no recovery needed, just less careful)

Its episodes are the warm-start (supervised) data of the embedded default, and a baseline for
the harness: if the expert does not reach reward 1 on a task, the task or the harness is broken.
It implements the ChatPolicy protocol (text in, text out), one instance per episode.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from carl.harness.policies import ScriptedTokenPolicy
from carl.harness.prompts import SUMMARY_REQUEST
from carl.harness.protocol import render_call
from carl.types import Message, ToolCall


@dataclass(frozen=True)
class ExpertMistakes:
    bad_call: float = 0.0
    """Probability of first emitting a call to a tool that does not exist."""
    wrong_edit: float = 0.0
    """Probability of first writing a wrong constant, then fixing it after the tests fail."""
    skip_read: float = 0.0
    """Probability of editing without reading the file first."""
    sibling_body: float = 0.0
    """Probability, where no wrong constant was planted, of first writing the body of another
    function of the same file, then the right body after the tests fail. About a third of a
    trained 135M model's wrong first edits copy a neighbour's body (`return WEIGHT_TAG + s` in
    `scale_weight`; most of the rest pair the wrong operator and constant, `x * PRICE_STEP`), and
    the wrong constant never shows how to recover from either (docs/results/
    fresh-seeds5-expert-words-2026-12-07/wrong_edits.txt)."""

    def __post_init__(self) -> None:
        for name in ("bad_call", "wrong_edit", "skip_read", "sibling_body"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"expert.{name}: got {p!r}, expected a probability in [0, 1]")


@dataclass(frozen=True)
class Edit:
    path: str
    old: str  # text in the broken file
    new: str  # text of the original


def patch_edits(patch: str) -> list[Edit]:
    """The hunks of a unified diff as exact search/replace edits (broken text -> original text)."""
    edits: list[Edit] = []
    path = None
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def flush():
        if path is not None and in_hunk and (old or new):
            edits.append(Edit(path, "".join(old), "".join(new)))

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            flush()
            in_hunk, old, new = False, [], []
            target = line[4:].strip().split("\t")[0]
            path = target[2:] if target.startswith("b/") else target
        elif line.startswith("--- "):
            flush()
            in_hunk, old, new = False, [], []
        elif line.startswith("@@"):
            flush()
            in_hunk, old, new = True, [], []
        elif in_hunk and line.startswith("\\"):
            continue  # "\ No newline at end of file"
        elif in_hunk and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] in (" ", "-"):
                old.append(body)
            if line[0] in (" ", "+"):
                new.append(body)
    flush()
    return edits


SUMMARY = "Summary: I am restoring the deleted code from its docstring and the failing tests."
"""The summary of `ExpertPolicy(summary="fixed")`: the expert's only summary before 2026-12-02. It
says nothing the next segment can use, so where a context reset dropped the file the expert had
read, warm-start data taught the model to write code that reads constants no longer in its context
(configs/long-horizon.toml: 9 of 12 expert episodes reset right after reading)."""

SUMMARIES = ("notes", "fixed")


class ExpertPolicy:
    """Replays a plan of assistant messages computed from the task's gold patch (a ChatPolicy).

    Asked for a self-summary, it writes what the next segment needs to go on (`summary="notes"`,
    `expert_summary`): the exact text to replace, the definitions the restored code reads from the
    files it has read so far, the next steps. `summary="fixed"` gives the old fixed sentence."""

    def __init__(self, task, mistakes: ExpertMistakes = ExpertMistakes(), seed: int = 0, summary: str = "notes"):
        if summary not in SUMMARIES:
            raise ValueError(f"summary: got {summary!r}, expected one of {SUMMARIES}")
        rng = random.Random(f"expert-{task.instance_id}-{seed}")
        self.plan = plan_messages(task, mistakes, rng)
        self.task, self.summary = task, summary
        self.step = 0

    def chat(self, messages: list[Message], max_new_tokens: int = 0) -> str:
        return self.reply(bool(messages) and messages[-1].content == SUMMARY_REQUEST)

    def reply(self, summary_requested: bool) -> str:
        if summary_requested:
            if self.summary == "fixed":
                return SUMMARY
            return expert_summary(self.task, self.plan[:self.step], self.plan[self.step:])
        msg = self.plan[min(self.step, len(self.plan) - 1)]
        self.step += 1
        return msg


def expert_token_policy(tokenizer, task, mistakes: ExpertMistakes = ExpertMistakes(), seed: int = 0,
                        summary: str = "notes"):
    """The expert as a TokenPolicy: canonical tokenizations of its messages, so its episodes are
    token-exact trajectories in the chat template of the model that learns from them."""
    expert = ExpertPolicy(task, mistakes, seed, summary)
    return ScriptedTokenPolicy(
        tokenizer, lambda prompt: expert.reply(SUMMARY_REQUEST in prompt[-len(SUMMARY_REQUEST) - 100:])
    )


def minimal_edit(e: Edit, file_text: str | None) -> Edit:
    """Trim the hunk's context lines, keeping just enough for `old` to match once in the file.

    Shorter edits are what a careful engineer writes, and far fewer tokens for a small model to
    learn. Without the file text the full hunk (always unique for a valid patch) is kept.
    """
    if file_text is None:
        return e
    old, new = e.old.splitlines(keepends=True), e.new.splitlines(keepends=True)
    head = 0
    while head < min(len(old), len(new)) - 1 and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head - 1 and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    lo, hi = head, tail  # context lines we may drop from each end
    while lo > 0 or hi > 0:
        cand = "".join(old[lo: len(old) - hi])
        if cand.strip() and file_text.count(cand) == 1:
            return Edit(e.path, cand, "".join(new[lo: len(new) - hi]))
        lo, hi = max(lo - 1, 0), max(hi - 1, 0)
    return e


RUN_TESTS = "Now the tests."
"""What the expert says before every test run, the one after a wrong edit included: only the test
output may tell what comes next (fix or finish). When it said "Let me check it." before the run
of its planted wrong edit, "Now the tests." was always followed by a pass and finish in the
warm-start data, and the model says "Now the tests." before nearly every run. At level 4 that
touches 0-3 of the default's 64 expert episodes; rerun on one seed it changed nothing measurable
(docs/training.md, "The expert's words")."""


def plan_messages(task, mistakes: ExpertMistakes, rng: random.Random) -> list[str]:
    edits = [minimal_edit(e, _broken_text(task, e.path)) for e in patch_edits(task.patch)]
    if not edits:
        raise ValueError(f"task {task.instance_id}: gold patch has no hunks")
    tests = " ".join(task.FAIL_TO_PASS)
    plan: list[str] = []
    paths = list(dict.fromkeys(e.path for e in edits))
    if rng.random() < mistakes.bad_call:
        plan.append("Let me open the file." + render_call(ToolCall("open_file", {"path": paths[0]})))
    if rng.random() >= mistakes.skip_read:
        reads = "".join(render_call(ToolCall("read_file", {"path": p})) for p in paths + referenced_files(task, edits))
        plan.append("I will read the code the failing tests exercise." + reads)
    wrong = _wrong_edit(edits[0]) if rng.random() < mistakes.wrong_edit else None
    recovery = "A constant is wrong; fixing it."
    if wrong is None and mistakes.sibling_body > 0 and rng.random() < mistakes.sibling_body:
        wrong, recovery = _sibling_edit(edits[0], _broken_text(task, edits[0].path), rng), SIBLING_FIX
    for i, e in enumerate(edits):
        if i == 0 and wrong is not None:
            plan.append("I will implement it from the docstring." + _edit_call(wrong[0]))
            plan.append(RUN_TESTS + render_call(ToolCall("run_tests", {"tests": tests})))
            plan.append(recovery + _edit_call(wrong[1]))
        else:
            plan.append("I will implement it from the docstring." + _edit_call(e))
    plan.append(RUN_TESTS + render_call(ToolCall("run_tests", {"tests": tests})))
    plan.append("The feature is restored." + render_call(ToolCall("finish", {"message": "Restored the deleted code."})))
    return plan


def expert_summary(task, sent: list[str], pending: list[str]) -> str:
    """A self-summary from which the next segment can go on without reading again, given the
    expert's messages already `sent` and still `pending`: what to restore (the stub's `def` and
    docstring), the exact text the next edit_file replaces, each name the restored code reads with
    its definition as it stands in a file already read (a constant's line, a function's `def`),
    what was done, what comes next.

    It states only what the context showed: definitions from files already read, never what the
    expert knows from the gold patch alone."""
    edits = [minimal_edit(e, _broken_text(task, e.path)) for e in patch_edits(task.patch)]
    done, todo = _calls(sent), _calls(pending)
    read_paths = list(dict.fromkeys(c.params["path"] for c in done if c.name == "read_file"))
    next_edit = next((c for c in todo if c.name == "edit_file"), None)
    edited = any(c.name == "edit_file" for c in done)
    lines = ["Summary: restore in " + ", ".join(dict.fromkeys(e.path for e in edits)) + ":"]
    for e in edits:  # the stub as the file had it; once edited, its def line says which function
        stub = _stub_in_context(_broken_text(task, e.path) or "", e.old).rstrip("\n")
        lines.append(stub.splitlines()[0] if edited else stub)
    if done:
        lines.append("Done: " + ", ".join(dict.fromkeys(c.name for c in done)) + ".")
    if next_edit is not None and edited:  # a fix after an edit: the text now in the file
        lines.append(f"The next edit_file replaces:\n{next_edit.params['old'].rstrip(chr(10))}")
    facts: dict[str, list[str]] = {}  # path -> its definitions the restored code reads
    for e in edits:
        for path, line in _definitions_read(task, _code_only(e.new), read_paths):
            known = facts.setdefault(path, [])
            if line not in known:
                known.append(line)
    if facts:
        lines.append("Read so far: " + "; ".join(f"{path} has {', '.join(defs)}" for path, defs in facts.items()))
    elif not read_paths:
        lines.append("I have not read the code yet.")
    lines.append("Next: " + ", then ".join(dict.fromkeys(c.name for c in todo)) + ".")
    return "\n".join(lines)


def _calls(messages: list[str]) -> list[ToolCall]:
    from carl.harness.protocol import parse_calls

    return [c for m in messages for c in parse_calls(m, _specs()) if isinstance(c, ToolCall)]


@functools.cache
def _specs():
    from carl.harness.tools import default_tools, specs_of

    return specs_of(default_tools())


def _stub_in_context(text: str, old: str, max_lines: int = 8) -> str:
    """`old` with the lines above it back to its enclosing `def` (which function, its docstring),
    at most `max_lines` lines; `old` alone when the file does not hold it."""
    at = text.find(old)
    if at < 0:
        return old
    above = text[:at].splitlines(keepends=True)
    start = len(above)
    for i in range(len(above) - 1, max(len(above) - max_lines, 0) - 1, -1):
        if re.match(r"\s*def \w+\(", above[i]):
            start = i
            break
    return "".join(above[start:]) + old


def _definitions_read(task, code: str, read_paths: list[str]) -> list[tuple[str, str]]:
    """(path, line) for each name of `code` defined at the top level of a read file (constants and
    functions), in the order the names appear in `code`."""
    facts: list[tuple[str, str]] = []
    texts = {path: _broken_text(task, path) or "" for path in read_paths}
    for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", code)):
        for path, text in texts.items():
            m = re.search(rf"^(?:{re.escape(name)}\s*=.*|def {re.escape(name)}\(.*)$", text, re.M)
            if m:
                facts.append((path, m.group(0).rstrip(":").strip()))
                break
    return facts


def referenced_files(task, edits: list[Edit]) -> list[str]:
    """Other modules of the repo whose names the restored code reads (`settings.PRICE_STEP` in a file
    that does `from pkg import settings`): a careful engineer reads them before writing the code."""
    files: list[str] = []
    for e in edits:
        text = _broken_text(task, e.path) or ""
        imported = {m.group(2): m.group(1).replace(".", "/") + "/" + m.group(2) + ".py"
                    for m in re.finditer(r"^from ([\w.]+) import (\w+)$", text, re.M)}
        for name in re.findall(r"\b(\w+)\.\w+", _code_only(e.new)):
            path = imported.get(name)
            if path and path not in files and path != e.path and _broken_text(task, path) is not None:
                files.append(path)
    return files


def _broken_text(task, path: str) -> str | None:
    from carl.tasks import broken_repo_dir

    try:
        return (broken_repo_dir(task) / path).read_text()
    except (OSError, ValueError):
        return None


def _edit_call(e: Edit) -> str:
    return render_call(ToolCall("edit_file", {"path": e.path, "old": e.old, "new": e.new}))


def _wrong_edit(e: Edit) -> tuple[Edit, Edit] | None:
    """The same edit with the first integer literal of the restored code changed, if it has one,
    and the fix: (wrong edit, fixing edit)."""
    added = e.new
    m = re.search(r"(?<![\w.])(\d+)(?![\w.])", _code_only(added))
    if not m:
        return None
    offset = _code_offset(added)
    start, end = m.start(1) + offset, m.end(1) + offset
    bad = added[:start] + str(int(m.group(1)) + 1) + added[end:]
    return Edit(e.path, e.old, bad), Edit(e.path, bad, e.new)


SIBLING_FIX = "That is another function's body; writing this one's."


def _sibling_edit(e: Edit, file_text: str | None, rng: random.Random) -> tuple[Edit, Edit] | None:
    """The edit with the body of another function of the file in place of the restored body, and
    the fix: (wrong edit, fixing edit), or None where the file has no such function.

    The fix replaces the wrong body together with the line above it (the stub's docstring or `def`),
    since the copied body also stands in the function it came from."""
    if file_text is None or file_text.count(e.old) != 1 or _code_offset(e.new):
        return None
    indent = re.match(r"[ \t]*", e.new).group(0)
    bodies = []
    for m in re.finditer(r"^([ \t]*)def \w+\(.*\n(?:\1[ \t]+.*\n|[ \t]*\n)+", file_text, re.M):
        lines = [ln for ln in m.group(0).splitlines(keepends=True)[1:] if ln.strip()]
        body = "".join(ln for ln in lines if not ln.strip().startswith('"""'))
        if body and "NotImplementedError" not in body and body != e.new and body.startswith(indent):
            bodies.append(body)
    start = file_text.index(e.old)
    above = file_text[:start].splitlines(keepends=True)[-1:]
    if not bodies or not above:
        return None
    body = rng.choice(bodies)
    wrong_text = file_text[:start] + body + file_text[start + len(e.old):]
    if wrong_text.count(above[0] + body) != 1:
        return None
    return Edit(e.path, e.old, body), Edit(e.path, above[0] + body, above[0] + e.new)


def _code_offset(text: str) -> int:
    """Offset just past the docstring (if any): constants inside it are not code."""
    m = re.search(r'"""[\s\S]*?"""', text)
    return m.end() if m else 0


def _code_only(text: str) -> str:
    return text[_code_offset(text):]
