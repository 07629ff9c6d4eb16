"""S14: one ``append_entries`` call is all or nothing, on every store, under SIGKILL.

A forked child creates a session and appends one multi-MB batch in a single
call; the parent kills it with SIGKILL at a delay that adapts towards the
moment the batch lands (longer after a kill that left nothing, shorter after
one that left everything), so most kills fall inside the write. Every load
afterwards must show the whole batch or none of it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support.stores import say_before_big_writes
from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.session._entries import Entry
from threadline.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store

BATCH = 3_000
TEXT = 1_000  # characters per entry: the batch is about 3 MB
KILLS = 50

Opener = Callable[[], Store]


def _batch() -> list[Entry]:
    """A fresh chain of ``BATCH`` entries (new ids every call)."""
    out: list[Entry] = []
    parent: str | None = None
    for n in range(BATCH):
        text = f"{n} " + ("abcdé漢 " * (TEXT // 7 + 1))[:TEXT]
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(text))
        parent = entry.id
        out.append(entry)
    return out


async def _close(store: Store) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()


def _child(opener: Opener, session_id: str, fd: int, mark_write: bool) -> None:
    """Create the session, say "s", append the batch in one call, say "d".

    With ``mark_write`` it also says "w" just before the store's big
    ``os.write``, so the parent can aim its kill into the write itself.
    """
    if mark_write:
        say_before_big_writes(fd)

    async def run() -> None:
        store = opener()
        await store.create_session(SessionRecord(id=session_id))
        batch = _batch()
        os.write(fd, b"s")
        await store.append_entries(session_id, batch)
        os.write(fd, b"d")
        await _close(store)

    asyncio.run(run())


def _load(opener: Opener, session_id: str) -> tuple[int, list[str]]:
    async def run() -> tuple[int, list[str]]:
        store = opener()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                log = await store.load_entries(session_id)
            return len(log), list(getattr(log, "diagnostics", []))
        finally:
            await _close(store)

    return asyncio.run(run())


@dataclass
class Tally:
    kills: int = 0
    in_call: int = 0  # killed after "s" and before "d"
    torn: int = 0  # left bytes of the batch on disk, but not all of them
    outcomes: dict[str, int] = field(default_factory=lambda: {"none": 0, "all": 0})


def _round(opener: Opener, session_id: str, delay: float | None, tally: Tally,
           mark: bytes = b"s") -> str:
    """One child; SIGKILL it ``delay`` seconds after it says ``mark`` (None: let it finish)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.close(read_fd)
            _child(opener, session_id, write_fd, mark_write=mark == b"w")
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 60)
        assert ready and os.read(read_fd, 1) == b"s", "the child did not start its append"
        if mark != b"s":
            ready, _, _ = select.select([read_fd], [], [], 60)
            assert ready and os.read(read_fd, 1) == mark, f"the child never said {mark!r}"
        if delay is not None:
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        said = b""
        while chunk := os.read(read_fd, 16):
            said += chunk
    finally:
        os.close(read_fd)
    if os.WIFSIGNALED(status):
        tally.kills += 1
        tally.in_call += b"d" not in said
    count, diagnostics = _load(opener, session_id)
    assert count in (0, BATCH), f"{session_id}: {count} of {BATCH} entries after a kill"
    outcome = "all" if count else "none"
    tally.outcomes[outcome] += 1
    if count == 0 and diagnostics:
        tally.torn += 1
    return outcome


