"""The environment server in this process (uvicorn in a thread), for tests that need a remote backend."""

from __future__ import annotations

import socket
import threading
import time

from carl.sandbox import SandboxConfig
from carl.sandbox.server import ServerConfig, create_app

TOKEN = "test-token"


class RunningServer:
    def __init__(self, config: ServerConfig):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def config(self, **kw) -> SandboxConfig:
        """A client config for a sandbox on this server."""
        return SandboxConfig(backend="remote", server_url=self.url, server_token=TOKEN, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start(backend="local", **kw) -> RunningServer:
    return RunningServer(ServerConfig(token=TOKEN, sandbox=SandboxConfig(backend=backend), **kw))
