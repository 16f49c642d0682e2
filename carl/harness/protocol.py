"""The tool-call grammar, defined once: render and parse calls, render results, the prompt.

A tool call, as the model writes it:

    <tool name="edit_file"><path>a.py</path><old>x = 1</old><new>x = 2</new></tool>

Grammar (full text with examples in docs/protocol.md):

    call   := '<tool' WS 'name="' NAME '"' WS? '>' (WS? param)* WS? '</tool>'
    param  := '<' PNAME '>' value '</' PNAME '>'
    value  := (raw text | '<![CDATA[' any text not containing ']]>' ']]>')*

- Raw text is literal: no entities are decoded (`&lt;` stays `&lt;`, `a < b && c` is fine as is).
  It may not contain `</tool>`, its own closing tag `</PNAME>`, or `<![CDATA[`; a value that
  needs them wraps them in CDATA, and `]]>` inside CDATA is written `]]]]><![CDATA[>`.
- One newline right after the opening tag and one right before the closing tag are markup, not
  value (when they lie in raw text), so a multi-line value can start and end on its own lines.
  `<c>\nx\n</c>` and `<c>x</c>` both give "x"; to end a value with a newline, leave a blank line.
- Text outside tool calls is the assistant's thinking: kept in the message, ignored here.
- Calls are numbered in the order they appear (`index`), malformed ones included, and the
  parser never raises: a call it cannot accept becomes a `ToolError` (see `ToolErrorKind`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from carl.harness.tools.base import ParamSpec, ToolSpec
from carl.types import ToolCall, ToolError, ToolResult

_TOOL_OPEN = re.compile(r"<tool(?=[\s>/])")
_TOOL_START_TAG = re.compile(r'<tool\s+name\s*=\s*"([^"<>]*)"\s*>')
_PARAM_OPEN = re.compile(r"<([A-Za-z_][A-Za-z0-9_\-]*)>")
_CDATA_OPEN, _CDATA_CLOSE = "<![CDATA[", "]]>"
_TOOL_CLOSE = "</tool>"
_INT = re.compile(r"[+-]?\d+")
_BOOLS = {"true": True, "false": False}


# --------------------------------------------------------------------------- rendering


def render_call(call: ToolCall) -> str:
    """The canonical text of a call; `parse_calls` reads it back to the same name and params."""
    body = "".join(f"<{k}>{render_value(k, v)}</{k}>" for k, v in call.params.items())
    return f'<tool name="{call.name}">{body}</tool>'


def render_value(param: str, value: str) -> str:
    """A value as it goes between `<param>` and `</param>`: raw when it can be, else CDATA."""
    if f"</{param}>" in value or _TOOL_CLOSE in value or _CDATA_OPEN in value:
        return _CDATA_OPEN + value.replace(_CDATA_CLOSE, "]]]]><![CDATA[>") + _CDATA_CLOSE
    if "\n" in value:  # the markup newlines the parser drops, so the value round-trips exactly
        return "\n" + value + "\n"
    return value


def render_result(result: ToolResult) -> str:
    """One result as the model sees it in the tool message. Errors carry their kind."""
    attrs = f'index="{result.index}" tool="{result.tool}"'
    if result.error is not None:
        attrs += f' error="{result.error.kind}"'
    elif result.truncated:
        attrs += ' truncated="true"'
    return f"<result {attrs}>\n{result.output.rstrip(chr(10))}\n</result>"


def render_results(results: Sequence[ToolResult]) -> str:
    """All results of one assistant message, in call order, as one tool message."""
    return "\n".join(render_result(r) for r in results)


def format_error(error: ToolError) -> str:
    """The text of an error observation (the `output` of its ToolResult)."""
    text = error.message
    if error.kind == "unknown_tool" and error.valid_tools:
        text += "\nValid tools: " + ", ".join(error.valid_tools)
    return text


def tools_prompt(specs: Mapping[str, ToolSpec]) -> str:
    """The system-prompt section: how to call tools, then every tool with its parameters."""
    lines = [
        "# Tools",
        "",
        "Call a tool by writing a block like this anywhere in your reply:",
        "",
        '<tool name="edit_file"><path>src/a.py</path><old>x = 1</old><new>x = 2</new></tool>',
        "",
        "Parameter values are literal text (no escaping: write `<`, `&` and code as they are). One",
        "newline right after `<param>` and one right before `</param>` are ignored, so multi-line",
        "values can start and end on their own lines; leave a blank line before `</param>` to end",
        "the value with a newline. A value containing `</tool>`, its own closing tag or `<![CDATA[`",
        "must be wrapped as <![CDATA[...]]> (inside it, write `]]>` as `]]]]><![CDATA[>`).",
        "Several calls in one reply run in parallel and their results come back in order, so a call",
        "that needs another's effect (tests after an edit) goes in a later reply. Text outside tool",
        "calls is your own reasoning and is not executed.",
        "",
        "Available tools:",
    ]
    for spec in specs.values():
        lines += ["", f"## {spec.name}", spec.description]
        for p in spec.params:
            need = (
                "required"
                if p.required
                else "optional" + (f", default {_show(p.default)}" if p.default is not None else "")
            )
            lines.append(f"- <{p.name}> ({p.type}, {need}): {p.description}")
    return "\n".join(lines) + "\n"


def _show(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


# --------------------------------------------------------------------------- parsing


def parse_calls(text: str, specs: Mapping[str, ToolSpec]) -> list[ToolCall | ToolError]:
    """Every tool call in `text`, in order, each a ToolCall or a ToolError. Never raises."""
    out: list[ToolCall | ToolError] = []
    pos = 0
    while (m := _TOOL_OPEN.search(text, pos)) is not None:
        item, pos = _parse_one(text, m.start(), len(out), specs)
        out.append(item)
    return out


def _parse_one(
    text: str, start: int, index: int, specs: Mapping[str, ToolSpec]
) -> tuple[ToolCall | ToolError, int]:
    """Parse the call starting at `start`; returns it and the position after it."""
    tag = _TOOL_START_TAG.match(text, start)
    if tag is None:
        end = _skip_to_close(text, start + 1)
        return _error(
            "malformed", 'a tool call must start with <tool name="TOOL_NAME">', text[start:end], index
        ), end
    name = tag.group(1)
    params, error, end = _parse_body(text, tag.end())
    raw = text[start:end]
    if name not in specs:
        return _error(
            "unknown_tool", f"unknown tool {name!r}", raw, index, tool=name, valid_tools=tuple(specs)
        ), end
    if error is not None:
        kind, message, param = error
        return _error(kind, f"{name}: {message}", raw, index, tool=name, param=param), end
    spec = specs[name]
    values: dict[str, str] = {}
    for pname, value in params:
        if pname in values:
            return _error(
                "duplicate_param",
                f"{name}: parameter <{pname}> given more than once",
                raw,
                index,
                tool=name,
                param=pname,
            ), end
        values[pname] = value
    call = ToolCall(name=name, params=values, index=index)
    return validate_call(call, spec, raw) or call, end


def validate_call(call: ToolCall, spec: ToolSpec, raw: str = "") -> ToolError | None:
    """The first problem of `call`'s params against `spec` (extra, missing, bad value), or None."""
    name, values, index = call.name, call.params, call.index
    for pname in values:
        if pname not in spec.param_names:
            expected = ", ".join(p.name for p in spec.params) or "no parameters"
            return _error(
                "extra_param",
                f"{name}: unknown parameter <{pname}>; {name} takes: {expected}",
                raw,
                index,
                tool=name,
                param=pname,
            )
    for p in spec.params:
        if p.required and p.name not in values:
            return _error(
                "missing_param",
                f"{name}: missing required parameter <{p.name}> ({p.description})",
                raw,
                index,
                tool=name,
                param=p.name,
            )
        if p.name in values and (problem := _check_value(p, values[p.name])) is not None:
            return _error("bad_value", f"{name}: <{p.name}> {problem}", raw, index, tool=name, param=p.name)
    return None


