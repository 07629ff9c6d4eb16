"""SQLiteStore: the conformance suite plus what is particular to SQLite."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from support.sqlite import insert_raw_row, raw_connection
from support.stores import until
from threadline.ai._messages import UserMessage
from threadline.errors import ConfigError, CorruptLog, SessionNotFound, StoreError
from threadline.session import MessageEntry, SessionRecord, new_id
from threadline.stores import SQLiteStore, Store
from threadline.stores.sqlite._schema import MIGRATIONS
from threadline.testing import StoreConformance


class TestSQLiteStore(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "search", "multi_process"})

    async def make_store(self, tmp_path: Path) -> Store:
        return SQLiteStore(tmp_path / "sessions.db")

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        with raw_connection(self._tmp_path / "sessions.db") as conn:
            insert_raw_row(conn, session_id, data)


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


async def test_wal_and_synchronous_settings(tmp_path: Path) -> None:
    # synchronous is SQLite's own setting: FULL (2) syncs the WAL in every commit.
    for mode, level in (("FULL", 2), ("NORMAL", 1)):
        store = SQLiteStore(tmp_path / f"{mode}.db", synchronous=mode)  # type: ignore[arg-type]
        await store.create_session(SessionRecord(id="s"))
        assert await store._call(lambda conn: (
            conn.execute("PRAGMA journal_mode").fetchone()[0],
            conn.execute("PRAGMA synchronous").fetchone()[0])) == ("wal", level)
        await store.close()
    assert SQLiteStore(tmp_path / "d.db").synchronous == "FULL"
    with pytest.raises(ConfigError, match="OFF"):
        SQLiteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]


async def test_migrations_recorded_once_and_reopen_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    for _ in range(3):
        store = SQLiteStore(path)
        await store.create_session(SessionRecord(id=f"s{_}"))
        await store.close()
    with raw_connection(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
    assert versions == [v for v, _ in MIGRATIONS]
    store = SQLiteStore(path)
    assert [r.id for r in (await store.list_sessions()).sessions] == ["s2", "s1", "s0"]
    await store.close()


def _open_and_create(path: str, n: int) -> int:
    async def run() -> int:
        store = SQLiteStore(path)
        try:
            await store.create_session(SessionRecord(id=f"p{n}"))
            return n
        finally:
            await store.close()

    return asyncio.run(run())


async def test_processes_migrating_a_new_file_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "race.db")
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = await asyncio.gather(*(
            loop.run_in_executor(pool, _open_and_create, path, n) for n in range(6)))
    assert sorted(done) == list(range(6))
    with raw_connection(Path(path)) as conn:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(
            MIGRATIONS)
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 6


async def test_writer_holding_the_lock_is_waited_out_not_reported(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    store = SQLiteStore(path, busy_timeout=10)
    await store.create_session(SessionRecord(id="s"))
    other = raw_connection(path)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Event()

    def release() -> None:
        time.sleep(0.3)
        released.set()
        other.execute("COMMIT")

    threading.Thread(target=release).start()
    await store.append_entries("s", [_entry("after the lock")])
    assert released.is_set()
    assert len(await store.load_entries("s")) == 1
    other.close()
    await store.close()


async def test_lock_held_past_busy_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    store = SQLiteStore(path, busy_timeout=0.2)
    await store.create_session(SessionRecord(id="s"))
    other = raw_connection(path)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match="busy timeout") as info:
            await store.append_entries("s", [_entry("x")])
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert info.value.session_id == "s"
    finally:
        other.execute("ROLLBACK")
        other.close()
    await store.append_entries("s", [_entry("y")])  # the handle still works
    assert len(await store.load_entries("s")) == 1
    await store.close()


async def test_corrupt_row_names_table_and_row(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_entry("fine"), _entry("to be broken")])
    with raw_connection(path) as conn:
        conn.execute("UPDATE entries SET data = X'7b226e6f74' WHERE seq = 2")
    with pytest.raises(CorruptLog) as info:
        await store.load_entries("s")
    message = str(info.value)
    assert "table entries" in message and "seq=2" in message and str(path) in message
    assert info.value.session_id == "s"
    await store.close()


async def test_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    await store.create_session(SessionRecord(id="s"))
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.load_entries("s")


async def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = SQLiteStore(blocker / "x.db")
    with pytest.raises(StoreError, match=r"x\.db"):
        await store.load_entries("s")
    await store.close()


_APPENDER = """
import asyncio, sys
from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    parent = None
    n = 0
    while True:
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"{sys.argv[2]} {n}"))
        await store.append_entries(sys.argv[2], [entry])
        print(entry.id, flush=True)  # acknowledged
        parent, n = entry.id, n + 1

