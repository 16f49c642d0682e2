"""Every piece of text the harness itself says to the model.

Production and RL rollouts use exactly these strings, so a change here changes what a trained
model expects: treat them as part of the model's interface.
"""

from __future__ import annotations

SYSTEM_INTRO = """\
You are a coding agent working in a private copy of a software repository. You act only through \
the tools below. Work step by step: explore the code, make your changes, check them (lint, run \
the tests), and call the finish tool when the task is done."""

NO_TOOL_CALL_NOTICE = (
    "Your reply contained no tool call, so nothing happened. Act through tools, written as "
    '<tool name="TOOL_NAME"><PARAM>value</PARAM></tool>, and call the finish tool when you are done.'
)
"""The observation sent back when a reply has no tool call (and no parse error either), so the
model learns that plain text does nothing. Its exact wording is part of the model interface."""

SUMMARY_REQUEST = """\
Your context is nearly full and will be reset. Write a summary of your progress so that you can \
continue from it alone: what the task is about, what you found (files, functions, causes), what \
you changed, what you verified, and what remains to do next. Be concise and specific (file \
paths, names, test ids). Do not call any tools in this reply."""
"""The user message that asks for a self-summary when a segment nears its context budget."""


def system_prompt(tools_text: str) -> str:
    """The system message: the harness intro followed by the tool list (`protocol.tools_prompt`)."""
    return f"{SYSTEM_INTRO}\n\n{tools_text.strip()}\n"


def task_prompt(problem_statement: str) -> str:
    """The first user message of an episode."""
    return f"<task>\n{problem_statement.strip()}\n</task>"


def resume_prompt(problem_statement: str, summary: str) -> str:
    """The first user message of a segment after a context reset: the task and the latest summary
    (each summary was written with the previous one in view, so it carries what still matters)."""
    return (
        f"{task_prompt(problem_statement)}\n\n"
        "You already worked on this task; your context was reset. Your summary of the work so far:\n"
        f"<summary>\n{summary.strip()}\n</summary>\n"
        "Continue from where you left off."
    )


def truncated_prompt(problem_statement: str) -> str:
    """The first user message of a segment that a truncating context (no summary) started: the task,
    and a notice that earlier turns were dropped (the last turn follows it)."""
    return (
        f"{task_prompt(problem_statement)}\n\n"
        "You already worked on this task; your context was full, so your earlier turns were dropped. "
        "Your last turn follows. Continue from where you left off."
    )
