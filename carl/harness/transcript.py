"""Human-readable transcripts of trajectories, with rich.

Used live by `carl agent run` (one turn at a time, through `run_episode(on_turn=...)`), by the
demo, and by the trainer for the sample transcripts saved in every run directory
(`transcript_text`). Display only: long tool outputs are cut to `max_output_lines` here, the
trajectory itself is untouched.
"""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from carl.types import ToolResult, Trajectory, Turn


def render_task(task_id: str, problem_statement: str) -> RenderableType:
    return Panel(Text(problem_statement.strip()), title=f"task {task_id}", title_align="left", border_style="blue")


def render_turn(turn: Turn, number: int, max_output_lines: int = 30) -> RenderableType:
    """One assistant message and its results (turn `number`, counted from 1)."""
    kind = "summary" if turn.is_summary else "assistant"
    title = f"turn {number} · {kind} · segment {turn.segment} · {turn.wall_s:.1f}s"
    title += {"length": " · cut at the token limit", "repeat": " · cut: it repeated itself"}.get(turn.finish_reason, "")
    style = "magenta" if turn.is_summary else "cyan"
    parts: list[RenderableType] = [Panel(Text(turn.assistant.strip() or "(empty reply)"), title=title,
                                         title_align="left", border_style=style)]
    parts += [render_result(r, max_output_lines) for r in turn.results]
    if not turn.results and not turn.is_summary:
        parts.append(Text("  (no tool call)", style="yellow"))
    return Group(*parts)


def render_result(result: ToolResult, max_output_lines: int = 30) -> RenderableType:
    if result.error is not None:
        title, style = f"[{result.index}] {result.tool} · error: {result.error.kind}", "red"
    else:
        title, style = f"[{result.index}] {result.tool} · {result.duration_s:.2f}s", "green"
    if result.truncated:
        title += " · truncated"
    lines = result.output.rstrip("\n").split("\n")
    if len(lines) > max_output_lines:
        cut = len(lines) - max_output_lines
        lines = lines[: max_output_lines // 2] + [f"... ({cut} lines not shown) ..."] + lines[-(max_output_lines // 2):]
    return Panel(Text("\n".join(lines)), title=title, title_align="left", border_style=style, padding=(0, 1))


def render_outcome(traj: Trajectory) -> RenderableType:
    style = "red" if traj.stop_reason.is_infra_failure else "bold"
    line = (f"stop: {traj.stop_reason.value} · turns {len(traj.turns)} · tool calls {traj.num_tool_calls} "
            f"(errors {traj.num_tool_errors}) · segments {len(traj.segments)}")
    if traj.num_tokens:  # token-level policies only; chat policies record messages
        line += f" · tokens {traj.num_tokens} (generated {traj.num_generated_tokens})"
    text = Text(line + f" · {traj.wall_s:.1f}s", style=style)
    if traj.error:
        text.append("\n" + traj.error.rstrip(), style="red")
    return text


def print_trajectory(traj: Trajectory, console: Console | None = None, problem_statement: str | None = None,
                     max_output_lines: int = 30) -> None:
    console = console or Console()
    if problem_statement is not None:
        console.print(render_task(traj.task_id, problem_statement))
    for i, turn in enumerate(traj.turns, 1):
        console.print(render_turn(turn, i, max_output_lines))
    console.print(render_outcome(traj))


def transcript_text(traj: Trajectory, problem_statement: str | None = None, width: int = 110,
                    max_output_lines: int = 30) -> str:
    """The transcript as plain text (no colour codes), e.g. for a run directory's samples."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, force_terminal=False, highlight=False)
    print_trajectory(traj, console, problem_statement, max_output_lines)
    return buf.getvalue()