asyncio.run(main())
"""


async def test_s4_kill_9_writers_lose_no_acknowledged_entry(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = SQLiteStore(path)
    writers = [f"w{n}" for n in range(3)]
    for sid in writers:
        await store.create_session(SessionRecord(id=sid))
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", _APPENDER, str(path), sid, stdout=asyncio.subprocess.PIPE)
        for sid in writers]
    acknowledged: dict[str, list[str]] = {}
    for sid, proc in zip(writers, procs, strict=True):
        assert proc.stdout is not None
        lines = [await proc.stdout.readline() for _ in range(15)]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        lines += (await proc.stdout.read()).split()  # acknowledged before the kill landed
        acknowledged[sid] = [line.decode().strip() for line in lines if line.strip()]
    for sid in writers:
        stored = [e.id for e in await store.load_entries(sid)]
        # Everything acknowledged is there, in order; at most the one append in
        # flight when the kill landed may be there without an acknowledgement.
        assert stored[: len(acknowledged[sid])] == acknowledged[sid]
        assert len(stored) - len(acknowledged[sid]) <= 1
    await store.close()


_FILE_SIZE_LIMITED = """
import asyncio, resource, signal, sys
from threadline.ai._messages import UserMessage
from threadline.errors import DurabilityError
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    # A real write failure: the kernel refuses to grow files past 600 kB (EFBIG); the
    # WAL already holds the schema the parent wrote.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))
    acked = 0
    try:
        for _ in range(100):
            await store.append_entries("s", [MessageEntry(message=UserMessage.of("x" * 20000))])
            acked += 1
    except DurabilityError as exc:
        print(acked, type(exc.__cause__).__name__, flush=True)
    try:
        await store.append_entries("s", [MessageEntry(message=UserMessage.of("small"))])
    except DurabilityError:
        print("poisoned", flush=True)
    for verb, call in (("create", store.create_session(SessionRecord(id="t"))),
                       ("delete", store.delete_session("s"))):
        try:
            await call
        except DurabilityError:
            print(verb + "-refused", flush=True)

asyncio.run(main())
"""


async def test_s17_failed_write_poisons_the_handle_for_create_append_and_delete(
    tmp_path: Path
) -> None:
    path = tmp_path / "full.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="s"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FILE_SIZE_LIMITED, str(path), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    acked, cause, *refused = out.decode().split()
    assert cause == "OperationalError"
    # S17's companion rule: a poisoned handle refuses every write, not just appends.
    assert refused == ["poisoned", "create-refused", "delete-refused"]
    assert 0 < int(acked) < 100
    # A fresh handle sees every acknowledged append and nothing else.
    assert len(await store.load_entries("s")) == int(acked)
    with pytest.raises(SessionNotFound):
        await store.load_session("t")
    await store.append_entries("s", [_entry("the file can grow again")])
    await store.close()


async def _thread_of(store: SQLiteStore) -> int:
    return await store._call(lambda conn: threading.get_ident())


async def test_open_stores_never_share_a_thread(tmp_path: Path) -> None:
    # One store waiting out another process's lock must not hold up another store.
    path = tmp_path / "locked.db"
    stuck = SQLiteStore(path, busy_timeout=10)
    await stuck.create_session(SessionRecord(id="s"))
    free = SQLiteStore(tmp_path / "free.db")
    assert await _thread_of(stuck) != await _thread_of(free)
    other = raw_connection(path)
    other.execute("BEGIN IMMEDIATE")
    waiting = asyncio.ensure_future(stuck.append_entries("s", [_entry("waits")]))
    await free.create_session(SessionRecord(id="f"))
    await free.append_entries("f", [_entry("not held up")])
    assert not waiting.done()
    other.execute("COMMIT")
    other.close()
    await waiting
    assert len(await stuck.load_entries("s")) == 1
    await stuck.close()
    await free.close()


def _use_in_child(store: SQLiteStore) -> None:
    async def main() -> int:
        await store.append_entries("s", [_entry("from the child")])
        return len(await store.load_entries("s"))

    sys.exit(0 if asyncio.run(main()) == 2 else 1)


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
async def test_forked_child_uses_the_store_without_its_parents_thread_or_connection(
        tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "f.db")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_entry("before the fork")])  # its thread runs
    child = multiprocessing.get_context("fork").Process(target=_use_in_child, args=(store,))
    child.start()
    await asyncio.to_thread(child.join, 30)
    if child.exitcode is None:
        child.kill()
        child.join()
    assert child.exitcode == 0
    # The child left the parent's connection alone (closing it would have
    # checkpointed and removed the WAL under the parent).
    await store.append_entries("s", [_entry("after the child")])
    assert len(await store.load_entries("s")) == 3
    await store.close()


async def test_s14_one_entry_append_takes_its_seq_under_the_write_lock(tmp_path: Path) -> None:
    # An append takes the write lock before it reads anything, so it lands
    # after a row another process inserted and committed while it waited.
    path = tmp_path / "seq.db"
    store = SQLiteStore(path, busy_timeout=10)
    await store.create_session(SessionRecord(id="s"))
    first = _entry("stored first")
    await store.append_entries("s", [first])
    other = raw_connection(path)
    other.execute("BEGIN IMMEDIATE")
    theirs = new_id()
    insert_raw_row(other, "s", f'{{"type":"custom","id":"{theirs}","parent_id":"{first.id}",'
                   f'"timestamp":"2026-01-01T00:00:00Z","kind":"x","data":{{}}}}'.encode(),
                   theirs)
    ours = _entry("waited for the lock", theirs)
    statements: list[str] = []
    await store._call(lambda conn: conn.set_trace_callback(statements.append))
    waiting = asyncio.ensure_future(store.append_entries("s", [ours]))
    await until(lambda: "BEGIN IMMEDIATE" in statements)  # its thread waits on the lock
    assert not waiting.done()
    other.execute("COMMIT")
    await waiting
    assert [e.id for e in await store.load_entries("s")] == [first.id, theirs, ours.id]
    # A refused one-entry append leaves no transaction open behind it.
    with pytest.raises(SessionNotFound):
        await store.append_entries("missing", [_entry("x")])
    assert not await store._call(lambda conn: conn.in_transaction)
    other.close()
    await store.close()


async def _hold_the_lock_while(path: Path, store: SQLiteStore,
                               statements: list[str]) -> sqlite3.Connection:
    """Another process's write lock, and the store's statements traced: while the
    store's thread waits on the lock, appends made meanwhile queue up as one group."""
    other = raw_connection(path)
    other.execute("BEGIN IMMEDIATE")
    await store._call(lambda conn: conn.set_trace_callback(statements.append))
    return other


