"""`carl serve`: the production agent as an HTTP service, on the same harness as training.

    client (editor plugin, CLI, chat UI)            carl serve (this module)
      POST /v1/sessions {"workspace"}  ---------->  BearerGate: token -> user, body under a cap
                                                    copy workspaces/<user>/<workspace> -> session copy
      POST /v1/sessions/{id}/requests {"text"} -->  run_episode(engine, sandbox over the session copy)
        <-- NDJSON: start, turn, turn, ..., done      each turn stored as it ends (FeedbackStore)
            (done carries the edits: a unified diff)  the edits applied to the session copy
      POST .../requests/{i}/signals {"kind", ...}   thumbs, comment, kept, reverted, tests, followup
      GET  /v1/sessions, /v1/sessions/{id}, .../requests/{i}, /v1/workspaces
      POST /v1/admin/deploy {"version"}  (admin)    engine.update_weights: a hot swap, between
                                                    generations, no request dropped

Every request but `GET /v1/health` needs `Authorization: Bearer <token>` of a user in the users
file (`carl.online.auth`); the token is checked before a byte of the body is read. A user sees
only their own sessions and workspaces: another user's session id answers 404, exactly as an id
that does not exist. Each request of a session is one agent episode in a fresh sandbox over the
session's working copy; its trajectory (token ids, log-probs and the weights version of every
sampled token, `carl.types.Segment`) is stored when the episode ends, so `carl online` trains
on exactly what the model saw and sampled.

Errors are JSON {"kind", "message"}: 400 request (a field missing, of the wrong type or out of
range; the message names it), 401 auth, 403 forbidden (not an admin), 404 not_found, 409 busy
(the session is running a request), 413 too_large, 429 capacity (max_concurrent_requests run),
500 internal.
"""

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.harness.tools import default_tools
from carl.harness.tools.base import Tool
from carl.io import atomic_write_json
from carl.online.auth import Users
from carl.online.store import SIGNAL_KINDS, FeedbackStore, StoreConfig
from carl.online.workspaces import WorkspaceNotFound, apply_changes, copy_workspace, list_workspaces, workspace_dir
from carl.rewards.diff import workspace_changes
from carl.sandbox import open_sandbox
from carl.sandbox.base import SandboxConfig
from carl.types import Turn, to_jsonable

HEALTH_PATH = "/v1/health"


