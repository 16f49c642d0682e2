"""The feedback store: every session `carl serve` runs, token-exact, with the signals users give.

    carl serve --create_session, add_request, add_turn, finish_request, add_signal--> FeedbackStore
    carl online <--finished_requests(after_id=the last "id" it used)--------------- (SQLite/PostgreSQL)

One URL picks the database: a SQLite file by default, PostgreSQL for deployments. SQLAlchemy Core
(no ORM) keeps every query parametrized, so stored text is never SQL.

Tables (schema version 1; `pk` columns are internal, the API addresses a request by session id
and index):
    sessions        id, user, workspace, model_version, metadata, num_requests, redacted, created_at
    requests        pk, session_id, request_index, text, model_version, created_at,
                    feed_id, finished_at, stop_reason, edits, trajectory, latency_s
    turns           pk, request_pk, turn_index, assistant, token_ids, logprobs, prompt_ids, versions,
                    calls, results, is_summary, wall_s, redacted, created_at
    signals         id, request_pk, kind, value, text, source, created_at
    feed_counter    last_id (one row: the last feed id handed out)
    schema_version  version (one row)

Contracts:
- Each public write is one transaction, so a process killed mid-write leaves each write wholly
  done or not at all: a request is absent, unfinished with the turns stored so far, or finished
  with all of them; never a half-written turn. SQLite runs in WAL mode with synchronous=FULL, and
  write transactions take the write lock up front (BEGIN IMMEDIATE) and wait for it up to
  BUSY_TIMEOUT_S, so concurrent threads and processes queue instead of failing "database is locked".
- A request's "id" is its place in the feed of finished requests, handed out by finish_request
  under a lock on feed_counter, so ids increase in commit order: a reader that resumes after the
  last id it used never skips a request that finished later with a smaller creation order. It is
  None until the request finishes. A finished request's turns are final; signals may still come.
- Redaction rewrites text, not token ids. Once redaction changes a request's text or a turn's
  text in a session, that turn and every later turn of the session is stored with token_ids and
  prompt_ids None and redacted=True: their prompts may hold the redacted text as tokens.

- A finished request's `trajectory` (carl.types.Trajectory.to_dict: the token-exact record training
  reads) is redacted the same way: its strings rewritten, and when any changed (or the session
  already holds redacted text) its segments' token ids, masks, log-probs and routes are dropped
  (`without_token_ids`), so no secret survives as tokens and the request is not trained on.

Not covered: access control. The store keeps one user's sessions apart in get_session and
list_sessions; the caller checks get_session(session_id, user) before writing to a session.
"""

from __future__ import annotations

import functools
import json
import math
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    exc,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url

BUSY_TIMEOUT_S = 30.0
"""How long a SQLite write waits for another connection's write to finish before failing."""
REDACTED = "[redacted]"

SIGNAL_KINDS: dict[str, str] = {
    "thumbs": "value +1 (up) or -1 (down)",
    "comment": "text: the user's comment",
    "kept": "value 1.0: the edit was still there after a delay",
    "reverted": "the user reverted the edit",
    "still_present": "value 1 or 0: whether the edit is still in the workspace",
    "followup": "text: the user's next message; value: a dissatisfaction score, or None",
    "tests": "value 1 (the tests pass) or 0 (they fail)",
}
_SIGNAL_VALUES = {"thumbs": (1.0, -1.0), "still_present": (0.0, 1.0), "tests": (0.0, 1.0)}
_SIGNAL_NEEDS_TEXT = ("comment", "followup")
TURN_FIELDS = ("assistant", "token_ids", "logprobs", "prompt_ids", "versions", "calls", "results",
               "is_summary", "wall_s")  # fmt: skip


