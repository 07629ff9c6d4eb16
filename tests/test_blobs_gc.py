"""Garbage collection of blobs by reference, with a grace period, against racing appends (S58)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from threadline.ai._messages import BlobPart, TextPart, UserMessage
from threadline.errors import CorruptLog
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import (
    FileStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    attach,
    collect_garbage,
    copy_sessions,
    open_blob,
)

_OLD_SECONDS = 3 * 3600  # well past the default grace of an hour


def _message(part: BlobPart) -> MessageEntry:
    return MessageEntry(message=UserMessage(content=(TextPart(text="look"), part)))


@pytest.fixture(params=["memory", "file", "sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Opened:
    """A store of one kind, and a way to make one of its blobs look old."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.root = tmp_path / "files"
        self.db = tmp_path / "s.db"
        if kind == "postgres":
            self.url = request.getfixturevalue("pg_url")
            self.schema = request.getfixturevalue("pg_schema")
        self._memory = MemoryStore()

    def open(self) -> Store:
        if self.kind == "memory":
            return self._memory
        if self.kind == "file":
            return FileStore(self.root)
        if self.kind == "sqlite":
            return SQLiteStore(self.db)
        return PostgresStore(self.url, schema=self.schema, max_size=3)

    def age(self, key: str) -> None:
        """Move the blob's touched time hours into the past (as if attached long ago)."""
        if self.kind == "memory":
            data, touched = self._memory._blobs[key]
            self._memory._blobs[key] = (data, touched - _OLD_SECONDS * 1_000_000)
        elif self.kind == "file":
            path = self.root / "blobs" / key[:2] / key
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - _OLD_SECONDS * 10**9))
        elif self.kind == "sqlite":
            with sqlite3.connect(self.db) as conn:
                conn.execute("UPDATE blobs SET touched_at = touched_at - ? WHERE key = ?",
                             (_OLD_SECONDS * 1_000_000, key))
        else:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"UPDATE {self.schema}.blobs SET touched_at = touched_at - "
                             f"interval '{_OLD_SECONDS} seconds' WHERE key = %s", (key,))