def _kill_until(opener: Opener, prefix: str, mark: bytes = b"s",
                min_torn: int = 0) -> tuple[Tally, list[str]]:
    # How long one uninterrupted append takes from the mark to done, roughly.
    tally = Tally()
    started = time.monotonic()
    _round(opener, f"{prefix}-calibrate", None, tally, mark)
    delay = (time.monotonic() - started) / 3
    assert tally.outcomes["all"] == 1
    tally = Tally()
    rnd = random.Random(1)
    sessions: list[str] = []
    while ((tally.kills < KILLS or tally.torn < min_torn)
           and len(sessions) < 4 * KILLS):
        sid = f"{prefix}-{len(sessions)}"
        sessions.append(sid)
        torn = tally.torn
        outcome = _round(opener, sid, delay * rnd.uniform(0.8, 1.2), tally, mark)
        if tally.torn == torn:  # not inside the write: aim earlier or later
            delay *= 0.8 if outcome == "all" else 1.25
    assert tally.kills >= KILLS, tally
    print(prefix, tally)  # shown with pytest -s
    return tally, sessions


def _reload_all_or_none(opener: Opener, sessions: list[str]) -> None:
    # Later loads too: a server may finish a dead client's statement late.
    for sid in sessions:
        assert _load(opener, sid)[0] in (0, BATCH), sid


def test_s14_file_store_batch_is_all_or_nothing_under_sigkill(tmp_path: Path) -> None:
    opener = functools.partial(FileStore, tmp_path)
    tally, sessions = _kill_until(opener, "file", mark=b"w", min_torn=10)
    # A kill that left part of the batch on disk is the case that matters.
    assert tally.torn >= 10, tally
    assert tally.outcomes["all"] >= 1, tally
    # The next append moves the cut batch aside, and the session goes on.
    torn = [sid for sid in sessions if _load(opener, sid)[1]]
    for sid in torn[:5]:
        async def append(sid: str = sid) -> None:
            store = FileStore(tmp_path)
            await store.append_entries(sid, [MessageEntry(message=UserMessage.of("after"))])
            await store.close()

        asyncio.run(append())
        assert _load(opener, sid) == (1, [])
        assert list(tmp_path.glob(f"{sid}.jsonl.torn-*"))
    _reload_all_or_none(opener, [sid for sid in sessions if sid not in torn[:5]])


def test_s14_sqlite_store_batch_is_all_or_nothing_under_sigkill(tmp_path: Path) -> None:
    opener = functools.partial(SQLiteStore, tmp_path / "sessions.db")
    tally, sessions = _kill_until(opener, "sqlite")
    assert tally.in_call >= KILLS // 2, tally
    _reload_all_or_none(opener, sessions)


def test_s14_postgres_store_batch_is_all_or_nothing_under_sigkill(
    pg_url: str, pg_schema: str
) -> None:
    opener = functools.partial(PostgresStore, pg_url, schema=pg_schema, max_size=1)
    # Create the schema once, so the children race on appends, not on migrating.
    asyncio.run(_warm_up(opener))
    tally, sessions = _kill_until(opener, "pg")
    assert tally.in_call >= KILLS // 2, tally
    _reload_all_or_none(opener, sessions)


async def _warm_up(opener: Opener) -> None:
    store = opener()
    try:
        await store.create_session(SessionRecord(id="pg-warm-up"))
    finally:
        await _close(store)


def test_s14_memory_store_batch_is_all_or_nothing_within_the_process() -> None:
    # A memory store dies with its process, so what SIGKILL tests elsewhere is
    # tested here inside one: a reader in another thread never sees part of
    # a call, and a call that fails part way leaves nothing.
    store = MemoryStore()
    sizes: set[int] = set()
    stop = threading.Event()

    def reader() -> None:
        async def run() -> None:
            while not stop.is_set():
                sizes.add(len(await store.load_entries("mem")))

        asyncio.run(run())

    async def main() -> None:
        await store.create_session(SessionRecord(id="mem"))
        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for _ in range(5):
                await store.append_entries("mem", _batch())
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join)

    asyncio.run(main())
    assert sizes <= {BATCH * n for n in range(6)}, sorted(sizes)
    assert len(sizes) > 2, sizes  # the reader did run while batches landed


@pytest.fixture(autouse=True)
def _quiet_fork_warnings() -> Any:
    # Python 3.12+ warns about fork() with threads; the children here only
    # run their own event loop and exit.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
