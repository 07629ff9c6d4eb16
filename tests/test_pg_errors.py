"""PostgresStore's errors: arguments refused before the server is asked, ids
over the limit refused before anything is written (in a copy too), and only
an unknown outcome reported as ``StoreUnavailable``."""

from __future__ import annotations

import functools
import secrets
from pathlib import Path
from typing import Any

import psycopg
import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import (
    ConfigError,
    InvalidEntry,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
)
from threadline.session import MessageEntry, SessionRecord
from threadline.session._codec import MAX_ENTRY_ID_BYTES, encode_entry
from threadline.stores import FileStore, PostgresStore, copy_sessions
from threadline.stores._rules import MAX_SESSION_ID_BYTES
from threadline.stores.file import session_file_name
from threadline.stores.postgres._wire import VALUES_MAX


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


def _count(url: str, schema: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.{table}".encode()).fetchone()
        return int(row[0]) if row else 0


def _ddl(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


def _with_id(entry: MessageEntry, entry_id: str) -> MessageEntry:
    return MessageEntry(id=entry_id, parent_id=entry.parent_id, timestamp=entry.timestamp,
                        message=entry.message)


@pytest.mark.parametrize("size", [1, VALUES_MAX + 1])
async def test_s25_an_entry_id_over_the_limit_is_refused_before_anything_is_written(
    pg_url: str, pg_schema: str, size: int
) -> None:
    # Such an id once reached the server, which refused its index row, and the
    # store called that a lost connection ("retrying is safe") every time.
    longest = "é" * (MAX_ENTRY_ID_BYTES // 2)
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        sid = "é" * (MAX_SESSION_ID_BYTES // 2)  # the longest session id too
        await store.create_session(SessionRecord(id=sid))
        batch: list[MessageEntry] = []
        for n in range(size):
            batch.append(_entry(f"e{n}", batch[-1].id if batch else None))
        over = batch[-1].id + "x" * MAX_ENTRY_ID_BYTES
        refused = [(store.append_entries, [*batch[:-1], _with_id(batch[-1], over)]),
                   (store.append_linear, [*batch[:-1], _with_id(batch[-1], over)]),
                   (store.append_entries, [*batch[:-1], MessageEntry(
                       parent_id=over, message=UserMessage.of("child"))])]
        for append, attempt in refused:
            with pytest.raises(InvalidEntry, match=str(MAX_ENTRY_ID_BYTES)) as info:
                await append(sid, attempt)
            assert not isinstance(info.value, StoreUnavailable)
            assert info.value.session_id == sid
        assert list(await store.load_entries(sid)) == []
        assert _count(pg_url, pg_schema, "entries") == 0
        # An id at the limit is kept, and found again, beside the longest session id.
        at_limit = [*batch[:-1], _with_id(batch[-1], longest)]
        await store.append_entries(sid, at_limit)
        child = _entry("child", longest)
        await store.append_entries(sid, [child])
        assert [e.id for e in await store.load_entries(sid)] == [
            *(e.id for e in at_limit), child.id]
        assert [e.id for e in await store.load_entries_after(sid, longest)] == [child.id]


async def test_copy_from_a_file_holding_an_id_over_the_limit_fails_and_leaves_nothing(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # A file store refuses such an id now; another program may still write
    # one into a file. The copy says which session and entry, before the
    # destination gets an empty session.
    source = FileStore(tmp_path)
    await source.create_session(SessionRecord(id="f"))
    first = _entry("fine")
    await source.append_entries("f", [first])
    long_id = "y" * (MAX_ENTRY_ID_BYTES + 1)
    line = encode_entry(_entry("written by another program", first.id))
    line = line.replace(b'"id":"', b'"id":"' + long_id.encode() + b'-', 1)
    with (tmp_path / session_file_name("f")).open("ab") as f:
        f.write(line + b"\n")
    await source.create_session(SessionRecord(id="g"))  # a later session, copied on its own
    await source.append_entries("g", [_entry("other")])
    async with PostgresStore(pg_url, schema=pg_schema) as dest:
        with pytest.raises(InvalidEntry, match=str(MAX_ENTRY_ID_BYTES)) as info:
            await copy_sessions(FileStore(tmp_path), dest, ["f"])
        assert info.value.session_id == "f" and long_id[:40] in str(info.value)
        with pytest.raises(SessionNotFound):
            await dest.load_session("f")
        assert _count(pg_url, pg_schema, "sessions") == 0
        result = await copy_sessions(FileStore(tmp_path), dest, ["g"])
        assert (result.copied, result.entries) == (1, 1)


@pytest.mark.parametrize("size", [1, VALUES_MAX + 1])
async def test_s25_a_refusal_from_the_server_is_not_a_lost_connection(
    pg_url: str, pg_schema: str, size: int
) -> None:
    # An index on data makes the server refuse a large row with "index row
    # size exceeds maximum" (an OperationalError to psycopg): the server's
    # answer to this call, which a retry gets again. Neither the wire nor
    # psycopg's execute may call that "retrying is safe".
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        first = _entry("first")
        await store.append_entries("s", [first])
        _ddl(pg_url, f"CREATE INDEX data_limit ON {pg_schema}.entries (data)")
        batch: list[MessageEntry] = []
        for n in range(size):
            batch.append(_entry(secrets.token_hex(2000) if n == size - 1 else f"e{n}",
                                batch[-1].id if batch else first.id))
        for _ in range(3):
            with pytest.raises(StoreError, match=r"index row size .* exceeds") as info:
                await store.append_entries("s", batch)
            assert not isinstance(info.value, StoreUnavailable)
            assert "retrying is safe" not in str(info.value)
            assert isinstance(info.value.__cause__, psycopg.errors.ProgramLimitExceeded)
        fine = _entry("fine", first.id)
        await store.append_entries("s", [fine])
        assert [e.id for e in await store.load_entries("s")] == [first.id, fine.id]
        # And a statement the server cannot run: the table is gone.
        _ddl(pg_url, f"ALTER TABLE {pg_schema}.entries RENAME TO gone")
        with pytest.raises(StoreError) as info:
            await store.load_entries("s")
        assert not isinstance(info.value, StoreUnavailable)
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)


async def test_every_argument_is_checked_before_the_server_is_touched() -> None:
    # Nothing listens on port 9: any call that reached for the server would
    # raise StoreUnavailable instead of the argument's error.
    store = PostgresStore("postgresql://u@127.0.0.1:9/x", connect_timeout=1)
    bad_ids: list[Any] = [1, "", "nul\x00inside", "lone \ud800", "é" * MAX_ENTRY_ID_BYTES,
                          ["x"]]
    for after in bad_ids:
        with pytest.raises(ConfigError, match="load_entries_after on session 's'"):
            await store.load_entries_after("s", after)
        with pytest.raises(ConfigError, match="watch on session 's'"):
            store.watch("s", after)
    for entries in ("ab", None, 5, {"x": 1}):
        with pytest.raises(ConfigError, match="append_entries on session 's'"):
            await store.append_entries("s", entries)
        with pytest.raises(ConfigError, match="append_linear on session 's'"):
            await store.append_linear("s", entries)
    with pytest.raises(InvalidEntry):
        await store.append_entries("s", [1])  # type: ignore[list-item]
    for sid in ("", ["x"], 5, None, "nul\x00inside"):
        for call in (store.load_entries, store.load_session, store.delete_session,
                     functools.partial(store.append_entries, entries=[]),
                     functools.partial(store.append_linear, entries=[]),
                     functools.partial(store.load_entries_after, entry_id=None)):
            with pytest.raises(InvalidSessionId):
                await call(sid)
        with pytest.raises(InvalidSessionId):
            store.watch(sid)
        with pytest.raises(InvalidSessionId):
            await store.create_session(SessionRecord(id=sid))
    for limit in (0, "10", 2.5, True):
        with pytest.raises(ConfigError):
            await store.list_sessions(limit=limit)  # type: ignore[arg-type]
    for cursor in (5, "not a cursor"):
        with pytest.raises(ConfigError):
            await store.list_sessions(cursor=cursor)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):  # what any call above would have met
        await store.load_entries("s")
    await store.close()
