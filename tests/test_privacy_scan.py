"""The physical test of erasure: every byte on disk, before and after ``erase_subject``.

Sessions of one subject hold a unique marker in every place content goes
(user text, tool arguments and results, custom data, a summary). They are
forked, copied between stores (through the layer and as raw bytes), backed
up with SQLite's backup API, dumped with ``pg_dump`` and exported by the
command line, all while encrypted. Then:

- a scan of every byte (the store files, the SQLite database and its -wal,
  PostgreSQL's relation files after a CHECKPOINT and the WAL segments written
  meanwhile, the dump, the backup, the export, the keyring) finds the marker
  0 times, while the same scan finds it in a plaintext store of each kind;
- before erasure every copy opens to the marker; after it, every copy, the
  backup, the WAL snapshot, the restored dump and the re-imported export
  load as erased, and another subject's session still reads everywhere.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import drop_schema, require_or_skip
from support.cli import tl
from threadline import durable
from threadline.ai import AssistantMessage, TextPart, ToolCall, ToolResultMessage, UserMessage
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
from threadline.session import CustomEntry, Entry, ErasedEntry
from threadline.stores import FileStore, PostgresStore, SQLiteStore, Store, copy_sessions

KEK = LocalKeyProvider(b"s" * 32)
SUBJECTS = {"a": "user-42", "b": "user-42", "keep": "user-7"}


def _files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            yield from (p for p in sorted(root.rglob("*")) if p.is_file())


def scan(paths: list[Path], marker: bytes) -> tuple[int, int, int]:
    """(files, bytes scanned, hits of ``marker``)."""
    count = size = hits = 0
    for path in paths:
        data = path.read_bytes()
        count, size, hits = count + 1, size + len(data), hits + data.count(marker)
    return count, size, hits


async def fill(store: Store, marker: str) -> None:
    """Sessions a and b (one subject) and keep (another), a fork of a, marker everywhere."""
    for sid in ("a", "b", "keep"):
        agent = await durable.open(None, store=store, session_id=sid)
        text = f"{marker} {sid}" if sid != "keep" else "the other subject's words"
        call = ToolCall(id="c1", name="lookup", arguments={"query": text})
        await agent.append(UserMessage.of(text), AssistantMessage(content=(call,)),
                           ToolResultMessage(tool_call_id="c1", tool_name="lookup",
                                             content=(TextPart(text=text),)),
                           CustomEntry(kind="app.profile", data={"card": text}))
        await agent.compact(f"summary: {text}", agent.entries[-1].id)
        if sid == "a":
            fork = await agent.fork("a-fork")
            await fork.append(UserMessage.of(f"{marker} said in the fork"))


def texts(entries: list[Entry]) -> str:
    return " ".join(str(e) for e in entries)


def _pg_files(conn: psycopg.Connection[tuple[str]], schema: str) -> list[Path]:
    datadir = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    rows = conn.execute(
        "SELECT pg_relation_filepath(c.oid) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "UNION SELECT pg_relation_filepath(c.reltoastrelid) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.reltoastrelid <> 0 "
        "UNION SELECT pg_relation_filepath(i.indexrelid) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace JOIN pg_index i ON i.indrelid = c.reltoastrelid "
        "WHERE n.nspname = %s", (schema, schema, schema)).fetchall()
    found = [datadir / r[0] for r in rows if r[0]]
    # A relation over 1 GB continues in files .1, .2, ...; and each has its free space map.
    return [p for base in found for p in sorted(base.parent.glob(base.name + "*"))]


def _wal_since(conn: psycopg.Connection[tuple[str]], start: str) -> list[Path]:
    datadir = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    first, last = conn.execute(  # type: ignore[misc]
        "SELECT pg_walfile_name(%s), pg_walfile_name(pg_current_wal_lsn())", (start,)).fetchone()
    # Later names are recycled segments holding older WAL, not what this test wrote.
    return [p for p in sorted((datadir / "pg_wal").iterdir())
            if p.is_file() and len(p.name) == 24 and first <= p.name <= last]


@pytest.fixture
def pg(pg_url: str) -> Iterator[tuple[str, psycopg.Connection[tuple[str]]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        datadir = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        try:
            next(datadir.iterdir())
        except OSError as exc:
            require_or_skip(f"PostgreSQL's data directory {datadir} is not readable here: {exc}")
        # A slot keeps every WAL segment from here on: a checkpoint that other tests'
        # writes bring on would otherwise recycle the segments a scan reads.
        slot = f"tl_scan_{secrets.token_hex(4)}"
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
        try:
            yield pg_url, conn
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def take_copies(tmp_path: Path, pg_url: str, schema: str) -> Path:
    """A SQLite backup, a snapshot of the database with its -wal, a pg_dump and an export."""
    with sqlite3.connect(tmp_path / "copy.db") as src, \
            sqlite3.connect(tmp_path / "backup.db") as dst:
        src.backup(dst)
    snapshot = tmp_path / "wal-snapshot"
    snapshot.mkdir()
    for suffix in ("", "-wal"):  # the database as its WAL has it, not yet checkpointed
        shutil.copy(tmp_path / f"copy.db{suffix}", snapshot / f"copy.db{suffix}")
    assert (tmp_path / "copy.db-wal").stat().st_size > 0
    subprocess.run(["pg_dump", "--no-owner", "-n", schema, "-f", str(tmp_path / "dump.sql"),
                    pg_url], check=True)
    export = tl("--store", str(tmp_path / "files"), "export", "a").stdout
    (tmp_path / "a.export.jsonl").write_text(export)
    return snapshot


def restore(tmp_path: Path, pg_url: str, database: str) -> str:
    """The dump restored into a new database, and the export imported into a new store."""
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", database], check=True)
    url = pg_url.rsplit("/", 1)[0] + "/" + database
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(tmp_path / "dump.sql"), url],
                   check=True, capture_output=True)
    tl("--store", str(tmp_path / "imported"), "import", str(tmp_path / "a.export.jsonl"))
    return url


async def assert_erased(store: EncryptedStore, ids: list[str], *, others: bool) -> None:
    for sid in ids:
        loaded = await store.load_entries(sid)
        assert loaded and all(type(e) is ErasedEntry for e in loaded), (store, sid)
    if others:  # the other subject reads everywhere
        kept = await store.load_entries("keep")
        assert "the other subject's words" in texts(kept)
        assert not any(type(e) is ErasedEntry for e in kept)
    await store.close()


async def test_erasure_leaves_no_readable_byte_of_the_subject_anywhere(
    tmp_path: Path, pg: tuple[str, psycopg.Connection[tuple[str]]],
) -> None:
    pg_url, conn = pg
    if shutil.which("pg_dump") is None or shutil.which("psql") is None:
        require_or_skip("pg_dump and psql are needed (apt-get install postgresql-client)")
    marker = f"MARKER-{secrets.token_hex(8)}"
    plain_marker = f"PLAIN-{secrets.token_hex(8)}"
    schema, plain_schema = (f"tl_scan_{secrets.token_hex(4)}" for _ in range(2))
    restored_db = f"tl_restored_{secrets.token_hex(4)}"
    start = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    ring = tmp_path / "keyring"

    def layer(inner: Store) -> EncryptedStore:
        return EncryptedStore(inner, Keyring(ring, KEK), subject=lambda r: SUBJECTS.get(r.id))

    files = layer(FileStore(tmp_path / "files"))
    lite = layer(SQLiteStore(tmp_path / "copy.db"))
    postgres = layer(PostgresStore(pg_url, schema=schema, max_size=2))
    raw_copy = layer(FileStore(tmp_path / "raw-copy"))
    plain = [FileStore(tmp_path / "plain-files"), SQLiteStore(tmp_path / "plain.db"),
             PostgresStore(pg_url, schema=plain_schema, max_size=2)]
    try:
        await fill(files, marker)
        await copy_sessions(files, lite)
        await copy_sessions(files, postgres)
        await copy_sessions(files.inner, raw_copy.inner)  # the sealed bytes as they are
        snapshot = await asyncio.to_thread(take_copies, tmp_path, pg_url, schema)
        for store in plain:  # the control: the same content, in plaintext
            await fill(store, plain_marker)
        conn.execute("CHECKPOINT")
        for store in (files, lite, postgres, raw_copy):
            for sid in ("a", "a-fork", "b"):
                assert marker in texts(await store.load_entries(sid)), sid

        encrypted_paths = [*_files(tmp_path / "files", tmp_path / "raw-copy", snapshot, ring,
                                   tmp_path / "dump.sql", tmp_path / "backup.db",
                                   tmp_path / "a.export.jsonl"),
                           *(tmp_path / f"copy.db{s}" for s in ("", "-wal", "-shm")),
                           *_pg_files(conn, schema)]
        plain_paths = [*_files(tmp_path / "plain-files"),
                       *(p for s in ("", "-wal") if (p := tmp_path / f"plain.db{s}").exists()),
                       *_pg_files(conn, plain_schema)]
        wal = _wal_since(conn, start)
        assert scan(plain_paths, plain_marker.encode())[2] > 0  # the scan finds plaintext
        assert scan(wal, plain_marker.encode())[2] > 0

        kid = await Keyring(ring, KEK).key_id("user-42")
        wrapped = (ring / "keys" / kid[:2] / f"{kid}.json").read_bytes().split(
            b'"wrapped":"')[1].split(b'"')[0]
        erased = await files.erase_subject("user-42")
        assert erased.versions == 1 and erased.key_id == kid
        assert scan(list(_files(ring)), wrapped)[2] == 0  # the data key is gone
        conn.execute("CHECKPOINT")

        count, size, hits = scan(encrypted_paths + wal, marker.encode())
        plain_count, plain_size, plain_hits = scan(plain_paths, plain_marker.encode())
        print(f"\nmarker scan after erasure: {count} files, {size:,} bytes "
              f"({sum(p.stat().st_size for p in wal):,} of them PostgreSQL WAL), "
              f"{hits} hits; plaintext control: {plain_count} files, {plain_size:,} bytes, "
              f"{plain_hits} hits")
        assert hits == 0

        restored_url = await asyncio.to_thread(restore, tmp_path, pg_url, restored_db)
        for store in (files, lite, postgres, raw_copy, layer(SQLiteStore(tmp_path / "backup.db")),
                      layer(SQLiteStore(snapshot / "copy.db")),
                      layer(PostgresStore(restored_url, schema=schema, max_size=2))):
            await assert_erased(store, ["a", "a-fork", "b"], others=True)
        await assert_erased(layer(FileStore(tmp_path / "imported")), ["a"], others=False)
    finally:
        for closing in (files, lite, postgres, raw_copy, *plain):
            await closing.close()
        drop_schema(pg_url, schema)
        drop_schema(pg_url, plain_schema)
        await asyncio.to_thread(subprocess.run, ["dropdb", "--if-exists", "-h", "127.0.0.1",
                                                 "-U", "postgres", restored_db], check=False)