def _parse_body(text: str, pos: int) -> tuple[list[tuple[str, str]], tuple[str, str, str | None] | None, int]:
    """Read `<param>value</param>`... up to `</tool>`.

    Returns (params, error, end) where error is (kind, message, param) or None and `end` is just
    past the call (past `</tool>` when there is one) so parsing resynchronises after a bad call."""
    params: list[tuple[str, str]] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith(_TOOL_CLOSE, pos):
            return params, None, pos + len(_TOOL_CLOSE)
        if pos >= len(text):
            return params, ("unclosed_tag", "the call has no closing </tool>", None), pos
        if _TOOL_OPEN.match(text, pos):  # a new call began before this one was closed
            return params, ("unclosed_tag", "the call has no closing </tool>", None), pos
        m = _PARAM_OPEN.match(text, pos)
        if m is None:
            snippet = text[pos : pos + 30].split("\n")[0]
            return (
                params,
                ("malformed", f"expected <param>value</param> or </tool>, found {snippet!r}", None),
                _skip_to_close(text, pos),
            )
        pname = m.group(1)
        value, pos = _read_value(text, m.end(), pname)
        if value is None:
            return params, ("unclosed_tag", f"parameter <{pname}> has no closing </{pname}>", pname), pos
        params.append((pname, value))