@dataclass(frozen=True)
class StoreConfig:
    url: str = "sqlite:///carl-online.db"
    """sqlite:///PATH (a file; relative to the working directory, four slashes for an absolute path)
    or postgresql+psycopg://USER:PASSWORD@HOST/DB (plain postgresql:// uses psycopg too)."""
    retention_days: float = 0.0
    """apply_retention() deletes sessions created longer ago than this; 0 keeps everything."""
    redact: tuple[str, ...] = ()
    """Regular expressions; their matches in stored text are replaced by "[redacted]" before writing."""

    def __post_init__(self) -> None:
        shown = re.sub(r"://[^/@]*@", "://***@", self.url)  # never echo a password
        expected = "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST/DB"
        try:
            url = make_url(self.url)
        except exc.ArgumentError:
            raise ValueError(f"store.url: got {shown!r}, expected a URL like {expected}") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"store.url: got {shown!r}, expected a URL like {expected}")
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise ValueError(f"store.url: got {shown!r}, expected a SQLite file (in memory, it is all lost)")
        days = self.retention_days
        if not (math.isfinite(days) and days >= 0):
            raise ValueError(f"store.retention_days: got {days!r}, expected a number >= 0 (0: keep all)")
        if isinstance(self.redact, str):
            raise ValueError(f"store.redact: got the string {self.redact!r}, expected a list of regexes")
        object.__setattr__(self, "redact", tuple(self.redact))  # a TOML list arrives as a list
        for pattern in self.redact:
            try:
                compiled = re.compile(pattern)
            except (re.error, TypeError) as e:
                raise ValueError(f"store.redact: got {pattern!r}, expected a Python regex ({e})") from None
            if compiled.fullmatch(""):
                raise ValueError(f"store.redact: got {pattern!r}, which matches the empty string; expected a "
                                 "pattern for the text to hide")  # fmt: skip


# -- schema ------------------------------------------------------------------------------------

_PK = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only an INTEGER PRIMARY KEY
_JSON = JSON(none_as_null=True)  # Python None is SQL NULL, not the JSON text 'null'
_META = MetaData()

