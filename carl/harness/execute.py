"""Run the tool calls of one assistant message: in parallel, results in call order.

    parse_calls(text) -> [ToolCall | ToolError, ...]
                              |            |
                 thread pool: tool.run   error observation (no execution)
                              |            |
                          [ToolResult, ...]  (call order, every output capped)

Calls of one message run concurrently, so the order of their side effects is not defined: a
model that wants "edit, then test" must use two messages (the tool prompt says calls run in
parallel). Failures become data: a parse error, a `ToolFailure`, a path outside the workspace or
any exception a tool raises becomes a ToolResult with `error` set, so one bad call never stops the
episode. The one exception is `SandboxError` (the sandbox itself died: an infrastructure failure
that must be masked from training, not scored): it is re-raised after all calls have finished.

Every call also has a wall-clock limit (`call_timeout_s`, above every tool's own limit): a call
still running then becomes an error observation and the episode goes on. Commands are killed by
their sandbox's own timeouts and file operations never block (carl.sandbox.workspace), so this
limit only catches what nothing else does; a Python thread cannot be killed, so such a call's
worker is left to finish on its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

from carl.harness.protocol import format_error, render_call, typed_value, validate_call
from carl.harness.tools.base import Tool, ToolFailure, cap_output
from carl.sandbox.base import Sandbox, SandboxError, SandboxPathError
from carl.types import ToolCall, ToolError, ToolResult

CALL_TIMEOUT_S = 900.0
"""Wall-clock limit of one call: above run_terminal's largest timeout (600 s) and run_tests' (300 s)."""


def run_calls(
    calls: Sequence[ToolCall | ToolError],
    tools: Mapping[str, Tool],
    sandbox: Sandbox,
    *,
    max_output_chars: int = 20_000,
    call_timeout_s: float = CALL_TIMEOUT_S,
) -> list[ToolResult]:
    """One ToolResult per item of `calls`, in the same order (index = the item's index)."""
    results: list[ToolResult | None] = [None] * len(calls)
    runnable: list[tuple[int, ToolCall, Tool]] = []
    for i, item in enumerate(calls):
        problem = _problem(item, tools)
        if problem is not None:
            results[i] = error_result(problem)
        else:
            runnable.append((i, item, tools[item.name]))  # type: ignore[union-attr]
    if runnable:
        pool = _pool()
        futures = [(i, pool.submit(_run_one, call, tool, sandbox, max_output_chars)) for i, call, tool in runnable]
        deadline = time.monotonic() + call_timeout_s
        infra_error: SandboxError | None = None
        for (i, future), (_, call, _) in zip(futures, runnable, strict=True):
            try:
                results[i] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except SandboxError as e:
                infra_error = infra_error or e
            except FuturesTimeout:
                message = f"{call.name} did not finish within {call_timeout_s:g} s; it was abandoned"
                results[i] = error_result(ToolError(kind="execution", message=message, tool=call.name,
                                                    raw=render_call(call), index=call.index))
        if infra_error is not None:
            raise infra_error
    return [r for r in results if r is not None]


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
POOL_WORKERS = 64
"""Threads shared by every episode of the process. A pool per message paid a thread start per
call (about 0.1 ms idle, several ms on a loaded machine), which dominated cheap calls such as
reads; idle workers are reused. 64 covers many concurrent episodes' calls at once (a call waits
for a free worker only beyond that)."""


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=POOL_WORKERS, thread_name_prefix="tool")
        return _POOL


def error_result(error: ToolError) -> ToolResult:
    """The observation for a call that failed to parse, validate or run."""
    return ToolResult(
        tool=error.tool or "", output=format_error(error), ok=False, error=error, index=error.index
    )


def _problem(item: ToolCall | ToolError, tools: Mapping[str, Tool]) -> ToolError | None:
    if isinstance(item, ToolError):
        return item
    if item.name not in tools:
        return ToolError(
            kind="unknown_tool",
            message=f"unknown tool {item.name!r}",
            tool=item.name,
            valid_tools=tuple(tools),
            index=item.index,
        )
    return validate_call(item, tools[item.name].spec)


def _run_one(call: ToolCall, tool: Tool, sandbox: Sandbox, max_output_chars: int) -> ToolResult:
    start = time.perf_counter()
    params: dict[str, Any] = {}
    for p in tool.spec.params:
        if p.name in call.params:
            params[p.name] = typed_value(p, call.params[p.name])
        elif p.default is not None:
            params[p.name] = p.default
    try:
        output = tool.run(params, sandbox)
    except SandboxError:
        raise
    except (ToolFailure, SandboxPathError) as e:
        message = str(e)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        message = f"{type(e).__name__}: {e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    except Exception as e:  # noqa: BLE001 - a tool bug must become an observation, not end the episode
        message = f"the tool crashed: {type(e).__name__}: {e}"
    else:
        output, truncated = cap_output(output, max_output_chars)
        return ToolResult(
            tool=call.name,
            output=output,
            ok=True,
            truncated=truncated,
            duration_s=time.perf_counter() - start,
            index=call.index,
        )
    message, _ = cap_output(f"{call.name} failed: {message}", max_output_chars)
    error = ToolError(
        kind="execution", message=message, tool=call.name, raw=render_call(call), index=call.index
    )
    return ToolResult(
        tool=call.name,
        output=format_error(error),
        ok=False,
        error=error,
        duration_s=time.perf_counter() - start,
        index=call.index,
    )