async def test_s42_queued_appends_share_one_commit_and_a_refused_one_fails_alone(
    tmp_path: Path
) -> None:
    path = tmp_path / "group.db"
    store = SQLiteStore(path, busy_timeout=10)
    for n in range(6):
        await store.create_session(SessionRecord(id=f"s{n}"))
    stored = _entry("stored before")
    await store.append_entries("s0", [stored])
    statements: list[str] = []
    other = await _hold_the_lock_while(path, store, statements)
    ahead = asyncio.ensure_future(store.append_entries("s0", [_entry("waits for the lock")]))
    await until(lambda: "BEGIN IMMEDIATE" in statements)  # its thread waits on the lock
    statements.clear()
    three = [_entry("a"), _entry("b"), _entry("c")]
    three[1] = MessageEntry(parent_id=three[0].id, message=UserMessage.of("b"))
    calls = {
        "whole": store.append_entries("s1", three),
        "conflict": store.append_entries("s0", [_entry("mine"), MessageEntry(
            id=stored.id, message=UserMessage.of("not what s0 stored"))]),
        "missing": store.append_entries("nowhere", [_entry("x")]),
        "retry": store.append_entries("s0", [stored]),  # S25: already stored, succeeds
        "one": store.append_entries("s3", [_entry("one")]),
    }
    tasks = {name: asyncio.ensure_future(c) for name, c in calls.items()}
    await asyncio.sleep(0.1)
    other.execute("COMMIT")
    other.close()
    await ahead
    results = dict(zip(tasks, await asyncio.gather(*tasks.values(), return_exceptions=True),
                       strict=True))
    assert results["whole"] is None and results["retry"] is None and results["one"] is None
    assert isinstance(results["missing"], SessionNotFound)
    assert isinstance(results["conflict"], StoreError)
    assert "repeats an entry id" in str(results["conflict"])
    # They were stored in one transaction, after the one that waited for the lock.
    assert sum(s == "COMMIT" for s in statements) == 2
    assert [e.id for e in await store.load_entries("s1")] == [e.id for e in three]
    assert len(await store.load_entries("s3")) == 1
    # The refused call left nothing, not even its first entry.
    assert len(await store.load_entries("s0")) == 2
    await store.close()


async def test_s42_an_append_cancelled_while_queued_is_never_stored(tmp_path: Path) -> None:
    path = tmp_path / "cancel.db"
    store = SQLiteStore(path, busy_timeout=10)
    await store.create_session(SessionRecord(id="s"))
    statements: list[str] = []
    other = await _hold_the_lock_while(path, store, statements)
    ahead = asyncio.ensure_future(store.append_entries("s", [_entry("waits for the lock")]))
    await until(lambda: "BEGIN IMMEDIATE" in statements)  # its thread waits on the lock
    gone = asyncio.ensure_future(store.append_entries("s", [_entry("cancelled")]))
    kept = asyncio.ensure_future(store.append_entries("s", [_entry("kept")]))
    await asyncio.sleep(0.05)
    gone.cancel()
    other.execute("COMMIT")
    other.close()
    await asyncio.gather(ahead, kept)
    assert [e.message.text for e in await store.load_entries("s")  # type: ignore[attr-defined]
            ] == ["waits for the lock", "kept"]
    await store.close()


