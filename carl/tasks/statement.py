"""Problem statements: what the agent is asked to do.

The template names the deleted definitions with their signatures and docstrings (read from the
original source) and the failing tests. It never shows a deleted body. `model_statement` asks an
OpenAI-compatible model to rewrite it as a user would (optional; needs carl.engine.openai_client).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path

from carl.tasks.doctests import is_doctest_id
from carl.tasks.delete import Candidate
from carl import pyast

MAX_LISTED_TESTS = 10
MAX_SUMMARY_CHARS = 160
"""Length budget of a definition's one-line summary (from its docstring) in a statement."""


def template_statement(
    original_root: Path, cand: Candidate, mode: str, fail_to_pass: list[str], pass_to_pass: Sequence[str] = ()
) -> str:
    """The task as a template: what was deleted, which tests must pass. When any FAIL_TO_PASS or
    PASS_TO_PASS test is a doctest, it also says that doctest examples are tests (the reward
    restores them from the original before grading)."""
    what = {
        "stub": "has been replaced by a stub that raises NotImplementedError",
        "remove": "has been removed from the code base",
    }[mode]
    lines = []
    if cand.kind == "module":
        lines.append(
            f"The module `{cand.definitions[0].module if cand.definitions else cand.module_file}` "
            f"(`{cand.module_file}`) {what}. Implement it again so that the test suite passes."
        )
        lines.append("")
        lines.append("It defined:")
    else:
        noun = "feature" if cand.kind == "cluster" else cand.kind
        lines.append(f"A {noun} of this repository {what}. Implement it again so that the test suite passes.")
        lines.append("")
        lines.append("Missing:" if mode == "remove" else "Stubbed:")
    for d in cand.definitions:
        if d.kind == "method" and cand.kind in ("class", "module"):
            continue  # the class's signature stands for its methods
        sig, doc = _signature_and_doc(original_root / d.file, d.start, d.end)
        lines.append(f"- `{d.module}.{d.qualname}` in `{d.file}`: `{sig}`")
        if doc:
            lines.append(f"  {summary_line(doc)}")
    lines.append("")
    shown = fail_to_pass[:MAX_LISTED_TESTS]
    lines.append("These tests currently fail and must pass:")
    lines += [f"- {t}" for t in shown]
    if len(fail_to_pass) > len(shown):
        lines.append(f"- ... and {len(fail_to_pass) - len(shown)} more")
    lines.append("")
    lines.append("Do not modify the tests.")
    if any(is_doctest_id(t) for t in [*fail_to_pass, *pass_to_pass]):
        lines.append(
            "Doctest examples in docstrings and documentation files are tests too: they are restored "
            "from the original before grading, so editing them changes nothing."
        )
    return "\n".join(lines) + "\n"


def summary_line(doc: str, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    """A docstring's first sentence, as one line of at most `max_chars` characters.

    The first paragraph (up to a blank line, a doctest prompt or a field list) is read as one
    line: authors wrap a first sentence over lines, so the docstring's first line often stops
    mid-sentence. The summary ends at the first sentence end ("e.g." and the like are not one).
    A first sentence over budget is cut at its last clause boundary (, ; : or a dash) in the
    budget's second half, else at its last word boundary, and " ..." marks the cut; a word is
    only cut when one word alone exceeds the budget.
    """
    para = []
    for line in doc.strip().splitlines():
        line = line.strip()
        if not line or line.startswith((">>>", ":")):
            break
        para.append(line)
    text = " ".join(para)
    end = _sentence_end(text)
    if end <= max_chars:
        return text[:end]
    room = max_chars - len(" ...")
    clause = max((m.start() for m in _CLAUSE.finditer(text[: room + 1])), default=0)
    word = text.rfind(" ", 0, room + 1)
    cut = clause if clause >= room // 2 else word if word > 0 else room
    return text[:cut].rstrip(" ,;:-") + " ..."


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_CLAUSE = re.compile(r"[,;:](?=\s)|\s(?:-{1,2}|\u2014)\s")
_NOT_AN_END = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def _sentence_end(text: str) -> int:
    """Index just past the first sentence of `text` (its length when it has no sentence end)."""
    for m in _SENTENCE_END.finditer(text):
        if not text[: m.end()].rsplit(None, 1)[-1].lower().endswith(_NOT_AN_END):
            return m.end()
    return len(text)


def model_statement(template: str, policy, max_new_tokens: int = 1024) -> str:
    """Rewrite the template as an issue a user would file. `policy` is a chat policy such as
    carl.engine.openai_client.OpenAIChatPolicy (`.chat(messages, max_new_tokens) -> str`)."""
    from carl.types import Message

    prompt = (
        "Rewrite this task description as a concise GitHub issue asking for the feature to be "
        "implemented. Keep every name, signature and test id exactly; do not invent behaviour; "
        "never write the implementation.\n\n" + template
    )
    text = policy.chat([Message(role="user", content=prompt)], max_new_tokens).strip()
    return (text or template.strip()) + "\n"


def _signature_and_doc(path: Path, start: int, end: int) -> tuple[str, str]:
    source = path.read_text()
    lines = source.splitlines()
    text = "\n".join(lines[start - 1 : end])
    try:
        tree = pyast.parse(_dedent(text))
    except SyntaxError:
        return lines[start - 1].strip(), ""
    node = next(
        (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), None
    )
    if node is None:
        return lines[start - 1].strip(), ""
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        sig = f"class {node.name}({bases})" if bases else f"class {node.name}"
    else:
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        sig = f"{prefix} {node.name}({ast.unparse(node.args)}){ret}"
    return sig, ast.get_docstring(node) or ""


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)