_schema_version = Table("schema_version", _META, Column("version", Integer, nullable=False))
_feed_counter = Table("feed_counter", _META, Column("last_id", BigInteger, nullable=False))
_sessions = Table(
    "sessions", _META,
    Column("id", String(32), primary_key=True),
    Column("user", Text, nullable=False, index=True),
    Column("workspace", Text, nullable=False),
    Column("model_version", BigInteger, nullable=False),
    Column("metadata", _JSON, nullable=False),
    Column("num_requests", Integer, nullable=False),
    Column("redacted", Boolean, nullable=False),
    Column("created_at", Double, nullable=False, index=True),
)  # fmt: skip
_requests = Table(
    "requests", _META,
    Column("pk", _PK, primary_key=True, autoincrement=True),
    Column("session_id", String(32), ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("request_index", Integer, nullable=False),
    Column("text", Text, nullable=False),
    Column("model_version", BigInteger, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("feed_id", BigInteger, unique=True),
    Column("finished_at", Double),
    Column("stop_reason", Text),
    Column("edits", Text),
    Column("trajectory", _JSON),
    Column("latency_s", Double),
    UniqueConstraint("session_id", "request_index"),
)  # fmt: skip
_turns = Table(
    "turns", _META,
    Column("pk", _PK, primary_key=True, autoincrement=True),
    Column("request_pk", _PK, ForeignKey("requests.pk", ondelete="CASCADE"), nullable=False),
    Column("turn_index", Integer, nullable=False),
    Column("assistant", Text, nullable=False),
    Column("token_ids", _JSON),
    Column("logprobs", _JSON),
    Column("prompt_ids", _JSON),
    Column("versions", _JSON),
    Column("calls", _JSON, nullable=False),
    Column("results", _JSON, nullable=False),
    Column("is_summary", Boolean, nullable=False),
    Column("wall_s", Double, nullable=False),
    Column("redacted", Boolean, nullable=False),
    Column("created_at", Double, nullable=False),
    UniqueConstraint("request_pk", "turn_index"),
)  # fmt: skip
_signals = Table(
    "signals", _META,
    Column("id", _PK, primary_key=True, autoincrement=True),
    Column("request_pk", _PK, ForeignKey("requests.pk", ondelete="CASCADE"), nullable=False, index=True),
    Column("kind", Text, nullable=False),
    Column("value", Double),
    Column("text", Text),
    Column("source", Text, nullable=False),
    Column("created_at", Double, nullable=False),
)  # fmt: skip


def _v1_create_tables(conn: Connection) -> None:
    # The tables as defined above. A later migration that changes a table must first copy that
    # table's version-1 definition into this function, so that old databases replay history.
    _META.create_all(conn, tables=[_feed_counter, _sessions, _requests, _turns, _signals])
    conn.execute(insert(_feed_counter).values(last_id=0))


MIGRATIONS: list[Callable[[Connection], None]] = [_v1_create_tables]
"""MIGRATIONS[i] takes a database from schema version i to i + 1."""


# -- the store ---------------------------------------------------------------------------------


class FeedbackStore:
    """Sessions, requests, turns and signals in one database; see the module docstring."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self._patterns = [re.compile(p) for p in config.redact]
        self._engine = _open_engine(config.url)
        self._postgres = self._engine.dialect.name == "postgresql"
        # SQLite: writes BEGIN IMMEDIATE (see _sqlite_begin). PostgreSQL: each read sees one snapshot.
        self._writer = self._engine.execution_options(carl_write=True)
        self._reader = self._engine
        if self._postgres:
            self._reader = self._engine.execution_options(isolation_level="REPEATABLE READ")
        self._migrate()

    def close(self) -> None:
        self._engine.dispose()

    # sessions

    def create_session(self, user: str, workspace: str, model_version: int,
                       metadata: dict | None = None) -> str:  # fmt: skip
        session_id = secrets.token_hex(12)
        metadata, _ = self._redact(metadata or {})
        with self._write() as conn:
            conn.execute(insert(_sessions).values(
                id=session_id, user=user, workspace=workspace, model_version=model_version, metadata=metadata,
                num_requests=0, redacted=False, created_at=time.time(),
            ))  # fmt: skip
        return session_id

    def get_session(self, session_id: str, user: str | None = None) -> dict | None:
        """The session, or None when there is none with that id, or (user given) it is another user's."""
        query = select(_sessions).where(_sessions.c.id == session_id)
        if user is not None:
            query = query.where(_sessions.c.user == user)
        with self._read() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else _session_dict(row)

    def list_sessions(self, user: str) -> list[dict]:
        """The user's sessions, oldest first."""
        query = select(_sessions).where(_sessions.c.user == user).order_by(_sessions.c.created_at)
        with self._read() as conn:
            return [_session_dict(row) for row in conn.execute(query)]

    # requests

    def add_request(self, session_id: str, text: str, model_version: int) -> int:
        """Store a user message; returns its index in the session (0, 1, 2...), unique under concurrency."""
        text, changed = self._redact(text)
        # The UPDATE locks the session row until commit, so concurrent calls take turns.
        bump = update(_sessions).where(_sessions.c.id == session_id)
        bump = bump.values(num_requests=_sessions.c.num_requests + 1)
        if changed:
            bump = bump.values(redacted=True)
        with self._write() as conn:
            count = conn.execute(bump.returning(_sessions.c.num_requests)).scalar_one_or_none()
            if count is None:
                raise KeyError(f"no session {session_id!r}")
            conn.execute(insert(_requests).values(
                session_id=session_id, request_index=count - 1, text=text, model_version=model_version,
                created_at=time.time(),
            ))  # fmt: skip
        return count - 1

    def add_turn(self, session_id: str, request_index: int, turn_index: int, turn: dict) -> None:
        """Store one assistant turn of an unfinished request; `turn` has exactly the keys TURN_FIELDS."""
        if set(turn) != set(TURN_FIELDS):
            raise ValueError(f"turn: got keys {sorted(turn)}, expected exactly {sorted(TURN_FIELDS)}")
        assistant, changed_a = self._redact(turn["assistant"])
        calls, changed_c = self._redact(turn["calls"])
        results, changed_r = self._redact(turn["results"])
        changed = changed_a or changed_c or changed_r
        with self._write() as conn:
            request_pk, session_redacted = self._lock_unfinished(conn, session_id, request_index)
            same = (_turns.c.request_pk == request_pk) & (_turns.c.turn_index == turn_index)
            if conn.execute(select(_turns.c.pk).where(same)).first() is not None:
                raise ValueError(f"turn_index: turn {turn_index} of request {request_index} in session "
                                 f"{session_id!r} is already stored; expected a new turn index")  # fmt: skip
            if changed and not session_redacted:
                conn.execute(update(_sessions).where(_sessions.c.id == session_id).values(redacted=True))
            redacted = changed or session_redacted
            conn.execute(insert(_turns).values(
                request_pk=request_pk, turn_index=turn_index, assistant=assistant,
                token_ids=None if redacted else turn["token_ids"], logprobs=turn["logprobs"],
                prompt_ids=None if redacted else turn["prompt_ids"], versions=turn["versions"],
                calls=calls, results=results, is_summary=bool(turn["is_summary"]), wall_s=turn["wall_s"],
                redacted=redacted, created_at=time.time(),
            ))  # fmt: skip

    def finish_request(self, session_id: str, request_index: int, *, stop_reason: str, edits: str,
                       trajectory: dict, latency_s: float) -> None:  # fmt: skip
        """Mark the request done (edits: the unified diff the agent produced) and give it its feed id."""
        edits, _ = self._redact(edits)
        trajectory, changed = self._redact(trajectory)
        with self._write() as conn:
            request_pk, session_redacted = self._lock_unfinished(conn, session_id, request_index)
            if changed or session_redacted:  # its token ids still spell what the text no longer says
                trajectory = without_token_ids(trajectory)
            # The UPDATE locks the counter row until commit: feed ids are handed out in commit order.
            take = update(_feed_counter).values(last_id=_feed_counter.c.last_id + 1)
            feed_id = conn.execute(take.returning(_feed_counter.c.last_id)).scalar_one()
            conn.execute(update(_requests).where(_requests.c.pk == request_pk).values(
                feed_id=feed_id, finished_at=time.time(), stop_reason=stop_reason, edits=edits,
                trajectory=trajectory, latency_s=latency_s,
            ))  # fmt: skip

    def get_request(self, session_id: str, request_index: int) -> dict | None:
        """The request with its "turns" (in turn order) and "signals" (in arrival order), or None."""
        where = (_requests.c.session_id == session_id) & (_requests.c.request_index == request_index)
        with self._read() as conn:
            found = self._requests_with_children(conn, where, order_by=_requests.c.pk, limit=None)
        return found[0] if found else None

    # signals

    def add_signal(self, session_id: str, request_index: int, kind: str, value: float | None = None,
                   text: str | None = None, source: str = "user") -> int:  # fmt: skip
        """Store a signal about a request (see SIGNAL_KINDS); returns its id."""
        if kind not in SIGNAL_KINDS:
            raise ValueError(f"kind: got {kind!r}, expected one of {', '.join(SIGNAL_KINDS)}")
        if kind in _SIGNAL_VALUES and value not in _SIGNAL_VALUES[kind]:
            raise ValueError(f"value: got {value!r} for a {kind!r} signal, expected {SIGNAL_KINDS[kind]}")
        if kind in _SIGNAL_NEEDS_TEXT and not text:
            raise ValueError(f"text: got {text!r} for a {kind!r} signal, expected {SIGNAL_KINDS[kind]}")
        text, _ = self._redact(text)
        with self._write() as conn:
            request_pk = conn.execute(
                select(_requests.c.pk).where(
                    (_requests.c.session_id == session_id) & (_requests.c.request_index == request_index)
                )
            ).scalar_one_or_none()
            if request_pk is None:
                raise KeyError(f"no request {request_index} in session {session_id!r}")
            result = conn.execute(insert(_signals).values(
                request_pk=request_pk, kind=kind, value=value, text=text, source=source,
                created_at=time.time(),
            ))  # fmt: skip
        return result.inserted_primary_key[0]

    # reading for training

    def finished_requests(self, model_version: int | None = None, after_id: int = 0,
                          limit: int | None = None) -> list[dict]:  # fmt: skip
        """Finished requests with feed id > after_id (served by model_version, if given), in id order."""
        where = _requests.c.feed_id > after_id
        if model_version is not None:
            where = where & (_requests.c.model_version == model_version)
        with self._read() as conn:
            return self._requests_with_children(conn, where, order_by=_requests.c.feed_id, limit=limit)

    def apply_retention(self, now: float | None = None) -> int:
        """Delete the sessions created more than retention_days before `now`, with everything in them."""
        if self.config.retention_days == 0:
            return 0
        cutoff = (time.time() if now is None else now) - self.config.retention_days * 86400.0
        old_sessions = select(_sessions.c.id).where(_sessions.c.created_at < cutoff)
        old_requests = select(_requests.c.pk).where(_requests.c.session_id.in_(old_sessions))
        with self._write() as conn:
            conn.execute(delete(_signals).where(_signals.c.request_pk.in_(old_requests)))
            conn.execute(delete(_turns).where(_turns.c.request_pk.in_(old_requests)))
            conn.execute(delete(_requests).where(_requests.c.session_id.in_(old_sessions)))
            return conn.execute(delete(_sessions).where(_sessions.c.created_at < cutoff)).rowcount

    def schema_version(self) -> int:
        with self._read() as conn:
            return conn.execute(select(_schema_version.c.version)).scalar_one()

    # helpers

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._reader.begin() as conn:
            yield conn

    def _redact(self, value: Any) -> tuple[Any, bool]:
        """`value` with every pattern match in its strings (in lists and dict values too) replaced."""
        if isinstance(value, str):
            changed = False
            for pattern in self._patterns:
                value, n = pattern.subn(REDACTED, value)
                changed = changed or n > 0
            return value, changed
        if isinstance(value, (list, tuple)):
            pairs = [self._redact(v) for v in value]
            return [v for v, _ in pairs], any(c for _, c in pairs)
        if isinstance(value, dict):
            pairs = {k: self._redact(v) for k, v in value.items()}
            return {k: v for k, (v, _) in pairs.items()}, any(c for _, c in pairs.values())
        return value, False

    def _lock_unfinished(self, conn: Connection, session_id: str, request_index: int) -> tuple[int, bool]:
        """(request pk, whether the session holds redacted text), with the request row locked."""
        row = conn.execute(
            select(_requests.c.pk, _requests.c.feed_id, _sessions.c.redacted)
            .join(_sessions, _sessions.c.id == _requests.c.session_id)
            .where((_requests.c.session_id == session_id) & (_requests.c.request_index == request_index))
            # PostgreSQL (NO KEY: signals may still reference the row); SQLite's BEGIN IMMEDIATE serializes.
            .with_for_update(of=_requests, key_share=True)
        ).one_or_none()
        if row is None:
            raise KeyError(f"no request {request_index} in session {session_id!r}")
        if row.feed_id is not None:
            raise ValueError(f"session {session_id!r}, request {request_index}: finished (turns are final)")
        return row.pk, row.redacted

    def _requests_with_children(self, conn: Connection, where, order_by, limit: int | None) -> list[dict]:
        query = select(_requests).where(where).order_by(order_by)
        rows = conn.execute(query if limit is None else query.limit(limit)).all()
        if not rows:
            return []
        # Children of exactly these rows: a range over the order column, not an IN list of any length.
        where = where & order_by.between(getattr(rows[0], order_by.name), getattr(rows[-1], order_by.name))
        in_rows = select(_requests.c.pk).where(where)
        turns: dict[int, list[dict]] = {row.pk: [] for row in rows}
        signals: dict[int, list[dict]] = {row.pk: [] for row in rows}
        turn_rows = select(_turns).where(_turns.c.request_pk.in_(in_rows)).order_by(_turns.c.turn_index)
        for t in conn.execute(turn_rows):
            turns[t.request_pk].append(_pick(t, _TURN_OUT))
        signal_rows = select(_signals).where(_signals.c.request_pk.in_(in_rows)).order_by(_signals.c.id)
        for s in conn.execute(signal_rows):
            signals[s.request_pk].append(_pick(s, _SIGNAL_OUT))
        return [{"id": r.feed_id, **_pick(r, _REQUEST_OUT), "turns": turns[r.pk], "signals": signals[r.pk]}
                for r in rows]  # fmt: skip

    def _migrate(self) -> None:
        with self._write() as conn:
            if self._postgres:  # two processes opening a new database at once: one migrates, one waits
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x6361726C})  # "carl"
            _schema_version.create(conn, checkfirst=True)
            version = conn.execute(select(_schema_version.c.version)).scalar_one_or_none()
            if version is None:
                conn.execute(insert(_schema_version).values(version=0))
                version = 0
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"the feedback store at {self._engine.url!r} is at schema version {version}, but this "
                    f"carl knows versions up to {len(MIGRATIONS)}: upgrade carl to open it"
                )
            for migrate in MIGRATIONS[version:]:
                migrate(conn)
            conn.execute(update(_schema_version).values(version=len(MIGRATIONS)))


