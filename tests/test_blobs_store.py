"""Blobs on the four stores: the conformance part, then what is particular to each (S57)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from threadline.ai._messages import BlobPart, TextPart, UserMessage
from threadline.errors import (
    BlobNotFound,
    BlobTooLarge,
    ConfigError,
    CorruptLog,
    StoreError,
)
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import (
    FileStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    attach,
    copy_sessions,
    open_blob,
)
from threadline.stores._blobs import blob_parts
from threadline.testing._conformance import BlobTests

_FAR = datetime(9999, 1, 1, tzinfo=UTC)


@pytest.mark.asyncio
class TestMemoryBlobs(BlobTests):
    capabilities = frozenset({"blobs"})
    shared_instances = False

    async def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()


@pytest.mark.asyncio
class TestFileBlobs(BlobTests):
    capabilities = frozenset({"blobs"})

    async def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "sessions")


@pytest.mark.asyncio
class TestSQLiteBlobs(BlobTests):
    capabilities = frozenset({"blobs"})

    async def make_store(self, tmp_path: Path) -> Store:
        return SQLiteStore(tmp_path / "sessions.db")


@pytest.mark.asyncio
class TestPostgresBlobs(BlobTests):
    capabilities = frozenset({"blobs"})

    @pytest.fixture(autouse=True)
    def _schema(self, pg_url: str, pg_schema: str) -> Iterator[None]:
        self.pg_url, self.pg_schema = pg_url, pg_schema
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        return PostgresStore(self.pg_url, schema=self.pg_schema, max_size=4)


def _message(*parts: TextPart | BlobPart) -> MessageEntry:
    return MessageEntry(message=UserMessage(content=(TextPart(text="see"), *parts)))


# -- attach and open (every store) --------------------------------------------------


@pytest.fixture(params=["memory", "file", "sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _open(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "file":
        return FileStore(tmp_path / "files")
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "s.db")
    return PostgresStore(request.getfixturevalue("pg_url"),
                         schema=request.getfixturevalue("pg_schema"), max_size=2)


async def test_s57_attach_then_append_dedupes_and_opens(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = await _open(kind, tmp_path, request)
    try:
        await store.create_session(SessionRecord(id="s"))
        image = os.urandom(1 << 20)
        first = await attach(store, "s", image, media_type="Image/PNG", name="cat.png")
        again = await attach(store, "s", image, media_type="image/png")
        assert first.sha256 == again.sha256 == hashlib.sha256(image).hexdigest()
        assert (first.media_type, first.size, first.name) == ("image/png", len(image), "cat.png")
        await store.append_entries("s", [_message(first), _message(again)])
        assert len(await store.list_blobs()) == 1  # type: ignore[attr-defined]
        loaded = await store.load_entries("s")
        assert blob_parts(loaded) == [first]
        assert await open_blob(store, "s", first) == image
        # A reference to bytes never stored: the typed error names session, entry, hash.
        ghost = BlobPart(sha256="0" * 64, media_type="image/png", size=3)
        with pytest.raises(BlobNotFound) as caught:
            await open_blob(store, "s", ghost, entry_id="e-1")
        text = str(caught.value)
        assert "'s'" in text and "e-1" in text and "0" * 64 in text
        assert caught.value.session_id == "s" and caught.value.entry_id == "e-1"
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_s57_too_large_stores_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = await _open(kind, tmp_path, request)
    try:
        with pytest.raises(BlobTooLarge) as caught:
            await attach(store, "s", b"x" * 1001, media_type="image/png", max_size=1000,
                         name="big\u202e.png")
        assert caught.value.size == 1001 and caught.value.limit == 1000
        assert "\u202e" not in str(caught.value)  # repr escapes what would reorder the line
        assert await store.list_blobs() == []  # type: ignore[attr-defined]
        for bad in ("text/html; charset=utf-8", "image", "", "image/png\r\nX-Evil: 1", 7):
            with pytest.raises(ConfigError):
                await attach(store, "s", b"x", media_type=bad)  # type: ignore[arg-type]
        assert await store.list_blobs() == []  # type: ignore[attr-defined]
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_s57_open_blob_refuses_bytes_that_do_not_match(tmp_path: Path) -> None:
    store = MemoryStore()
    part = await attach(store, "s", b"good", media_type="text/plain")
    await store.put_blob(part.sha256, b"evil")  # already there: nothing changes
    assert await open_blob(store, "s", part) == b"good"
    store._blobs[part.sha256] = (b"evil", 0)
    with pytest.raises(CorruptLog, match=part.sha256):
        await open_blob(store, "s", part)


async def test_s57_copy_sessions_carries_blobs_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    src = FileStore(tmp_path / "src")
    dst = await _open(kind, tmp_path, request)
    try:
        await src.create_session(SessionRecord(id="a"))
        await src.create_session(SessionRecord(id="b", parent_id="a"))
        image = os.urandom(300_000)
        part = await attach(src, "a", image, media_type="image/jpeg")
        other = await attach(src, "b", b"notes", media_type="text/plain", name="n.txt")
        await src.append_entries("a", [_message(part)])
        await src.append_entries("b", [_message(part), _message(other)])
        result = await copy_sessions(src, dst)
        assert (result.copied, result.blobs) == (2, 2)  # the shared image went once
        assert await open_blob(dst, "b", part) == image
        assert await open_blob(dst, "b", other) == b"notes"
        again = await copy_sessions(src, dst)
        assert (again.skipped, again.blobs) == (2, 0)
    finally:
        await dst.close()  # type: ignore[attr-defined]


async def test_s57_copy_refuses_before_appending_when_a_blob_is_missing(tmp_path: Path) -> None:
    src, dst = MemoryStore(), MemoryStore()
    await src.create_session(SessionRecord(id="a"))
    part = await attach(src, "a", b"gone", media_type="image/png")
    await src.append_entries("a", [_message(part)])
    await src.delete_blobs([part.sha256], older_than=_FAR)
    with pytest.raises(BlobNotFound, match="'a'"):
        await copy_sessions(src, dst)
    assert await dst.load_entries("a") == []  # no reference without its bytes


async def test_s57_delete_session_leaves_blobs_to_the_collector(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = await _open(kind, tmp_path, request)
    try:
        await store.create_session(SessionRecord(id="s"))
        part = await attach(store, "s", b"kept", media_type="image/png")
        await store.append_entries("s", [_message(part)])
        await store.delete_session("s")  # type: ignore[attr-defined]
        assert await store.get_blob(part.sha256) == b"kept"  # type: ignore[attr-defined]
    finally:
        await store.close()  # type: ignore[attr-defined]


def test_s57_blob_parts_finds_references_in_custom_data_and_ignores_lookalikes() -> None:
    from threadline.session import CustomEntry

    real = BlobPart(sha256="a" * 64, media_type="image/png", size=1)
    nested = CustomEntry(kind="app.note", data={"files": [{"type": "blob", "sha256": "b" * 64,
                                                           "media_type": "text/plain",
                                                           "size": 2}],
                                                "fake": {"type": "blob", "sha256": 5}})
    found = blob_parts([_message(real), nested, _message(real)])
    assert [p.sha256 for p in found] == ["a" * 64, "b" * 64]


# -- the file store: where blobs go, links, sync order ---------------------------------


async def test_s57_file_blobs_live_under_root_blobs(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    part = await attach(store, "s", b"png bytes", media_type="image/png")
    path = tmp_path / "root" / "blobs" / part.sha256[:2] / part.sha256
    assert path.read_bytes() == b"png bytes"
    assert (await store.list_sessions()).problems == []  # the folder is not a session
    assert sorted(p.name for p in path.parent.iterdir()) == [part.sha256]  # no temp left


async def test_s57_file_store_never_follows_a_link_under_blobs(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    store = FileStore(tmp_path / "root")
    key = "ab" + "0" * 62
    # A link where a blob file would be, then where its folder would be, then at blobs/.
    (tmp_path / "root" / "blobs" / "ab").mkdir(parents=True)
    os.symlink(outside / "secret", tmp_path / "root" / "blobs" / "ab" / key)
    with pytest.raises(CorruptLog, match="never follows links"):
        await store.get_blob(key)
    with pytest.raises(CorruptLog):
        await store.put_blob(key, b"over")
    assert (outside / "secret").read_bytes() == b"secret"
    assert await store.list_blobs() == []
    os.unlink(tmp_path / "root" / "blobs" / "ab" / key)
    os.rmdir(tmp_path / "root" / "blobs" / "ab")
    os.symlink(outside, tmp_path / "root" / "blobs" / "ab")
    with pytest.raises(StoreError, match="never follows links"):
        await store.put_blob(key, b"over")
    with pytest.raises(StoreError):
        await store.get_blob(key)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    os.unlink(tmp_path / "root" / "blobs" / "ab")
    (tmp_path / "root" / "blobs" / ".lock").unlink()
    (tmp_path / "root" / "blobs").rmdir()
    os.symlink(outside, tmp_path / "root" / "blobs")
    with pytest.raises(StoreError, match="never follows links"):
        await store.put_blob(key, b"over")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


async def test_s57_file_blob_is_synced_before_put_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "root")
    events: list[str] = []
    real_fsync, real_fdatasync, real_rename = os.fsync, os.fdatasync, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fdatasync(fd)

    def rename(src: str, dst: str, **kw: int) -> None:
        events.append("rename")
        real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "rename", rename)
    part = await attach(store, "s", b"durable", media_type="image/png")
    # The bytes synced, renamed into place, then the folder holding the name synced.
    synced_bytes, renamed, synced_name = events[-3:]
    assert synced_bytes.startswith(f"fsync .{part.sha256}.") and synced_bytes.endswith(".tmp")
    assert (renamed, synced_name) == ("rename", f"fsync {part.sha256[:2]}")
    events.clear()
    await attach(store, "s", b"durable", media_type="image/png")
    assert events == []  # stored already: a touch, no new bytes


_PUT_AND_DIE = """
import asyncio, os, sys
from threadline.stores import FileStore, PostgresStore, SQLiteStore, attach
kind, where, schema = sys.argv[1], sys.argv[2], sys.argv[3]
store = (FileStore(where) if kind == "file" else SQLiteStore(where) if kind == "sqlite"
         else PostgresStore(where, schema=schema, max_size=1))