@pytest.fixture
def opened(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Opened:
    return Opened(kind, tmp_path, request)


async def _close(store: Store) -> None:
    await store.close()  # type: ignore[attr-defined]


async def test_s58_only_unreferenced_blobs_past_the_grace_go(opened: Opened) -> None:
    store = opened.open()
    try:
        await store.create_session(SessionRecord(id="s"))
        kept = await attach(store, "s", b"referenced", media_type="image/png")
        await store.append_entries("s", [_message(kept)])
        young = await attach(store, "s", b"attached, not appended yet", media_type="image/png")
        stale = await attach(store, "s", b"abandoned long ago", media_type="image/png")
        for part in (kept, stale):
            opened.age(part.sha256)
        report = await collect_garbage(store)
        assert report.deleted == [stale.sha256]
        assert (report.sessions, report.referenced, report.young) == (1, 1, 1)
        assert report.freed == stale.size
        assert await open_blob(store, "s", kept) == b"referenced"
        assert await open_blob(store, "s", young) == b"attached, not appended yet"
        # With no grace the young one goes too; the referenced one never does.
        assert (await collect_garbage(store, grace=timedelta(0))).deleted == [young.sha256]
        assert await open_blob(store, "s", kept) == b"referenced"
    finally:
        await _close(store)


async def test_s58_deleted_sessions_stop_counting_forks_keep_counting(opened: Opened) -> None:
    store = opened.open()
    try:
        await store.create_session(SessionRecord(id="parent"))
        shared = await attach(store, "parent", b"in both", media_type="image/png")
        only = await attach(store, "parent", b"parent only", media_type="image/png")
        await store.append_entries("parent", [_message(shared), _message(only)])
        # A fork carries the parent's entries it keeps: the shared image, stored once.
        await store.create_session(SessionRecord(id="fork", parent_id="parent"))
        await store.append_entries("fork", [_message(shared)])
        for part in (shared, only):
            opened.age(part.sha256)
        assert (await collect_garbage(store)).deleted == []
        await store.delete_session("parent")  # type: ignore[attr-defined]
        assert (await collect_garbage(store)).deleted == [only.sha256]
        assert await open_blob(store, "fork", shared) == b"in both"
        await store.delete_session("fork")  # type: ignore[attr-defined]
        assert (await collect_garbage(store)).deleted == [shared.sha256]
    finally:
        await _close(store)


async def test_s58_a_session_that_cannot_be_read_stops_the_sweep(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")
    part = await attach(store, "s", b"maybe referenced", media_type="image/png")
    Opened("file", tmp_path, None).age(part.sha256)  # type: ignore[arg-type]
    (tmp_path / "files" / "broken.jsonl").write_bytes(b"not a session\n")
    with pytest.raises(CorruptLog, match=r"broken\.jsonl"):
        await collect_garbage(store)
    assert await store.get_blob(part.sha256) == b"maybe referenced"


async def test_s58_concurrent_appends_never_lose_a_blob_to_a_running_collector(
    opened: Opened,
) -> None:
    """Writers attach and append (new images and old ones again) while GC runs nonstop.

    Each old seed is referenced by a holder session until a writer deletes
    it: from then on the seed is old and unreferenced, so the collector may
    take it, and the writer attaches it again and appends a reference. The
    attach must win (its touch spares the blob) or the reference dangles.
    Every acknowledged reference is opened at the end.
    """
    store = opened.open()
    seeds = [f"seed {n} ".encode() * 500 for n in range(50)]
    stop = threading.Event()
    gone: list[str] = []

    def collector() -> None:
        # A thread and loop of its own, so the collection interleaves with the
        # writers at any point, not only where they await.
        async def collect() -> None:
            gc_store = opened.open()
            try:
                while not stop.is_set():
                    gone.extend((await collect_garbage(gc_store)).deleted)
            finally:
                if gc_store is not store:
                    await _close(gc_store)

        asyncio.run(collect())

    try:
        await store.create_session(SessionRecord(id="w0"))
        await store.create_session(SessionRecord(id="w1"))
        await _hold(store, opened, seeds)
        acknowledged: list[tuple[str, BlobPart]] = []
        rng = random.Random(7)
        left = list(enumerate(seeds))[:40]  # attached again; the last 10 are abandoned

        async def writer(sid: str) -> None:
            for n in range(60):
                if n % 3 == 0 and left:
                    k, data = left.pop(rng.randrange(len(left)))  # an old blob, again
                    await store.delete_session(f"h{k}")  # type: ignore[attr-defined]
                    await asyncio.sleep(rng.random() * 0.03)
                else:
                    data = os.urandom(2048)
                part = await attach(store, sid, data, media_type="image/png")
                await asyncio.sleep(rng.random() * 0.02)  # collections run in between
                await store.append_entries(sid, [_message(part)])
                acknowledged.append((sid, part))
                if n % 12 == 1:
                    await store.delete_session(f"h{40 + n // 12 + (5 if sid == 'w1' else 0)}")  # type: ignore[attr-defined]

        gc = asyncio.create_task(asyncio.to_thread(collector))
        try:
            await asyncio.gather(writer("w0"), writer("w1"))
        finally:
            stop.set()
            await gc
        gone.extend((await collect_garbage(store)).deleted)
        abandoned = {hashlib.sha256(d).hexdigest() for d in seeds[40:]}
        assert abandoned <= set(gone), "the seeds nobody references any more were not collected"
        # A seed collected before a writer attached it again was stored again:
        # what counts is that every acknowledged reference opens.
        for sid, part in acknowledged:
            assert len(await open_blob(store, sid, part)) == part.size
    finally:
        await _close(store)


async def _hold(store: Store, opened: Opened, seeds: list[bytes]) -> None:
    """Each seed referenced by a session ``h<n>`` of its own, and made old."""
    for n, data in enumerate(seeds):
        await store.create_session(SessionRecord(id=f"h{n}"))
        part = await attach(store, f"h{n}", data, media_type="image/png")
        await store.append_entries(f"h{n}", [_message(part)])
        opened.age(part.sha256)


_WRITER = """
import asyncio, os, sys
from threadline.ai._messages import TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, SQLiteStore, attach
kind, where, sid = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    store = FileStore(where) if kind == "file" else SQLiteStore(where)
    await store.create_session(SessionRecord(id=sid))
    for n in range(80):
        if n % 2:  # an old seed: its holder goes, then the seed is attached again
            k = n // 2 + (20 if sid == "p1" else 0) if n < 40 else None
        else:
            k = None
        if k is not None:
            await store.delete_session(f"h{k}")
            data = f"seed {k} ".encode() * 500
        else:
            data = os.urandom(4096)
        part = await attach(store, sid, data, media_type="image/png")
        await store.append_entries(sid, [MessageEntry(message=UserMessage(
            content=(TextPart(text="x"), part)))])
        print(part.sha256, part.size, flush=True)
    await store.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s58_processes_appending_while_another_collects(
    opened: Opened, kind: str
) -> None:
    store = opened.open()
    try:
        await _hold(store, opened, [f"seed {n} ".encode() * 500 for n in range(45)])
        for n in range(40, 45):  # abandoned: the collector takes these while the children run
            await store.delete_session(f"h{n}")  # type: ignore[attr-defined]
        where = str(opened.root if kind == "file" else opened.db)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        children = [await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WRITER, kind, where, f"p{n}", env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in range(2)]
        waiting = asyncio.gather(*(c.communicate() for c in children))
        deleted: set[str] = set()
        while not waiting.done():
            deleted.update((await collect_garbage(store)).deleted)
            await asyncio.sleep(0)
        outputs = await waiting
        for child, (_, err) in zip(children, outputs, strict=True):
            assert child.returncode == 0, err.decode()
        deleted.update((await collect_garbage(store)).deleted)
        assert deleted, "no old unreferenced seed was collected"
        for n, (out, _) in enumerate(outputs):
            lines = out.decode().splitlines()
            assert len(lines) == 80
            for line in lines:
                sha, size = line.split()
                part = BlobPart(sha256=sha, media_type="image/png", size=int(size))
                assert len(await open_blob(store, f"p{n}", part)) == int(size)
    finally:
        await _close(store)


async def test_s58_a_copy_touches_what_the_destination_has_so_it_is_spared(
    opened: Opened,
) -> None:
    # The destination holds the image already, old and referenced by nothing
    # (its session was deleted): the copy does not send it again, but it must
    # touch it, or a collection running meanwhile takes it from under the copy.
    store = opened.open()
    src = MemoryStore()
    try:
        await store.create_session(SessionRecord(id="gone"))
        part = await attach(store, "gone", b"shared image", media_type="image/png")
        await store.delete_session("gone")  # type: ignore[attr-defined]
        opened.age(part.sha256)
        await src.create_session(SessionRecord(id="s"))
        assert await attach(src, "s", b"shared image", media_type="image/png") == part
        await src.append_entries("s", [_message(part)])
        touched = await store.touch_blobs([part.sha256, "e" * 64])  # type: ignore[attr-defined]
        assert touched == {part.sha256}
        opened.age(part.sha256)
        result = await copy_sessions(src, store)
        assert (result.copied, result.blobs) == (1, 0)  # not sent again
        (info,) = await store.list_blobs()  # type: ignore[attr-defined]
        assert info.touched_at > datetime.now(UTC) - timedelta(minutes=10)
        assert (await collect_garbage(store)).deleted == []
        assert await open_blob(store, "s", part) == b"shared image"
    finally:
        await _close(store)
