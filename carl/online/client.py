"""A client of `carl serve` (what an editor plugin or a CLI does), over httpx.

    client = ServeClient("http://127.0.0.1:8400", token)
    session = client.open_session("myproject")
    for event in client.ask(session["id"], "Make parse_date accept ISO weeks"):
        ...  # {"event": "start"|"turn"|"done"|"error", ...}
    client.signal(session["id"], 0, "thumbs", value=1)

Errors come back as ServeError with the service's HTTP status, kind and message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


class ServeError(RuntimeError):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status, self.kind, self.message = status, kind, message


class ServeClient:
    def __init__(self, url: str, token: str, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(timeout_s, connect=10.0))

    def open_session(self, workspace: str) -> dict[str, Any]:
        return self._call("POST", "/v1/sessions", {"workspace": workspace})

    def sessions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/sessions")["sessions"]

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{session_id}")

    def ask(self, session_id: str, text: str) -> Iterator[dict[str, Any]]:
        """The request's events as they arrive (NDJSON), ending with "done" (or "error")."""
        with self.http.stream("POST", f"/v1/sessions/{session_id}/requests", json={"text": text}) as r:
            if r.status_code != 200:
                r.read()
                raise _error(r)
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def run(self, session_id: str, text: str) -> dict[str, Any]:
        """Ask and wait: the "done" event, with the turns that came before it under "turns"."""
        turns = []
        for event in self.ask(session_id, text):
            if event["event"] == "turn":
                turns.append(event)
            elif event["event"] == "error":
                raise ServeError(500, "episode", event["message"])
            elif event["event"] == "done":
                return {**event, "turns": turns}
        raise ServeError(500, "stream", "the stream ended without a 'done' event")

    def request(self, session_id: str, index: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{session_id}/requests/{index}")

    def signal(self, session_id: str, index: int, kind: str, value: float | None = None,
               text: str | None = None) -> int:
        body = {"kind": kind, "value": value, "text": text}
        return self._call("POST", f"/v1/sessions/{session_id}/requests/{index}/signals", body)["id"]

    def deploy(self, version: int) -> dict[str, Any]:
        return self._call("POST", "/v1/admin/deploy", {"version": version})

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, path, json=body) if body is not None else self.http.request(method, path)
        if r.status_code != 200:
            raise _error(r)
        return r.json()


def _error(r: httpx.Response) -> ServeError:
    try:
        data = r.json()
        return ServeError(r.status_code, data.get("kind", "?"), data.get("message", str(data)))
    except ValueError:
        return ServeError(r.status_code, "?", r.text[:300])
