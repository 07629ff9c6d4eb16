"""S46: SQLite appends committed on the event loop, their WAL's fdatasync through io_uring.

Where the kernel lets the process set up a ring, the store commits an append
on the event loop (``synchronous=NORMAL``: the WAL frames go to the page
cache, nothing waits) and hands an fdatasync of the WAL to the ring; the
caller hears only once it is done. These tests check that path keeps the
worker's promises (S14, S25, S33, S42, the poisoning after a failed sync)
and that what could wait goes to the worker: another process's write lock,
a big batch, a commit that would start the WAL over or checkpoint it, calls
from another loop. A failed sync is injected at the ring's boundary
(``Ring.fdatasync``), as the file store's io_uring tests do.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from store_kinds import run_threads

# The ring's test doubles are the file store's (S44): skip without io_uring,
# and a hook between the store and the ring that delays or changes a report.
from test_store_file_uring import (
    Done,
    Submit,
    Wait,
    _first_step,
    _patch_ring,
    _slow_ring,
    ring,
)
from test_store_sqlite import _race_close_once
from threadline.ai._messages import UserMessage
from threadline.errors import DurabilityError, StoreError
from threadline.session import MessageEntry, SessionRecord, SQLiteStore, _sqlite, _uring
from threadline.testing._conformance import check_concurrent_log

__all__ = ["ring"]  # the autouse fixture, imported: these tests need the ring too



def _msg(text: str, parent_id: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent_id, message=UserMessage.of(text))


def _texts(entries: Any) -> list[str]:
    return [e.message.text for e in entries]


class Syncs:
    """The WAL syncs made: through the ring (the loop's) and by a thread (the worker's)."""

    def __init__(self) -> None:
        self.ring = 0
        self.thread = 0


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    counts = Syncs()
    real_ring: Submit = _uring.Ring.fdatasync
    real_sync = os.fdatasync

    def ring_counted(self: Any, fd: int, done: Done) -> None:
        counts.ring += 1
        real_ring(self, fd, done)

    def thread_counted(fd: int) -> None:
        counts.thread += 1
        real_sync(fd)

    monkeypatch.setattr(_uring.Ring, "fdatasync", ring_counted)
    monkeypatch.setattr(os, "fdatasync", thread_counted)
    return counts


async def _started(tmp_path: Path, session_id: str = "s") -> SQLiteStore:
    """A store whose next append commits on the loop: its loop connection is open."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    await store.create_session(SessionRecord(id=session_id))
    await store.append_entries(session_id, [_msg("first")])  # the worker opens the loop's
    assert store._lconn is not None
    return store


async def test_s46_appends_commit_on_the_loop_and_sync_the_wal_through_the_ring(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    assert store._lconn is not None
    inserts: list[int] = []
    store._lconn.set_trace_callback(
        lambda sql: inserts.append(threading.get_ident()) if sql.startswith("INSERT") else None)
    before = syncs.thread
    parent = None
    for n in range(50):
        entry = _msg(f"m{n}", parent)
        await store.append_entries("s", [entry])
        parent = entry.id
    # Each append: one commit on this thread, one fdatasync of the WAL by the ring.
    assert inserts == [threading.get_ident()] * 50
    assert syncs.ring == 50 and syncs.thread == before
    assert store._wal_fd >= 0 and os.path.samestat(
        os.fstat(store._wal_fd), os.stat(f"{tmp_path / 'db.sqlite'}-wal"))
    assert _texts(await store.load_entries("s")) == ["first"] + [f"m{n}" for n in range(50)]
    await store.close()


async def test_s46_an_idle_stores_append_commits_within_the_call_if_nothing_else_is_due(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)  # the last group's follow-up runs: the store is idle
    assert store._lconn is not None and store._busy is None
    inserts: list[str] = []
    store._lconn.set_trace_callback(
        lambda sql: inserts.append(sql) if sql.startswith("INSERT") else None)
    assert _uring.alone(loop)
    before = syncs.ring
    finish = await _first_step(store.append_entries("s", [_msg("at once")]))
    # Committed, and its sync submitted, before the call first waited.
    assert len(inserts) == 1 and syncs.ring == before + 1
    await finish()
    # With something else due, the commit waits that turn (S42's groups).
    await asyncio.sleep(0)
    loop.call_soon(lambda: None)
    finish = await _first_step(store.append_entries("s", [_msg("a turn later")]))
    assert len(inserts) == 1 and syncs.ring == before + 1
    await finish()
    assert len(inserts) == 2
    assert _texts(await store.load_entries("s")) == ["first", "at once", "a turn later"]
    await store.close()


async def test_s46_the_wal_synced_is_the_one_sqlite_writes_through_a_linked_folder(
    tmp_path: Path, syncs: Syncs
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    store = SQLiteStore(tmp_path / "link" / "db.sqlite")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("first")])
    await store.append_entries("s", [_msg("on the loop")])
    # SQLite names the WAL after the resolved path; so does the store.
    assert os.path.samestat(os.fstat(store._wal_fd),
                            (tmp_path / "real" / "db.sqlite-wal").stat())
    assert syncs.ring == 1
    await store.close()


