"""The feedback store (carl/online/store.py), every test against SQLite and against PostgreSQL.

PostgreSQL: $CARL_TEST_POSTGRES_URL when set (CI starts a server with scripts/postgres-test.sh);
otherwise, when PostgreSQL is installed, a throwaway server started by that script for this
module; otherwise those variants skip, or fail with CARL_REQUIRE_POSTGRES=1. Each test gets a
fresh schema of that server.
"""

import inspect
import os
import random
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from carl.online.store import MIGRATIONS, REDACTED, SIGNAL_KINDS, FeedbackStore, StoreConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "postgres-test.sh"


@pytest.fixture(scope="module")
def postgres_server():
    url = os.environ.get("CARL_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120)
    if started.returncode == 2:  # PostgreSQL is not installed
        message = f"postgresql: CARL_TEST_POSTGRES_URL is unset and {started.stderr.strip()}"
        if os.environ.get("CARL_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    assert started.returncode == 0, f"{SCRIPT} start failed:\n{started.stderr}"
    exported = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines())
    exported = {key: value.strip("'") for key, value in exported.items()}
    try:
        yield exported["CARL_TEST_POSTGRES_URL"]
    finally:
        stop = ["bash", str(SCRIPT), "stop", exported["CARL_TEST_POSTGRES_DIR"]]
        subprocess.run(stop, check=True, timeout=60)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/feedback.db"
        return
    server = request.getfixturevalue("postgres_server")
    schema = f"test_{secrets.token_hex(6)}"
    admin = sa.create_engine(server)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield sa.make_url(server).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def store(url):
    store = FeedbackStore(StoreConfig(url=url))
    yield store
    store.close()


def make_turn(n: int, t: int, size: int = 50) -> dict:
    """A deterministic turn: turn t of request n, with floats whose JSON must round-trip exactly."""
    rng = random.Random(n * 1000 + t)
    return {
        "assistant": f"turn {t} of request {n}: " + "x" * size,
        "token_ids": [rng.randrange(200_000) for _ in range(size)],
        "logprobs": [-rng.random() * 10 for _ in range(size)] + [-0.1, -1e-300, 0.30000000000000004, -5e-324],
        "prompt_ids": [rng.randrange(200_000) for _ in range(size)],
        "versions": [[7, size - 3], [8, 3]],
        "calls": [{"name": "bash", "arguments": {"command": f"echo {n} {t}"}}],
        "results": [{"output": "o" * size, "exit_code": 0}],
        "is_summary": t == 2,
        "wall_s": rng.random(),
    }


def _finish(store, session_id, index, **overrides):
    fields = dict(stop_reason="done", edits="--- a/x\n+++ b/x\n", trajectory={"steps": 1}, latency_s=1.5)
    store.finish_request(session_id, index, **{**fields, **overrides})


def _turn_fields(turn: dict) -> dict:
    return {key: turn[key] for key in make_turn(0, 0)}


def test_a_request_reads_back_as_written(store):
    session_id = store.create_session("alice", "/work/repo", model_version=7, metadata={"client": "cli"})
    index = store.add_request(session_id, "fix the bug", model_version=7)
    turns = [make_turn(0, t) for t in range(3)]
    for t, turn in enumerate(turns):
        store.add_turn(session_id, index, t, turn)
    _finish(store, session_id, index)
    store.add_signal(session_id, index, "thumbs", 1.0)
    store.add_signal(session_id, index, "comment", text="nice")

    request = store.get_request(session_id, index)
    assert [_turn_fields(t) for t in request["turns"]] == turns
    assert [t["turn_index"] for t in request["turns"]] == [0, 1, 2]
    assert not any(t["redacted"] for t in request["turns"])
    assert (request["text"], request["model_version"], request["stop_reason"]) == ("fix the bug", 7, "done")
    assert request["edits"] == "--- a/x\n+++ b/x\n" and request["trajectory"] == {"steps": 1}
    assert request["latency_s"] == 1.5 and request["id"] == 1
    assert [(s["kind"], s["value"], s["text"], s["source"]) for s in request["signals"]] == [
        ("thumbs", 1.0, None, "user"), ("comment", None, "nice", "user")
    ]  # fmt: skip
    for record in [request, *request["turns"], *request["signals"]]:
        assert isinstance(record["created_at"], float) and abs(record["created_at"] - time.time()) < 60
    session = store.get_session(session_id)
    assert session["metadata"] == {"client": "cli"} and session["num_requests"] == 1
    assert (session["user"], session["workspace"], session["model_version"]) == ("alice", "/work/repo", 7)
    assert store.finished_requests() == [request]
    assert store.get_request(session_id, 1) is None and store.get_session("nope") is None


def test_one_user_never_sees_another_users_sessions(store):
    mine = store.create_session("alice", "/a", 0)
    theirs = store.create_session("bob", "/b", 0)
    assert store.get_session(mine, user="alice")["id"] == mine
    assert store.get_session(theirs, user="alice") is None
    assert [s["id"] for s in store.list_sessions("alice")] == [mine]
    assert [s["id"] for s in store.list_sessions("bob")] == [theirs]
    assert store.list_sessions("carol") == []


def test_concurrent_add_request_gets_distinct_indexes(url):
    stores = [FeedbackStore(StoreConfig(url=url)) for _ in range(2)]  # two stores: like two processes
    session_id = stores[0].create_session("alice", "/a", 0)
    start = threading.Barrier(8)
    indexes: list[int] = []
    errors: list[BaseException] = []

    def add(k):
        try:
            start.wait()
            for _ in range(5):
                indexes.append(stores[k % 2].add_request(session_id, f"from thread {k}", 0))
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(indexes) == list(range(40))
    assert stores[0].get_session(session_id)["num_requests"] == 40
    for store in stores:
        store.close()


def _open_at_once(url: str, n: int = 4) -> tuple[list[FeedbackStore], list[BaseException]]:
    """`n` threads open a FeedbackStore on `url` at the same moment: the stores, and what they raised."""
    start = threading.Barrier(n)
    stores: list[FeedbackStore] = []
    errors: list[BaseException] = []

    def open_store():
        try:
            start.wait()
            stores.append(FeedbackStore(StoreConfig(url=url)))
        except BaseException as e:  # noqa: BLE001 -- the caller reports it
            errors.append(e)

    threads = [threading.Thread(target=open_store) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stores, errors


def test_stores_opening_a_new_database_at_once_migrate_it_once(url):
    stores, errors = _open_at_once(url)
    assert not errors, errors
    assert [store.schema_version() for store in stores] == [len(MIGRATIONS)] * 4
    session_id = stores[0].create_session("alice", "/a", 0)
    stores[1].add_request(session_id, "hi", 0)
    _finish(stores[2], session_id, 0)
    assert [r["id"] for r in stores[3].finished_requests()] == [1]  # one feed counter row, not four
    for store in stores:
        store.close()


def test_new_sqlite_files_opened_by_four_threads_at_once_never_fail_locked(tmp_path):
    # Switching a new file to WAL at once could deadlock, which SQLite reports as "database is
    # locked" without waiting (before the retry, 3 runs of this test in 5 failed here): 40 fresh files.
    errors: list[BaseException] = []
    for round_ in range(40):
        stores, failed = _open_at_once(f"sqlite:///{tmp_path / f'round{round_}.db'}")
        errors += failed
        for store in stores:
            store.close()
    assert not errors, errors


def test_the_switch_to_wal_is_retried_while_locked_and_other_errors_raise():
    from carl.online.store import _set_wal_mode

    class Cursor:  # fails as SQLite does when two connections switch one new file at once
        def __init__(self, failures: list[str]):
            self.failures, self.calls = failures, 0

        def execute(self, sql):
            self.calls += 1
            if self.failures:
                raise sqlite3.OperationalError(self.failures.pop(0))

    locked = Cursor(["database is locked", "database is locked"])
    _set_wal_mode(locked)
    assert locked.calls == 3
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        _set_wal_mode(Cursor(["disk I/O error"]))


def test_feed_ids_follow_finish_order_and_resume(store):
    session_id = store.create_session("alice", "/a", 0)
    for version in (1, 1, 2):
        store.add_request(session_id, f"served by {version}", version)
    store.add_turn(session_id, 0, 0, make_turn(0, 0))
    _finish(store, session_id, 2)
    _finish(store, session_id, 0)
    assert store.finished_requests() == [store.get_request(session_id, 2), store.get_request(session_id, 0)]
    assert [r["id"] for r in store.finished_requests()] == [1, 2]
    assert store.get_request(session_id, 1)["id"] is None  # not finished: not in the feed yet

    # A reader resuming after the last id it used sees request 1, created before request 2.
    seen = store.finished_requests()
    _finish(store, session_id, 1)
    later = store.finished_requests(after_id=seen[-1]["id"])
    assert [(r["request_index"], r["id"]) for r in later] == [(1, 3)]
    assert [r["request_index"] for r in store.finished_requests(model_version=1)] == [0, 1]
    assert [r["request_index"] for r in store.finished_requests(model_version=1, limit=1)] == [0]
    assert [len(r["turns"]) for r in store.finished_requests(limit=2)] == [0, 1]
    assert store.finished_requests(after_id=3) == []


def test_writes_to_unknown_or_finished_requests_fail(store):
    session_id = store.create_session("alice", "/a", 0)
    with pytest.raises(KeyError, match="no session"):
        store.add_request("nope", "hi", 0)
    with pytest.raises(KeyError, match="no request 0"):
        store.add_turn(session_id, 0, 0, make_turn(0, 0))
    store.add_request(session_id, "hi", 0)
    store.add_turn(session_id, 0, 0, make_turn(0, 0))
    with pytest.raises(ValueError, match="already stored"):
        store.add_turn(session_id, 0, 0, make_turn(0, 1))
    with pytest.raises(ValueError, match="expected exactly"):
        store.add_turn(session_id, 0, 1, {"assistant": "only this"})
    _finish(store, session_id, 0)
    with pytest.raises(ValueError, match=r"finished \(turns are final\)"):
        store.add_turn(session_id, 0, 1, make_turn(0, 1))
    with pytest.raises(ValueError, match=r"finished \(turns are final\)"):
        _finish(store, session_id, 0)
    with pytest.raises(KeyError, match="no request 5"):
        store.add_signal(session_id, 5, "thumbs", 1)
    assert [len(r["turns"]) for r in store.finished_requests()] == [1]


def test_signal_kinds_and_values_are_checked(store):
    session_id = store.create_session("alice", "/a", 0)
    store.add_request(session_id, "hi", 0)
    with pytest.raises(ValueError, match=r"kind: got 'like', expected one of thumbs, comment, kept"):
        store.add_signal(session_id, 0, "like", 1)
    with pytest.raises(ValueError, match=r"value: got 2 for a 'thumbs' signal"):
        store.add_signal(session_id, 0, "thumbs", 2)
    with pytest.raises(ValueError, match=r"text: got None for a 'comment' signal"):
        store.add_signal(session_id, 0, "comment")
    ids = [
        store.add_signal(session_id, 0, "thumbs", -1),
        store.add_signal(session_id, 0, "kept", 1.0, source="watcher"),
        store.add_signal(session_id, 0, "reverted"),
        store.add_signal(session_id, 0, "still_present", 0),
        store.add_signal(session_id, 0, "followup", 0.8, text="no, that broke the build"),
        store.add_signal(session_id, 0, "tests", 1),
        store.add_signal(session_id, 0, "comment", text="thanks"),
    ]
    assert ids == sorted(ids) and len(set(ids)) == len(SIGNAL_KINDS)
    signals = store.get_request(session_id, 0)["signals"]
    kinds = ["thumbs", "kept", "reverted", "still_present", "followup", "tests", "comment"]
    assert [s["kind"] for s in signals] == kinds
    assert signals[1]["source"] == "watcher" and signals[4]["value"] == 0.8


def test_redaction_rewrites_text_and_drops_token_ids_from_then_on(url):
    store = FeedbackStore(StoreConfig(url=url, redact=(r"sk-[A-Za-z0-9]{8,}", r"hunter2")))
    clean = store.create_session("alice", "/a", 0)
    store.add_request(clean, "no secrets here", 0)
    store.add_turn(clean, 0, 0, make_turn(0, 0))

    leaky = store.create_session("alice", "/a", 0)
    store.add_request(leaky, "list the files", 0)
    store.add_turn(leaky, 0, 0, make_turn(1, 0))
    secret_turn = {**make_turn(1, 1), "results": [{"output": "OPENAI_KEY=sk-abcdefgh1234", "exit_code": 0}]}
    store.add_turn(leaky, 0, 1, secret_turn)
    store.add_turn(leaky, 0, 2, make_turn(1, 2))  # its prompt holds the key as tokens
    store.add_request(leaky, "my password is hunter2", 0)
    store.add_turn(leaky, 1, 0, make_turn(2, 0))
    segment = {"messages": [{"role": "tool", "content": "OPENAI_KEY=sk-abcdefgh1234"}], "token_ids_T": [5, 6, 7],
               "generated_mask_T": [False, True, True], "logprobs_T": [0.0, -0.5, -0.25], "routing": None}
    _finish(store, leaky, 0, edits="+password = 'hunter2'\n", trajectory={"note": "sk-abcdefgh1234", "n": 3,
                                                                         "segments": [segment]})
    store.add_signal(leaky, 0, "comment", text="why did it print sk-abcdefgh1234?")

    assert store.get_request(clean, 0)["turns"][0]["token_ids"] == make_turn(0, 0)["token_ids"]
    first, second = store.get_request(leaky, 0), store.get_request(leaky, 1)
    assert [(t["redacted"], t["token_ids"] is None, t["prompt_ids"] is None) for t in first["turns"]] == [
        (False, False, False), (True, True, True), (True, True, True)
    ]  # fmt: skip
    assert first["turns"][0]["token_ids"] == make_turn(1, 0)["token_ids"]
    assert first["turns"][1]["results"] == [{"output": f"OPENAI_KEY={REDACTED}", "exit_code": 0}]
    assert first["turns"][1]["logprobs"] == secret_turn["logprobs"]  # not text: kept
    assert first["turns"][2]["assistant"] == make_turn(1, 2)["assistant"]
    assert second["text"] == f"my password is {REDACTED}" and second["turns"][0]["redacted"]
    assert first["edits"] == f"+password = '{REDACTED}'\n"
    # the trajectory's text is redacted, and its token ids (which still spell the key) are gone
    assert first["trajectory"] == {"note": REDACTED, "n": 3, "metadata": {"redacted": True}, "segments": [
        {"messages": [{"role": "tool", "content": f"OPENAI_KEY={REDACTED}"}], "token_ids_T": [],
         "generated_mask_T": [], "logprobs_T": [], "routing": None}]}
    assert first["signals"][0]["text"] == f"why did it print {REDACTED}?"
    store.close()


def test_retention_deletes_old_sessions_with_everything_in_them(url):
    store = FeedbackStore(StoreConfig(url=url, retention_days=1.0))
    old = store.create_session("alice", "/a", 0)
    store.add_request(old, "old", 0)
    store.add_turn(old, 0, 0, make_turn(0, 0))
    _finish(store, old, 0)
    store.add_signal(old, 0, "thumbs", 1)
    time.sleep(0.01)
    cutoff = time.time()
    time.sleep(0.01)
    new = store.create_session("alice", "/a", 0)
    store.add_request(new, "new", 0)

    assert store.apply_retention(now=cutoff + 0.5 * 86400) == 0
    assert store.apply_retention(now=cutoff + 86400) == 1
    assert store.get_session(old) is None and store.get_request(old, 0) is None
    assert store.get_session(new) is not None and store.finished_requests() == []
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        counts = {table: conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
                  for table in ("turns", "signals")}  # fmt: skip
    engine.dispose()
    assert counts == {"turns": 0, "signals": 0}
    store.close()
    keep_all = FeedbackStore(StoreConfig(url=url))
    assert keep_all.apply_retention(now=time.time() + 1e9) == 0 and keep_all.get_session(new) is not None
    keep_all.close()


def test_text_with_sql_in_it_round_trips(store):
    nasty = "Robert'); DROP TABLE sessions;-- \" \\ %s ? :name \x00".replace("\x00", "")
    session_id = store.create_session(nasty, nasty, 0, metadata={nasty: nasty})
    store.add_request(session_id, nasty, 0)
    store.add_turn(session_id, 0, 0, {**make_turn(0, 0), "assistant": nasty, "results": [{"output": nasty}]})
    _finish(store, session_id, 0, edits=nasty, stop_reason=nasty)
    store.add_signal(session_id, 0, "comment", text=nasty, source=nasty)
    request = store.get_request(session_id, 0)
    assert request["text"] == request["edits"] == request["stop_reason"] == nasty
    assert request["turns"][0]["assistant"] == nasty and request["turns"][0]["results"] == [{"output": nasty}]
    assert request["signals"][0]["text"] == request["signals"][0]["source"] == nasty
    assert [s["id"] for s in store.list_sessions(nasty)] == [session_id]
    assert store.get_session(session_id, user=nasty)["metadata"] == {nasty: nasty}


def test_reopening_is_idempotent_and_a_newer_schema_is_refused(url):
    store = FeedbackStore(StoreConfig(url=url))
    session_id = store.create_session("alice", "/a", 0)
    store.close()
    store = FeedbackStore(StoreConfig(url=url))
    assert store.schema_version() == len(MIGRATIONS) and store.get_session(session_id) is not None
    store.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE schema_version SET version = 99"))
    engine.dispose()
    known = len(MIGRATIONS)
    with pytest.raises(RuntimeError, match=f"schema version 99, but this carl knows versions up to {known}:"):
        FeedbackStore(StoreConfig(url=url))


WRITER = """
import random
import sys
from carl.online.store import FeedbackStore, StoreConfig
{make_turn}
store = FeedbackStore(StoreConfig(url=sys.argv[1]))
session_id = store.create_session("writer", "/ws", 0)
for n in range(10**6):
    index = store.add_request(session_id, f"request {{n}}", 0)
    for t in range(3):
        store.add_turn(session_id, index, t, make_turn(n, t, size=2000))
    store.finish_request(session_id, index, stop_reason="done", edits=f"edit {{n}}", trajectory={{"n": n}},
                         latency_s=0.0)
    print(n, flush=True)
"""


def test_a_writer_killed_mid_write_leaves_no_torn_request(url):
    code = WRITER.format(make_turn=inspect.getsource(make_turn))
    rng = random.Random(0)
    for _ in range(3):  # each round: a new writer, killed at a random point after a few requests
        writer = subprocess.Popen([sys.executable, "-c", code, url], cwd=ROOT, stdout=subprocess.PIPE,
                                  text=True)  # fmt: skip
        for _ in range(3):
            assert writer.stdout.readline(), "the writer stopped before it was killed"
        time.sleep(rng.uniform(0, 0.05))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        writer.stdout.close()

    store = FeedbackStore(StoreConfig(url=url))
    sessions = store.list_sessions("writer")
    assert len(sessions) == 3
    for session in sessions:
        requests = [store.get_request(session["id"], i) for i in range(session["num_requests"])]
        assert len(requests) >= 3
        for request in requests:
            n = int(request["text"].removeprefix("request "))
            turns = request["turns"]
            assert [_turn_fields(t) for t in turns] == [make_turn(n, t, size=2000) for t in range(len(turns))]
            if request["id"] is not None:
                assert len(turns) == 3 and request["edits"] == f"edit {n}"
                assert request["trajectory"] == {"n": n}
    store.close()
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sa.make_url(url).database)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        conn.close()


def test_config_is_checked():
    with pytest.raises(ValueError, match=r"store.url: got 'mysql://\*\*\*@db/x', expected a URL like sqlite"):
        StoreConfig(url="mysql://me:secret@db/x")
    with pytest.raises(ValueError, match="store.url: got 'not a url'"):
        StoreConfig(url="not a url")
    with pytest.raises(ValueError, match="store.url: got 'sqlite://', expected a SQLite file"):
        StoreConfig(url="sqlite://")
    with pytest.raises(ValueError, match=r"store.retention_days: got -1, expected a number >= 0"):
        StoreConfig(retention_days=-1)
    with pytest.raises(ValueError, match=r"store.redact: got '\(unclosed', expected a Python regex"):
        StoreConfig(redact=("(unclosed",))
    with pytest.raises(ValueError, match="store.redact: got the string"):
        StoreConfig(redact="sk-.*")
    with pytest.raises(ValueError, match="matches the empty string"):
        StoreConfig(redact=("x*",))
    assert StoreConfig(redact=["a+"]).redact == ("a+",)
    StoreConfig(url="postgresql://user:pw@host/db")
    StoreConfig(url="postgresql+psycopg://user:pw@host:5432/db")


def test_the_store_does_not_import_torch():
    code = "import sys, carl.online.store; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
