"""Old SQL databases upgrade in place to compact rows (S38).

Each test builds a database the way the previous release left it, with the
kinds of rows that must survive: ordinary entries, lines other programs wrote
(unknown fields, another key order, odd timestamps, an unknown type), ids
that are not UUIDs, timestamps that do not match the id. Then several
processes open it at once; every one succeeds, the migration runs once, and
every entry loads back byte for byte.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import sqlite3
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from threadline.ai._messages import AssistantMessage, TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord, new_id
from threadline.session._codec import encode_entry
from threadline.stores import PostgresStore, SQLiteStore
from threadline.stores.postgres._schema import MIGRATIONS as PG_MIGRATIONS
from threadline.stores.sqlite._schema import MIGRATIONS as SQLITE_MIGRATIONS


def _old_lines() -> list[tuple[str, str | None, str, bytes]]:
    """(id, parent_id, type, line) rows of one session, in append order."""
    root = MessageEntry(message=UserMessage.of("ordinary"))
    odd = MessageEntry(id="e1", parent_id=root.id, timestamp=datetime(2001, 2, 3, tzinfo=UTC),
                       message=AssistantMessage(content=(TextPart(text="not a uuid"),)))
    ids = [new_id() for _ in range(3)]
    foreign = [
        b'{"type":"message","id":"%s","parent_id":"e1","timestamp":"2025-03-01T09:30:01.12Z",'
        b'"message":{"role":"user","content":[{"type":"text","text":"hi"}]},"mood":"x"}'
        % ids[0].encode(),
        b'{"id":"%s","parent_id":"%s","type":"message","timestamp":"2025-03-01T09:30:02+00:00",'
        b'"message":{"role":"user","content":[{"type":"text","text":"\\u00e9"}]}}'
        % (ids[1].encode(), ids[0].encode()),
        b'{"type":"from.the.future","id":"%s","parent_id":"%s","x":{"y":[1.50]}}'
        % (ids[2].encode(), ids[1].encode()),
    ]
    after = MessageEntry(parent_id=ids[2], message=UserMessage.of("after them"))
    return [
        (root.id, None, "message", encode_entry(root)),
        (odd.id, root.id, "message", encode_entry(odd)),
        (ids[0], "e1", "message", foreign[0]),
        (ids[1], ids[0], "message", foreign[1]),
        (ids[2], ids[1], "from.the.future", foreign[2]),
        (after.id, ids[2], "message", encode_entry(after)),
    ]


# -- SQLite: version 1 -> 2 ------------------------------------------------------------


def _sqlite_v1(path: Path, rows: list[tuple[str, str | None, str, bytes]]) -> None:
    [(_, script)] = [m for m in SQLITE_MIGRATIONS if m[0] == 1]
    assert isinstance(script, str)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                     "applied_at TEXT NOT NULL)")
        conn.executescript(script)
        conn.execute("INSERT INTO schema_migrations VALUES (1, 'then')")
        for sid in ("old", "other"):
            conn.execute("INSERT INTO sessions VALUES (?, NULL, 1)", (sid,))
            conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                             [(sid, n, *row) for n, row in enumerate(rows, 1)])
        conn.execute("INSERT INTO sessions VALUES ('empty', 'old', 2)")


def _sqlite_open_and_load(path: str, n: int) -> list[bytes]:
    async def run() -> list[bytes]:
        store = SQLiteStore(path)
        try:
            await store.create_session(SessionRecord(id=f"new{n}"))
            return [encode_entry(e) for e in await store.load_entries("old")]
        finally:
            await store.close()

    return asyncio.run(run())


async def test_s38_sqlite_version_1_file_upgrades_in_place_with_processes_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    rows = _old_lines()
    _sqlite_v1(path, rows)
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, abs, n) for n in range(4)))
        loaded = await asyncio.gather(*(
            loop.run_in_executor(pool, _sqlite_open_and_load, str(path), n) for n in range(4)))
    lines = [line for *_, line in rows]
    assert loaded == [lines] * 4
    with sqlite3.connect(path) as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM schema_migrations "
                                           "ORDER BY version")] == [
            version for version, _ in SQLITE_MIGRATIONS]
        kinds = [k for (k,) in conn.execute("SELECT kind FROM entries e JOIN sessions s "
                                            "ON s.key = e.session WHERE s.id = 'old' "
                                            "ORDER BY e.seq")]
    assert [bool(k) for k in kinds] == [True, True, False, False, False, True]
    store = SQLiteStore(path)
    try:
        assert [encode_entry(e) for e in await store.load_entries("other")] == lines
        assert len(await store.load_entries("empty")) == 0
        assert (await store.load_session("empty")).parent_id == "old"
        assert len((await store.list_sessions()).sessions) == 7
        # The old log goes on: a retry of its last entry is recognised (S25),
        # and new entries follow it.
        last = (await store.load_entries("old"))[-1]
        await store.append_entries("old", [last])
        more = MessageEntry(parent_id=last.id, message=UserMessage.of("new"))
        await store.append_entries("old", [more])
        assert [e.id for e in await store.load_entries_after("old", rows[3][0])] == [
            rows[4][0], rows[5][0], more.id]
    finally:
        await store.close()


# -- PostgreSQL: version 3 -> 4 --------------------------------------------------------


def _pg_v3(url: str, schema: str, rows: list[tuple[str, str | None, str, bytes]]) -> None:
    ident = sql.Identifier(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL("CREATE TABLE {}.schema_migrations (version int PRIMARY KEY, "
                             "applied_at timestamptz NOT NULL DEFAULT now())").format(ident))
        for version, script in PG_MIGRATIONS:
            if version > 3:
                break
            assert isinstance(script, str)
            for stmt in script.split(";\n"):
                if stmt.strip():
                    conn.execute(sql.SQL(stmt).format(s=ident))  # type: ignore[arg-type]
            conn.execute(sql.SQL("INSERT INTO {}.schema_migrations (version) VALUES (%s)")
                         .format(ident), (version,))
        for sid in ("old", "other"):
            conn.execute(sql.SQL("INSERT INTO {}.sessions VALUES (%s, NULL, now(), %s)")
                         .format(ident), (sid, len(rows)))
            with conn.cursor() as cur:
                cur.executemany(sql.SQL("INSERT INTO {}.entries VALUES (%s, %s, %s, %s, %s, %s)")
                                .format(ident), [(sid, n, *row) for n, row in enumerate(rows, 1)])


def _pg_open_and_load(url: str, schema: str, n: int) -> list[bytes]:
    async def run() -> list[bytes]:
        async with PostgresStore(url, schema=schema, max_size=1) as store:
            await store.create_session(SessionRecord(id=f"new{n}"))
            return [encode_entry(e) for e in await store.load_entries("old")]

    return asyncio.run(run())


@pytest.mark.timeout(120)
async def test_s38_postgres_version_3_schema_upgrades_in_place_with_processes_at_once(
    pg_url: str, pg_schema: str,
) -> None:
    rows = _old_lines()
    _pg_v3(pg_url, pg_schema, rows)
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, abs, n) for n in range(4)))
        loaded = await asyncio.gather(*(
            loop.run_in_executor(pool, functools.partial(_pg_open_and_load, pg_url, pg_schema, n))
            for n in range(4)))
    lines = [line for *_, line in rows]
    assert loaded == [lines] * 4
    with psycopg.connect(pg_url) as conn:
        versions = conn.execute(sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY 1")
                                .format(sql.Identifier(pg_schema))).fetchall()
        kinds = conn.execute(sql.SQL("SELECT kind FROM {}.entries WHERE session_id = 'old' "
                                     "ORDER BY seq").format(sql.Identifier(pg_schema))).fetchall()
    assert [v for (v,) in versions] == [v for v, _ in PG_MIGRATIONS]
    assert [bool(k) for (k,) in kinds] == [True, True, False, False, False, True]
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        assert [encode_entry(e) for e in await store.load_entries("other")] == lines
        last = (await store.load_entries("old"))[-1]
        await store.append_entries("old", [last])  # a retry (S25) against a migrated row
        more = MessageEntry(parent_id=last.id, message=UserMessage.of("new"))
        await store.append_entries("old", [more])
        assert [e.id for e in await store.load_entries_after("old", rows[3][0])] == [
            rows[4][0], rows[5][0], more.id]