@dataclass(frozen=True)
class ServeConfig:
    workspaces: str
    """Root of the users' workspaces: <workspaces>/<user>/<name> is user's workspace <name>."""
    state_dir: str
    """Where session working copies live (<state_dir>/sessions/<id>/repo)."""
    users_file: str
    """The users and their token hashes (carl.online.auth)."""
    store: StoreConfig = field(default_factory=StoreConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    limits: EpisodeLimits = field(default_factory=lambda: EpisodeLimits(max_turns=30, stop_on_no_call=True))
    """The agent's limits per request; production ends a request when a reply has no tool call
    (the agent answers the user) instead of sending the RL notice."""
    max_concurrent_requests: int = 8
    """Requests (episodes) running at once over all users; one more is refused with 429."""
    max_sessions_per_user: int = 1000
    max_request_chars: int = 20_000
    """Longest request text accepted."""
    max_request_kb: int = 256
    """Largest accepted HTTP body, in KiB (413 beyond)."""
    seed: int = 0
    """Names each request's sampling stream (the engine's `episode(key)`, key = "session/index")."""

    def __post_init__(self) -> None:
        for name in ("workspaces", "state_dir", "users_file"):
            if not getattr(self, name):
                raise ValueError(f"serve.{name}: empty; expected a path")
        for name in ("max_concurrent_requests", "max_sessions_per_user", "max_request_chars", "max_request_kb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"serve.{name}: got {getattr(self, name)!r}, expected a positive integer")
        if self.sandbox.backend == "remote":
            raise ValueError("serve.sandbox.backend: got 'remote'; the service runs its sandboxes on this host")


class NotFound(LookupError):
    pass


class Busy(RuntimeError):
    pass


class Capacity(RuntimeError):
    pass


class Forbidden(PermissionError):
    pass


class Service:
    """Sessions, requests, signals and deploys: everything `carl serve` does but HTTP.

    `engine` is a token policy (`generate`, `tokenizer`, `policy_version`), e.g. carl.engine.hf.HFEngine
    or carl.engine.vllm.VLLMEngine; with `episode(key)` each request samples from its own named
    stream; with `update_weights(version)` it can be deployed to."""

    def __init__(self, config: ServeConfig, engine: Any, store: FeedbackStore | None = None,
                 tools: Mapping[str, Tool] | None = None, users: Users | None = None):
        self.config, self.engine = config, engine
        self.users = users or Users(config.users_file)
        self.store = store or FeedbackStore(config.store)
        self.tools = dict(tools) if tools is not None else default_tools()
        self.sessions_dir = Path(config.state_dir) / "sessions"
        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        self._slots = threading.BoundedSemaphore(config.max_concurrent_requests)
        self._running: set[str] = set()  # sessions with a request in flight
        self._lock = threading.Lock()
        self._deploy_lock = threading.Lock()
        self.deploys: list[dict[str, Any]] = []
        self.deployed_path = Path(config.state_dir) / "deployed.json"
        if self.deployed_path.exists():  # a restarted service serves what was deployed, not the base
            version = json.loads(self.deployed_path.read_text())["version"]
            try:
                engine.update_weights(version)
            except Exception as e:  # noqa: BLE001 - say what to do, whatever the engine raised
                raise ValueError(f"serve: {self.deployed_path} says version {version} was deployed, but the "
                                 f"engine cannot load it ({e}); deploy again with `carl online`, or remove "
                                 "that file to serve the checkpoint's own weights") from None

    @property
    def model_version(self) -> int:
        return int(getattr(self.engine, "policy_version", 0))

    # ------------------------------------------------------------------ sessions

    def open_session(self, user: str, workspace: object) -> dict[str, Any]:
        source = workspace_dir(self.config.workspaces, user, workspace)
        if len(self.store.list_sessions(user)) >= self.config.max_sessions_per_user:
            raise Capacity(f"you have max_sessions_per_user={self.config.max_sessions_per_user} sessions")
        session_id = self.store.create_session(user, str(workspace), self.model_version)
        copy_workspace(source, self.sessions_dir / session_id / "repo")
        return self.session(user, session_id)

    def session(self, user: str, session_id: str) -> dict[str, Any]:
        found = self.store.get_session(session_id, user=user)
        if found is None:
            raise NotFound(f"session {session_id[:40]!r}: no such session of yours")
        return found

    def request(self, user: str, session_id: str, index: int) -> dict[str, Any]:
        self.session(user, session_id)
        found = self.store.get_request(session_id, index)
        if found is None:
            raise NotFound(f"request {index} of session {session_id!r}: no such request")
        return found

    def workspaces(self, user: str) -> list[str]:
        return list_workspaces(self.config.workspaces, user)

    # ------------------------------------------------------------------ requests

    def begin_request(self, user: str, session_id: str, text: object) -> int:
        """Check and reserve: the session is the user's and idle, a slot is free. Returns the new
        request's index; `run_request` must follow (it releases what this took)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text: got {str(text)[:80]!r}, expected the request as a non-empty string")
        if len(text) > self.config.max_request_chars:
            raise ValueError(f"text: {len(text)} characters, expected at most max_request_chars="
                             f"{self.config.max_request_chars}")
        self.session(user, session_id)
        with self._lock:
            if session_id in self._running:
                raise Busy(f"session {session_id!r} is running a request; wait for its 'done' event")
            if not self._slots.acquire(blocking=False):
                raise Capacity(f"max_concurrent_requests={self.config.max_concurrent_requests} requests "
                               "are running; retry shortly")
            self._running.add(session_id)
        try:
            return self.store.add_request(session_id, text, self.model_version)
        except BaseException:
            self._release(session_id)
            raise

    def run_request(self, session_id: str, index: int, text: str,
                    emit: Callable[[dict[str, Any]], None] = lambda event: None) -> dict[str, Any]:
        """One agent episode answering request `index`; every turn is stored and emitted as it ends,
        then the edits are applied to the session copy and the request is finished in the store."""
        try:
            return self._run(session_id, index, text, emit)
        finally:
            self._release(session_id)

    def _run(self, session_id: str, index: int, text: str, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        start = time.monotonic()
        version = self.model_version
        emit({"event": "start", "request": index, "model_version": version})
        repo = self.sessions_dir / session_id / "repo"
        key = f"{session_id}/{index}"
        policy = self.engine.episode(key) if hasattr(self.engine, "episode") else self.engine
        turns = itertools.count()

        def on_turn(turn: Turn) -> None:
            record = turn_record(turn)
            self.store.add_turn(session_id, index, next(turns), record)
            emit({"event": "turn", **record})

        edits, skipped = "", []
        with open_sandbox(str(repo), self.config.sandbox) as sandbox:
            traj = run_episode(policy, sandbox, TextTask(key, text), self.config.limits, self.tools, on_turn=on_turn)
            traj.policy_version = version
            if not traj.stop_reason.is_infra_failure:
                changes = workspace_changes(sandbox, str(repo))
                skipped = apply_changes(repo, changes)
                edits = changes.text
        latency = time.monotonic() - start
        self.store.finish_request(session_id, index, stop_reason=traj.stop_reason.value, edits=edits,
                                  trajectory=traj.to_dict(), latency_s=latency)
        done = {"event": "done", "request": index, "stop_reason": traj.stop_reason.value, "edits": edits,
                "skipped_paths": skipped, "latency_s": latency, "model_version": version}
        emit(done)
        return done

    def _release(self, session_id: str) -> None:
        with self._lock:
            if session_id in self._running:
                self._running.discard(session_id)
                self._slots.release()

    # ------------------------------------------------------------------ signals and deploys

    def add_signal(self, user: str, session_id: str, index: object, body: Mapping[str, Any]) -> int:
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"request index: got {index!r}, expected a non-negative integer")
        self.request(user, session_id, index)
        kind = body.get("kind")
        if kind not in SIGNAL_KINDS:
            raise ValueError(f"kind: got {str(kind)[:40]!r}, expected one of {', '.join(SIGNAL_KINDS)}")
        value, text = body.get("value"), body.get("text")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"value: got {str(value)[:40]!r}, expected a number or null")
        if text is not None and (not isinstance(text, str) or len(text) > self.config.max_request_chars):
            raise ValueError(f"text: expected a string of at most {self.config.max_request_chars} characters or null")
        return self.store.add_signal(session_id, index, kind, None if value is None else float(value), text)

    def deploy(self, user: str, version: object) -> dict[str, Any]:
        """Hot-swap the engine to weights `version` (admin only). The engine loads it between
        generations: requests in flight finish their turn, none is dropped."""
        if not self.users.is_admin(user):
            raise Forbidden(f"user {user!r} is not an admin; deploys need an admin token")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version: got {version!r}, expected a non-negative integer")
        if not hasattr(self.engine, "update_weights"):
            raise ValueError("this service's engine cannot load new weights")
        with self._deploy_lock:
            previous = self.model_version
            t0 = time.monotonic()
            self.engine.update_weights(version)
            record = {"version": version, "previous": previous, "at": time.time(), "swap_s": time.monotonic() - t0}
            self.deploys.append(record)
            atomic_write_json(self.deployed_path, record)
        return record

    def close(self) -> None:
        self.store.close()


def turn_record(turn: Turn) -> dict[str, Any]:
    """What the client sees of a turn (and the store keeps before the episode's trajectory lands)."""
    return {
        "assistant": turn.assistant,
        "calls": [to_jsonable(c) for c in turn.calls],
        "results": [{"tool": r.tool, "ok": r.ok, "output": r.output, "index": r.index} for r in turn.results],
        "is_summary": turn.is_summary,
        "wall_s": turn.wall_s,
        "token_ids": None, "logprobs": None, "prompt_ids": None, "versions": None,  # in the trajectory
    }


# ---------------------------------------------------------------------- HTTP


def create_app(service: Service):
    """The FastAPI app behind BearerGate (FastAPI imported lazily: `carl --help` stays fast). This
    module has no `from __future__ import annotations`: FastAPI reads the endpoints' annotations."""
    import anyio.to_thread
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    from carl.sandbox.gate import BearerGate

    app = FastAPI(title="carl serve")
    app.state.service = service

    def error(status: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"kind": kind, "message": message})

    for exc_type, status, kind in ((NotFound, 404, "not_found"), (WorkspaceNotFound, 404, "not_found"),
                                   (Busy, 409, "busy"), (Capacity, 429, "capacity"),
                                   (Forbidden, 403, "forbidden"), (ValueError, 400, "request")):
        app.add_exception_handler(exc_type, lambda request, exc, s=status, k=kind: error(s, k, str(exc)))

    @app.exception_handler(Exception)
    async def on_bug(request, exc):  # still logged with its traceback by the server
        return error(500, "internal", f"{type(exc).__name__}: {exc}")

    def user_of(request: Request) -> str:
        return request.state.user

    async def json_body(request: Request) -> dict:
        try:
            import json

            body = json.loads(await request.body())
        except ValueError as e:
            raise ValueError(f"request body: not valid JSON ({e}); expected a JSON object") from None
        if not isinstance(body, dict):
            raise ValueError(f"request body: got {str(body)[:60]!r}, expected a JSON object")
        return body

    @app.get(HEALTH_PATH)
    async def health():
        return {"ok": True, "model_version": service.model_version}

    @app.get("/v1/workspaces")
    def workspaces(user: str = Depends(user_of)):
        return {"workspaces": service.workspaces(user)}

    @app.post("/v1/sessions")
    def open_session(user: str = Depends(user_of), body: dict = Depends(json_body)):
        return service.open_session(user, body.get("workspace"))

    @app.get("/v1/sessions")
    def sessions(user: str = Depends(user_of)):
        return {"sessions": service.store.list_sessions(user)}

    @app.get("/v1/sessions/{session_id}")
    def session(session_id: str, user: str = Depends(user_of)):
        return service.session(user, session_id)

    @app.post("/v1/sessions/{session_id}/requests")
    def new_request(session_id: str, user: str = Depends(user_of), body: dict = Depends(json_body)):
        text = body.get("text")
        index = service.begin_request(user, session_id, text)
        events: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                service.run_request(session_id, index, text, events.put)
            except Exception as e:  # noqa: BLE001 - the client hears of it; the store has the turns so far
                events.put({"event": "error", "request": index, "message": f"{type(e).__name__}: {e}"})
            finally:
                events.put(None)

        # the episode runs to its end even when the client goes away: its records are the product
        threading.Thread(target=work, name=f"carl-request-{session_id}-{index}", daemon=True).start()

        async def stream():
            import json

            while (event := await anyio.to_thread.run_sync(events.get)) is not None:
                yield json.dumps(event) + "\n"

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.get("/v1/sessions/{session_id}/requests/{index}")
    def get_request(session_id: str, index: int, user: str = Depends(user_of)):
        return service.request(user, session_id, index)

    @app.post("/v1/sessions/{session_id}/requests/{index}/signals")
    def signal(session_id: str, index: int, user: str = Depends(user_of), body: dict = Depends(json_body)):
        return {"id": service.add_signal(user, session_id, index, body)}

    @app.post("/v1/admin/deploy")
    def deploy(user: str = Depends(user_of), body: dict = Depends(json_body)):
        return service.deploy(user, body.get("version"))

    @app.get("/v1/admin/status")
    def status(user: str = Depends(user_of)):
        if not service.users.is_admin(user):
            raise Forbidden(f"user {user!r} is not an admin")
        return {"model_version": service.model_version, "deploys": service.deploys}

    cap_kb = service.config.max_request_kb
    return BearerGate(app, service.users.authenticate, lambda path: ("request", cap_kb / 1024),
                      open_paths={HEALTH_PATH})


def serve(service: Service, host: str = "127.0.0.1", port: int = 8400) -> None:
    import uvicorn

    uvicorn.run(create_app(service), host=host, port=port, log_level="info")
