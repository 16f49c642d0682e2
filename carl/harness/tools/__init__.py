"""The agent's tools, one small module per family. `default_tools()` is the production tool set.

tools = default_tools(ToolsConfig())
prompt = protocol.tools_prompt({n: t.spec for n, t in tools.items()})
results = execute.run_calls(protocol.parse_calls(text, specs), tools, sandbox)
"""

from __future__ import annotations

from pathlib import Path

from carl.harness.tools.base import ParamSpec, Tool, ToolFailure, ToolsConfig, ToolSpec, cap_output
from carl.harness.tools.embedder import Embedder
from carl.harness.tools.files import EditFile, ListDir, ReadFile, WriteFile
from carl.harness.tools.finish import Finish
from carl.harness.tools.lint import Lint
from carl.harness.tools.search import Glob, Grep
from carl.harness.tools.semantic import SemanticSearch
from carl.harness.tools.terminal import RunTerminal
from carl.harness.tools.tests import RunTests

__all__ = [
    "ParamSpec",
    "Tool",
    "ToolFailure",
    "ToolSpec",
    "ToolsConfig",
    "cap_output",
    "default_tools",
    "specs_of",
]


def default_tools(
    config: ToolsConfig | None = None,
    *,
    embedder: Embedder | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, Tool]:
    """name -> tool, in the order the system prompt lists them. `embedder` / `cache_dir` replace
    semantic_search's MiniLM and its on-disk cache (tests pass a fast fake)."""
    cfg = config or ToolsConfig()
    tools: list[Tool] = [
        ReadFile(),
        WriteFile(),
        EditFile(),
        ListDir(),
        Glob(),
        Grep(),
        SemanticSearch(embedder, cache_dir, default_k=cfg.semantic_top_k),
        Lint(),
        RunTerminal(cfg.terminal_timeout_s, cfg.max_terminal_timeout_s),
        RunTests(cfg.tests_timeout_s, cfg.max_output_chars, durations=cfg.test_durations),
        Finish(),
    ]
    return {t.spec.name: t for t in tools}


def specs_of(tools: dict[str, Tool]) -> dict[str, ToolSpec]:
    return {name: t.spec for name, t in tools.items()}