_GROUPS_UNTIL_FULL = """
import asyncio, resource, signal, sys
from threadline.ai._messages import UserMessage
from threadline.errors import DurabilityError
from threadline.session import MessageEntry
from threadline.stores import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    sessions = [f"s{n}" for n in range(8)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))
    for _ in range(40):
        batches = [[MessageEntry(message=UserMessage.of("x" * 3000)) for _ in range(2)]
                   for _ in sessions]
        results = await asyncio.gather(*(store.append_entries(sid, batch) for sid, batch
                                         in zip(sessions, batches)), return_exceptions=True)
        for sid, batch, result in zip(sessions, batches, results):
            verdict = ("acked" if result is None else
                       f"{type(result).__name__}:{type(result.__cause__).__name__}")
            print(verdict, sid, *(e.id for e in batch), flush=True)
        if any(r is not None for r in results):
            return

asyncio.run(main())
"""


async def _fill_until_refused(path: Path) -> list[list[str]]:
    """Run the child that appends in groups until its file-size limit; check what it left."""
    store = SQLiteStore(path)
    for n in range(8):
        await store.create_session(SessionRecord(id=f"s{n}"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _GROUPS_UNTIL_FULL, str(path), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    lines = [line.split() for line in out.decode().splitlines()]
    verdicts = {verdict for verdict, *_ in lines}
    # The file filled up partway; each refusal chains the write's error (or,
    # refused before it was queued, the error that poisoned the handle).
    assert "acked" in verdicts and len(verdicts) > 1
    assert verdicts - {"acked"} <= {"DurabilityError:OperationalError",
                                    "DurabilityError:DurabilityError"}
    stored = {sid: [e.id for e in await store.load_entries(sid)] for sid in
              (f"s{n}" for n in range(8))}
    for verdict, sid, *ids in lines:
        if verdict == "acked":
            assert set(ids) <= set(stored[sid])
        else:  # refused: none of the batch stored, not even its first entry
            assert not set(ids) & set(stored[sid])
    assert sum(map(len, stored.values())) == 2 * sum(v == "acked" for v, *_ in lines)
    await store.close()
    return lines


async def test_s42_a_failed_group_commit_fails_every_call_in_it_and_stores_none(
    tmp_path: Path
) -> None:
    # Which commit hits the limit varies: the round's first append, often
    # alone, or the group queued behind it. Only the group's failure makes
    # several calls of one round fail with the write's own error, and it must
    # be seen, not merely allowed.
    for attempt in range(8):
        lines = await _fill_until_refused(tmp_path / f"full-{attempt}.db")
        last_round = lines[-8:]
        if sum(v == "DurabilityError:OperationalError" for v, *_ in last_round) >= 2:
            return
    pytest.fail("in 8 runs no group commit failed as a whole")


def _race_close_once(
        path: Path, burst: Callable[[SQLiteStore], list[Awaitable[object]]] | None = None,
        served: list[object] | None = None) -> list[str]:
    """Two threads' loops make bursts of calls (``burst``, 50 ``load_session`` by
    default) until close() on this one refuses them; their results go to ``served``."""
    store = SQLiteStore(path)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    outcomes: list[str] = []
    started = threading.Event()

    async def hammer() -> None:
        while True:
            # A burst of calls: each one checks and queues in turn, so the
            # other thread's close() has many windows to land in.
            calls = (burst or (lambda s: [s.load_session("s") for _ in range(50)]))(store)
            try:
                results = await asyncio.wait_for(
                    asyncio.gather(*calls, return_exceptions=True), 10)
            except TimeoutError:
                outcomes.append("hung")
                return
            started.set()
            if served is not None:
                served.extend(results)
            errors = [r for r in results if isinstance(r, BaseException)]
            for error in errors:
                assert isinstance(error, StoreError), repr(error)
                assert "closed" in str(error) and str(path) in str(error)
            if errors:
                outcomes.append("refused")
                return

    others = [threading.Thread(target=asyncio.run, args=(hammer(),)) for _ in range(2)]
    for t in others:
        t.start()
    assert started.wait(10)
    asyncio.run(store.close())
    for t in others:
        t.join(30)
        assert not t.is_alive()
    return outcomes


def test_s33_a_call_from_another_thread_racing_close_is_refused_not_left_waiting(
        tmp_path: Path) -> None:
    """A call that passes the closed check just before close() queues its last
    call used to land behind it, where no thread would ever take it: the caller
    waited forever. It is now either served or refused with StoreError."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, to land inside the window
    try:
        for round_ in range(30):
            assert _race_close_once(tmp_path / f"race-{round_}.db") == ["refused", "refused"]
    finally:
        sys.setswitchinterval(old_interval)