async def test_s46_tasks_appending_in_a_loop_share_each_transaction_and_sync(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    for t in range(8):
        await store.create_session(SessionRecord(id=f"t{t}"))
    assert store._lconn is not None
    commits: list[str] = []
    store._lconn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    before = syncs.ring
    rounds = 10

    async def task(t: int) -> None:
        parent = None
        for n in range(rounds):
            entry = _msg(f"{t}.{n}", parent)
            await store.append_entries(f"t{t}", [entry])
            parent = entry.id

    await asyncio.gather(*(task(t) for t in range(8)))
    # S42 on the loop: the 8 calls of each round in one transaction and one sync.
    assert syncs.ring - before == rounds and len(commits) == rounds
    for t in range(8):
        assert _texts(await store.load_entries(f"t{t}")) == [f"{t}.{n}" for n in range(rounds)]
    await store.close()


async def test_s46_a_refused_call_fails_alone_and_a_retry_is_stored_once(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    await store.create_session(SessionRecord(id="t"))
    stored = _msg("stored before")
    await store.append_entries("s", [stored])
    calls = {
        "whole": store.append_entries("t", [_msg("a"), _msg("b")]),
        "conflict": store.append_entries("s", [_msg("mine"), MessageEntry(
            id=stored.id, message=UserMessage.of("not what s stored"))]),
        "missing": store.append_entries("nowhere", [_msg("x")]),
        "retry": store.append_entries("s", [stored]),  # S25: already stored, succeeds
    }
    before = syncs.thread
    results = dict(zip(calls, await asyncio.gather(*calls.values(), return_exceptions=True),
                       strict=True))
    assert results["whole"] is None and results["retry"] is None
    assert isinstance(results["missing"], StoreError) and "nowhere" in str(results["missing"])
    assert isinstance(results["conflict"], StoreError)
    assert "repeats an entry id" in str(results["conflict"])
    # The retry and the conflict were checked by the worker after the commit;
    # the retry is acknowledged after a sync of its own (stored is not durable).
    assert syncs.thread - before == 1
    assert _texts(await store.load_entries("s")) == ["first", "stored before"]
    assert _texts(await store.load_entries("t")) == ["a", "b"]
    await store.close()


async def test_s46_a_retry_while_the_first_sync_is_in_flight_waits_for_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    inflight, go = await _slow_ring(monkeypatch)
    batch = [_msg("a"), _msg("b")]
    first = asyncio.ensure_future(store.append_entries("s", batch))
    await inflight.wait()
    first.cancel()  # its caller gives up: the acknowledgement is lost (S25)
    before = syncs.thread
    retry = asyncio.ensure_future(store.append_entries("s", batch))
    await asyncio.sleep(0.1)
    # Stored already, and visible, but not yet durable: the retry is not
    # acknowledged before a sync that covers it.
    assert not retry.done()
    go.set()
    await asyncio.wait_for(retry, 10)
    assert syncs.thread == before + 1  # the worker's check, then its own sync
    assert _texts(await store.load_entries("s")) == ["first", "a", "b"]
    await store.close()


def _syncs_fail(monkeypatch: pytest.MonkeyPatch, held: asyncio.Event | None = None) -> None:
    """Every sync through the ring reports EIO (once ``held`` is set, if given)."""
    async def sync_fails(real: Wait, ring: Any, fd: int) -> int:
        await real(ring, fd)
        if held is not None:
            await held.wait()
        return -errno.EIO

    _patch_ring(monkeypatch, sync_fails)


async def test_s46_a_failed_sync_poisons_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)
    _syncs_fail(monkeypatch)
    with pytest.raises(DurabilityError) as caught:
        await store.append_entries("s", [_msg("not durable")])
    error = caught.value
    assert error.session_id == "s" and f"{tmp_path / 'db.sqlite'}-wal" in str(error)
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EIO
    monkeypatch.undo()
    # Every later write is refused, whichever path it would take.
    for call in (store.append_entries("s", [_msg("after")]),
                 store.create_session(SessionRecord(id="t")), store.delete_session("s")):
        with pytest.raises(DurabilityError, match="refuses writes"):
            await call
    await store.close()


async def test_s46_appends_queued_behind_a_failed_sync_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)
    released = asyncio.Event()
    _syncs_fail(monkeypatch, released)
    first = asyncio.ensure_future(store.append_entries("s", [_msg("in the failed sync")]))
    await asyncio.sleep(0.05)
    behind = asyncio.ensure_future(store.append_entries("s", [_msg("queued behind it")]))
    await asyncio.sleep(0.05)
    released.set()
    results = await asyncio.gather(first, behind, return_exceptions=True)
    assert all(isinstance(r, DurabilityError) for r in results)
    monkeypatch.undo()
    # The queued one was never written: after a failed sync nothing more is acknowledged.
    assert "queued behind it" not in _texts(await store.load_entries("s"))
    await store.close()