part = asyncio.run(attach(store, "s", b"acknowledged " * 1000, media_type="image/png"))
print(part.sha256, flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("which", ["file", "sqlite", "postgres"])
def test_s57_a_blob_acknowledged_then_killed_is_there(
    tmp_path: Path, which: str, request: pytest.FixtureRequest
) -> None:
    schema = ""
    if which == "postgres":
        where, schema = request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")
    else:
        where = str(tmp_path / ("root" if which == "file" else "s.db"))
    child = subprocess.run([sys.executable, "-c", _PUT_AND_DIE, which, where, schema],
                           capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == -9, child.stderr
    key = child.stdout.strip()
    store: Store = (FileStore(where) if which == "file" else SQLiteStore(where)
                    if which == "sqlite" else PostgresStore(where, schema=schema, max_size=1))

    async def read() -> bytes:
        try:
            return await store.get_blob(key)  # type: ignore[attr-defined,no-any-return]
        finally:
            await store.close()  # type: ignore[attr-defined]

    assert asyncio.run(read()) == b"acknowledged " * 1000


# -- migrations -----------------------------------------------------------------------


async def test_s57_sqlite_migration_5_adds_blobs_to_an_old_database(tmp_path: Path) -> None:
    from threadline.stores.sqlite._schema import MIGRATIONS

    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="old"))
    await store.append_entries("old", [_message()])
    await store.close()
    with sqlite3.connect(path) as conn:  # back to what a release before blobs left
        conn.execute("DROP TABLE blobs")
        conn.execute("DELETE FROM schema_migrations WHERE version = 5")
    assert MIGRATIONS[-1][0] == 5
    store = SQLiteStore(path)
    try:
        assert len(await store.load_entries("old")) == 1
        await store.put_blob("c" * 64, b"new")
        assert await store.get_blob("c" * 64) == b"new"
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")][-1] == 5


async def test_s57_postgres_migration_7_adds_blobs(pg_url: str, pg_schema: str) -> None:
    import psycopg

    from threadline.stores.postgres import _schema

    assert 7 in [version for version, _ in _schema.MIGRATIONS]
    saved = _schema.MIGRATIONS
    _schema.MIGRATIONS = tuple(m for m in saved if m[0] < 7)  # a schema from before blobs
    try:
        async with PostgresStore(pg_url, schema=pg_schema, max_size=1):
            pass  # opening migrates
    finally:
        _schema.MIGRATIONS = saved
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {pg_schema}.sessions (session_id, created_at, "
                     "last_activity) VALUES ('old', now(), 0)")
    store = PostgresStore(pg_url, schema=pg_schema, max_size=2)
    try:
        await store.put_blob("d" * 64, b"new")
        assert await store.get_blob("d" * 64) == b"new"
        assert [r.id for r in (await store.list_sessions()).sessions] == ["old"]
    finally:
        await store.close()