# The columns each returned dict holds ("redacted" of a session and the pk columns are internal).
_SESSION_OUT = ("id", "user", "workspace", "model_version", "metadata", "num_requests", "created_at")
_REQUEST_OUT = ("session_id", "request_index", "text", "model_version", "created_at", "finished_at",
                "stop_reason", "edits", "trajectory", "latency_s")  # fmt: skip
_TURN_OUT = ("turn_index", *TURN_FIELDS, "redacted", "created_at")
_SIGNAL_OUT = ("id", "kind", "value", "text", "source", "created_at")


def _pick(row, names: tuple[str, ...]) -> dict:
    return {name: getattr(row, name) for name in names}


def without_token_ids(trajectory: dict) -> dict:
    """A trajectory (carl.types.Trajectory.to_dict) whose segments keep their messages but lose the
    token ids, masks, log-probs and routes (so it cannot be trained on token-exact), marked redacted."""
    segments = [{**seg, "token_ids_T": [], "generated_mask_T": [], "logprobs_T": [], "routing": None}
                for seg in trajectory.get("segments", [])]
    return {**trajectory, "segments": segments, "metadata": {**trajectory.get("metadata", {}), "redacted": True}}


def _session_dict(row) -> dict:
    return _pick(row, _SESSION_OUT)


def _open_engine(url_text: str) -> Engine:
    url = make_url(url_text)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")  # the driver carl installs
    # NaN or infinity would be stored by SQLite and refused by PostgreSQL: refuse them on both.
    serialize = functools.partial(json.dumps, allow_nan=False)
    if url.get_backend_name() == "postgresql":
        return create_engine(url, json_serializer=serialize, pool_pre_ping=True)
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, json_serializer=serialize)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_conn, _record) -> None:
    dbapi_conn.isolation_level = None  # the driver's own implicit BEGIN off: _sqlite_begin issues it
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    _set_wal_mode(cursor)
    cursor.execute("PRAGMA synchronous = FULL")  # a committed write survives power loss, not just a crash
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _set_wal_mode(cursor) -> None:
    # Connections switching a new database to WAL at once can deadlock on its locks; SQLite then
    # answers "database is locked" at once, without waiting the busy timeout. Retry up to it.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _sqlite_begin(conn: Connection) -> None:
    # A deferred transaction that reads, then writes, fails at once with SQLITE_BUSY when another
    # connection wrote in between (the busy timeout does not apply); IMMEDIATE waits for the lock.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("carl_write") else "BEGIN")