_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("INSERT INTO schema_migrations VALUES (1000, 'held')")
conn.execute("COMMIT")
print("released", flush=True)
"""


async def test_s46_another_process_holding_the_write_lock_never_blocks_the_loop(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, str(tmp_path / "db.sqlite"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert holder.stdin is not None and holder.stdout is not None
    assert await holder.stdout.readline() == b"holding\n"
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    before = syncs.thread
    append = asyncio.ensure_future(store.append_entries("s", [_msg("waits for the lock")]))
    await asyncio.sleep(0.3)
    assert not append.done()
    holder.stdin.write(b"go\n")
    assert await holder.stdout.readline() == b"released\n"
    await asyncio.wait_for(append, 10)
    ticking.cancel()
    await holder.wait()
    # The loop found the lock taken and went on; the worker waited for it and synced.
    assert max(gaps) < 0.1
    assert syncs.thread - before == 1
    assert _texts(await store.load_entries("s")) == ["first", "waits for the lock"]
    # Once the lock is free, appends commit on the loop again.
    ring = syncs.ring
    await store.append_entries("s", [_msg("on the loop again")])
    assert syncs.ring == ring + 1
    await store.close()


async def test_s46_a_checkpoint_while_a_sync_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    inflight, go = await _slow_ring(monkeypatch)
    append = asyncio.ensure_future(store.append_entries("s", [_msg("in flight")]))
    await inflight.wait()
    # Another connection copies the whole WAL into the database (syncing both)
    # and empties the WAL, while the ring still holds the append's report.
    other = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    busy, frames, copied = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0 and frames == copied
    assert (tmp_path / "db.sqlite-wal").stat().st_size == 0
    go.set()
    await append
    # The next commit would write and sync a new WAL header: it is the worker's.
    assert not store._wal_allows_loop_commit()
    before = syncs.thread
    await store.append_entries("s", [_msg("starts the WAL over")])
    assert syncs.thread == before + 1
    assert store._wal_allows_loop_commit()
    assert _texts(await store.load_entries("s")) == ["first", "in flight",
                                                     "starts the WAL over"]
    assert [r[0] for r in other.execute("SELECT count(*) FROM entries")] == [3]
    other.close()
    await store.close()


async def test_s46_a_long_wal_is_checkpointed_by_the_worker(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = await _started(tmp_path)
    parent = None
    for n in range(1500):  # about 4 frames each: the WAL passes 1000 frames
        entry = _msg(f"m{n} " + "x" * 200, parent)
        await store.append_entries("s", [entry])
        parent = entry.id
    # The WAL was started over after each checkpoint instead of growing: a
    # few appends went to the worker (the checkpoint, then the restart).
    wal_pages = (tmp_path / "db.sqlite-wal").stat().st_size // 4096
    assert wal_pages < 2 * _sqlite._CHECKPOINT_FRAMES
    assert 2 <= syncs.thread <= 20 and syncs.ring >= 1480
    assert len(await store.load_entries("s")) == 1501
    await store.close()


@pytest.mark.parametrize("on_loop", [True, False], ids=["loop", "worker only"])
async def test_s46_a_wal_grown_past_its_bound_is_started_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_loop: bool
) -> None:
    if on_loop:
        store = await _started(tmp_path)
    else:
        monkeypatch.setenv("THREADLINE_IO_URING", "0")
        store = SQLiteStore(tmp_path / "db.sqlite")
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", [_msg("first")])
    restarts: list[int] = []
    real = SQLiteStore._restart_wal

    def counted(self: SQLiteStore) -> None:
        restarts.append(1)
        real(self)

    monkeypatch.setattr(SQLiteStore, "_restart_wal", counted)
    # Another connection, with no checkpoint of its own, grows the WAL past
    # 16 MiB, as writers of several processes do that no copy catches up with.
    other = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    other.execute("PRAGMA wal_autocheckpoint=0")
    other.execute("CREATE TABLE junk (x BLOB)")
    other.execute("BEGIN")
    other.executemany("INSERT INTO junk VALUES (?)", [(os.urandom(20_000),)] * 900)
    other.execute("COMMIT")
    other.close()

    def frames() -> int:
        return int.from_bytes(os.pread(store._shm_fd, 4, 16), sys.byteorder)

    assert frames() >= _sqlite._WAL_MAX_FRAMES
    for n in range(3):
        await store.append_entries("s", [_msg(f"m{n}")])
    assert restarts and frames() < _sqlite._CHECKPOINT_FRAMES
    assert len(await store.load_entries("s")) == 4
    assert (store._lconn is not None) is on_loop
    await store.close()


async def test_s46_a_big_batch_goes_to_the_worker(tmp_path: Path, syncs: Syncs) -> None:
    store = await _started(tmp_path)
    ring, thread = syncs.ring, syncs.thread
    await store.append_entries("s", [_msg("x" * 100_000) for _ in range(3)])
    assert syncs.ring == ring and syncs.thread == thread + 1
    await store.append_entries("s", [_msg("small")])
    assert syncs.ring == ring + 1
    assert len(await store.load_entries("s")) == 5
    await store.close()


async def test_s46_turned_off_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    monkeypatch.setenv("THREADLINE_IO_URING", "0")
    store = SQLiteStore(tmp_path / "db.sqlite")
    await store.create_session(SessionRecord(id="s"))
    for n in range(5):
        await store.append_entries("s", [_msg(f"m{n}")])
    assert syncs.ring == 0 and store._lconn is None
    assert syncs.thread == 6  # create_session and each append: synced by the worker
    await store.close()


async def test_s46_synchronous_normal_commits_on_the_loop_without_a_sync(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite", synchronous="NORMAL")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("first")])
    assert store._lconn is not None
    inserts: list[int] = []
    store._lconn.set_trace_callback(
        lambda sql: inserts.append(1) if sql.startswith("INSERT") else None)
    for n in range(10):
        await store.append_entries("s", [_msg(f"m{n}")])
    assert len(inserts) == 10 and syncs.ring == 0 and syncs.thread == 0
    await store.close()


def test_s46_one_store_shared_by_threads_with_their_own_event_loops(
    tmp_path: Path, syncs: Syncs
) -> None:
    # One loop is the store's home, whose appends commit there; the others' go
    # to the worker, in call order with the home's (S33).
    store = asyncio.run(_started(tmp_path))
    chains: dict[int, list[str]] = {}

    def writer(w: int) -> None:
        async def run() -> None:
            chains[w] = []
            parent = None
            for n in range(30):
                entry = _msg(f"{w}.{n}", parent)
                await store.append_entries("s", [entry])
                chains[w].append(entry.id)
                parent = entry.id

        asyncio.run(run())

    run_threads(writer, 4)
    log = asyncio.run(store.load_entries("s"))
    check_concurrent_log(log[1:], list(chains.values()))
    asyncio.run(store.close())


def test_s46_a_loop_closed_mid_sync_leaves_the_store_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = asyncio.run(_started(tmp_path))
    callers: list[asyncio.Future[None]] = []

    async def ends_mid_sync() -> None:
        inflight, _ = await _slow_ring(monkeypatch)
        callers.append(asyncio.ensure_future(store.append_entries("s", [_msg("abandoned")])))
        await inflight.wait()
        # Returning ends the loop: asyncio.run cancels the caller, closes the
        # loop, and the group's report never comes.

    asyncio.run(ends_mid_sync())
    monkeypatch.undo()
    assert callers[0].cancelled()

    async def later() -> list[str]:  # another loop's append takes the queue over
        await asyncio.wait_for(store.append_entries("s", [_msg("later")]), 10)
        await asyncio.wait_for(store.append_entries("s", [_msg("and on")]), 10)
        return _texts(await store.load_entries("s"))

    # Committed before its sync was handed over: stored, though never acknowledged
    # (a retry would be stored once, S25).
    assert asyncio.run(later()) == ["first", "abandoned", "later", "and on"]
    asyncio.run(asyncio.wait_for(store.close(), 10))


async def test_s46_close_waits_for_the_sync_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)
    inflight, go = await _slow_ring(monkeypatch)
    append = asyncio.ensure_future(store.append_entries("s", [_msg("in flight")]))
    await inflight.wait()
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0.05)
    assert not closing.done()
    with pytest.raises(StoreError, match="closed"):
        await store.append_entries("s", [_msg("after close")])
    go.set()
    await asyncio.wait_for(asyncio.gather(append, closing), 10)
    assert store._lconn is None and store._wal_fd == -1
    async with SQLiteStore(tmp_path / "db.sqlite") as again:
        assert _texts(await again.load_entries("s")) == ["first", "in flight"]


_KILLED = """
import asyncio, sys
from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    await store.append_entries("s", [MessageEntry(message=UserMessage.of("warm"))])
    print("loop" if store._lconn is not None else "worker", flush=True)
    n = 0
    while True:
        batch = [MessageEntry(message=UserMessage.of(f"{n}.{k} " + "x" * 500)) for k in range(3)]
        print("try", *(e.id for e in batch), flush=True)
        await store.append_entries("s", batch)
        print("ack", *(e.id for e in batch), flush=True)
        n += 1

