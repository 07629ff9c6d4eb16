"""Store errors keep their cause and say where: the server or file, the operation, the session.

Against the real PostgreSQL server (and a port nobody listens on) and real
SQLite files. The file store's own translations are tested in
test_store_file.py.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from threadline.errors import CorruptLog, StoreError
from threadline.session import SessionRecord
from threadline.stores import PostgresStore, SQLiteStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_postgres_refused_connection_names_server_and_session() -> None:
    port = _free_port()
    store = PostgresStore(f"postgresql://postgres:s3cret@127.0.0.1:{port}/test",
                          connect_timeout=1)
    with pytest.raises(StoreError) as info:
        await store.load_entries("user-42")
    text = str(info.value)
    assert f"postgresql://postgres:***@127.0.0.1:{port}/test" in text
    assert "s3cret" not in text
    assert info.value.session_id == "user-42"
    assert info.value.__cause__ is not None
    await store.close()


async def test_postgres_query_error_names_operation_and_session_and_keeps_cause(
    pg_url: str, pg_schema: str
) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="user-42"))
        with psycopg.connect(pg_url, autocommit=True) as other:
            # Another process breaks the schema under the store's feet.
            other.execute(sql.SQL("DROP TABLE {}.entries").format(sql.Identifier(pg_schema)))
        with pytest.raises(StoreError) as info:
            await store.load_entries("user-42")
    assert f"schema {pg_schema!r}: load_entries (session 'user-42') failed: " in str(info.value)
    assert info.value.session_id == "user-42"
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)


async def test_sqlite_undecodable_row_names_file_table_and_row(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="user-42"))
    await store.close()
    with sqlite3.connect(path) as raw:
        # A whole-line row (kind 0) of the one session (key 1).
        raw.execute("INSERT INTO entries (session, kind, id, data) "
                    "VALUES (1, 0, X'006531', ?)", (b'not json at all',))
    store = SQLiteStore(path)
    with pytest.raises(CorruptLog) as info:
        await store.load_entries("user-42")
    await store.close()
    assert str(info.value).startswith(
        f"{path} table entries row (session_id='user-42', seq=1): not valid JSON")
    assert info.value.session_id == "user-42"
    assert info.value.__cause__ is not None


async def test_sqlite_unopenable_file_names_it_and_keeps_cause(tmp_path: Path) -> None:
    path = tmp_path / "dir.db"
    path.mkdir()  # a directory where the database file should be
    store = SQLiteStore(path)
    with pytest.raises(StoreError) as info:
        await store.load_entries("user-42")
    await store.close()
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.Error | OSError)