def _read_value(text: str, pos: int, pname: str) -> tuple[str | None, int]:
    """Read a value up to `</pname>`. Returns (value, position after the closing tag), or
    (None, resync position) when the closing tag is missing."""
    close = f"</{pname}>"
    pieces: list[tuple[bool, str]] = []  # (is_raw, text)
    while True:
        next_close = text.find(close, pos)
        next_cdata = text.find(_CDATA_OPEN, pos)
        next_tool_close = text.find(_TOOL_CLOSE, pos)
        if (
            next_cdata != -1
            and (next_close == -1 or next_cdata < next_close)
            and (next_tool_close == -1 or next_cdata < next_tool_close)
        ):
            pieces.append((True, text[pos:next_cdata]))
            data_start = next_cdata + len(_CDATA_OPEN)
            data_end = text.find(_CDATA_CLOSE, data_start)
            if data_end == -1:  # unterminated CDATA swallows the rest of the message
                return None, len(text)
            pieces.append((False, text[data_start:data_end]))
            pos = data_end + len(_CDATA_CLOSE)
            continue
        if next_close == -1 or (next_tool_close != -1 and next_tool_close < next_close):
            # the model forgot </pname>: raw values may not contain </tool>, so the call ends there
            return None, (next_tool_close + len(_TOOL_CLOSE)) if next_tool_close != -1 else len(text)
        pieces.append((True, text[pos:next_close]))
        break
    first_raw, first = pieces[0]
    if first_raw and first.startswith("\n"):
        pieces[0] = (True, first[1:])
    last_raw, last = pieces[-1]
    if last_raw and last.endswith("\n"):
        pieces[-1] = (True, last[:-1])
    return "".join(p for _, p in pieces), next_close + len(close)


def _skip_to_close(text: str, pos: int) -> int:
    """Resynchronise after an unreadable call: just past the next `</tool>`, or the next `<tool`
    (the model likely started a new call), or the end of the text."""
    close = text.find(_TOOL_CLOSE, pos)
    m = _TOOL_OPEN.search(text, pos)
    if m is not None and (close == -1 or m.start() < close):
        return m.start()
    return close + len(_TOOL_CLOSE) if close != -1 else len(text)


def _check_value(p: ParamSpec, value: str) -> str | None:
    """Why `value` is not a valid `p.type`, or None when it is."""
    v = value.strip()
    if p.type == "int" and not _INT.fullmatch(v):
        return f"must be an integer, got {_clip(value)!r}"
    if p.type == "bool" and v.lower() not in _BOOLS:
        return f"must be true or false, got {_clip(value)!r}"
    return None


def typed_value(p: ParamSpec, value: str) -> str | int | bool:
    """The Python value of a raw value that passed `_check_value`."""
    if p.type == "int":
        return int(value.strip())
    if p.type == "bool":
        return _BOOLS[value.strip().lower()]
    return value


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _error(
    kind: str,
    message: str,
    raw: str,
    index: int,
    *,
    tool: str | None = None,
    param: str | None = None,
    valid_tools: tuple[str, ...] = (),
) -> ToolError:
    return ToolError(
        kind=kind,
        message=message,
        tool=tool,
        param=param,  # type: ignore[arg-type]
        valid_tools=valid_tools,
        raw=raw,
        index=index,
    )