asyncio.run(main())
"""


async def test_s46_kill_9_mid_append_leaves_each_batch_whole_or_absent(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with SQLiteStore(path) as store:
        await store.create_session(SessionRecord(id="s"))
    tried: list[list[str]] = []
    acked: set[str] = set()
    for round_ in range(6):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _KILLED, str(path), stdout=asyncio.subprocess.PIPE)
        assert child.stdout is not None
        assert await child.stdout.readline() == b"loop\n"  # its appends commit on its loop
        await asyncio.sleep(0.05 + 0.03 * round_)
        child.send_signal(signal.SIGKILL)
        out = (await child.stdout.read()).decode().split("\n")
        await child.wait()
        for line in out:
            verb, *ids = line.split() or [""]
            if verb == "try" and len(ids) == 3:
                tried.append(ids)
            elif verb == "ack" and len(ids) == 3:
                acked.update(ids)
    async with SQLiteStore(path) as store:
        stored = {e.id for e in await store.load_entries("s")}
    assert acked and acked <= stored
    for batch in tried:  # S14: whole or absent, whatever instant the kill landed at
        assert len(set(batch) & stored) in (0, 3)


def test_s46_appends_from_other_loops_racing_close_are_stored_or_refused(
        tmp_path: Path) -> None:
    for round_ in range(10):
        path = tmp_path / f"race-{round_}.db"
        served: list[object] = []
        # Eight appends at once: the first loop to append is the store's home
        # and commits them itself; the other loop's queue behind, for the worker.
        outcomes = _race_close_once(
            path, lambda store: [store.append_entries("s", [_msg("x")]) for _ in range(8)],
            served)
        assert outcomes == ["refused", "refused"]
        # Every acknowledged append is stored; a refused one never is (it was
        # refused before it was queued).
        assert asyncio.run(_count(path)) == sum(r is None for r in served)


async def _count(path: Path) -> int:
    async with SQLiteStore(path) as store:
        return len(await store.load_entries("s"))
