"""An ASGI gate in front of an HTTP API: the bearer token first, then the body under a size cap.

A request without a valid token gets 401 before a byte of its body is read (FastAPI would parse
a body before running a dependency that checks the token). An authenticated body is read here,
its bytes counted as they arrive (with Content-Length or chunked), and refused with 413 as soon
as it passes the cap; the app then reads it from memory. Both refusals close the connection, so
the rest of the body is never read either. The caller's identity (whatever `authenticate`
returned for the token) is left in `scope["state"]["user"]`, which Starlette shows as
`request.state.user`.

Used by the environment server (`carl.sandbox.server`, one token) and by `carl serve`
(`carl.online.service`, one token per user).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection


class BearerGate:
    def __init__(self, app, authenticate: Callable[[bytes], str | None], body_cap: Callable[[str], tuple[str, int]],
                 open_paths: Collection[str] = ()):
        """`authenticate(token bytes)` -> the caller's name, or None to refuse; `body_cap(path)` ->
        (what the body is called in the 413 message, e.g. "request", its cap in MiB); GET requests of
        `open_paths` (a health check) pass without a token."""
        self.app = app
        self.state = app.state  # `create_app(...).state`, as on the FastAPI app
        self._authenticate, self._body_cap, self._open = authenticate, body_cap, frozenset(open_paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or (scope["method"] == "GET" and scope["path"] in self._open):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        user = self._authenticate(given) if scheme.lower() == b"bearer" and given else None
        if user is None:
            return await refuse(send, 401, "auth", "missing or wrong bearer token")
        scope.setdefault("state", {})["user"] = user
        what, cap_mb = self._body_cap(scope["path"])
        cap_bytes = int(cap_mb * (1 << 20))
        too_large = f"{what} body over max_{what}_mb={cap_mb}"
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > cap_bytes:
            return await refuse(send, 413, "too_large", f"{too_large} (Content-Length {int(declared)})")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > cap_bytes:
                return await refuse(send, 413, "too_large", too_large)
            if not message.get("more_body", False):
                break
        body = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        del chunks

        async def replay():
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)


async def refuse(send, status: int, kind: str, message: str) -> None:
    """Answer {"kind", "message"} with `status` and close the connection."""
    content = json.dumps({"kind": kind, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
               (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
