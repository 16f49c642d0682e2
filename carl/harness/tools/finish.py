"""finish: the agent declares its work done; a successful call ends the episode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolSpec
from carl.sandbox.base import Sandbox


class Finish:
    spec = ToolSpec(
        name="finish",
        description="Declare the task complete and end the episode. Call it alone, after your last edit.",
        params=(ParamSpec("message", "str", "a short summary of what you did", required=False),),
        ends_episode=True,
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        message = (params.get("message") or "").strip()
        return "Episode finished." + (f" Summary: {message}" if message else "")
