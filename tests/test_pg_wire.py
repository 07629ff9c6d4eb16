"""The PostgreSQL append on the wire (S47): an append on the store's own pool
goes straight through libpq, with the store's own errors, cancellation and
PgBouncer behaviour, and a reader or writer on the event loop only while it
waits, so psycopg's own operations on the connection never meet it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from support.postgres import blocked_by, cancel_while_locked
from threadline.ai._messages import UserMessage
from threadline.errors import SessionNotFound, StoreError, StoreUnavailable
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import PostgresStore
from threadline.stores.postgres import _store, _wire


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


def _sql(url: str, query: str, schema: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params)
        return cur.fetchall() if cur.description else []


class Wires:
    """The wires the store makes (one per pooled connection), and the sockets
    they wait on: ``on_loop`` holds those with a reader or writer on the loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[_wire.Wire] = []
        self.reads = self.writes = 0
        self.on_loop: set[int] = set()
        made = self.made

        class Recorded(_wire.Wire):
            def __init__(self, conn: _wire.Connection) -> None:
                super().__init__(conn)
                made.append(self)

        monkeypatch.setattr(_store, "Wire", Recorded)
        loop = asyncio.get_running_loop()
        for kind in ("reader", "writer"):
            real_add, real_remove = getattr(loop, f"add_{kind}"), getattr(loop, f"remove_{kind}")

            def add(fd: int, callback: Any, *args: Any, kind: str = kind,
                    real_add: Any = real_add) -> None:
                if callback is _wire.settle:
                    self.on_loop.add(fd)
                    if kind == "reader":
                        self.reads += 1
                    else:
                        self.writes += 1
                real_add(fd, callback, *args)

            def remove(fd: int, real_remove: Any = real_remove) -> bool:
                self.on_loop.discard(fd)
                return bool(real_remove(fd))

            monkeypatch.setattr(loop, f"add_{kind}", add)
            monkeypatch.setattr(loop, f"remove_{kind}", remove)


@pytest_asyncio.fixture
async def wires(monkeypatch: pytest.MonkeyPatch) -> Wires:
    return Wires(monkeypatch)


@pytest_asyncio.fixture(params=[None, "acme"], ids=["default-tenant", "tenant"])
async def store(pg_url: str, pg_schema: str,
                request: pytest.FixtureRequest) -> AsyncIterator[PostgresStore]:
    """A store on one pooled connection, with session "s"; for the default
    tenant, and for a tenant (its appends pipelined after a ``set_config``)."""
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1, timeout=5,
                          tenant=request.param, trusted=True)
    try:
        await store.create_session(SessionRecord(id="s"))
        yield store
    finally:
        await store.close()


async def _chain(store: PostgresStore, sid: str, count: int,
                 parent: str | None = None) -> list[str]:
    ids = []
    for n in range(count):
        entry = _entry(f"{sid} {n}", parent)
        await store.append_entries(sid, [entry])
        ids.append(parent := entry.id)
    return ids


async def test_s47_appends_and_psycopg_take_turns_on_one_connection(
    store: PostgresStore, wires: Wires
) -> None:
    # Each append's reader is on the loop only while it waits: psycopg's own
    # operations on the same connection (the store's loads, an application's
    # query on the pool) wait on the socket in between, in any order.
    ids = await _chain(store, "s", 12)
    assert len(wires.made) == 1 and wires.reads >= 12 and not wires.on_loop
    assert [e.id for e in await store.load_entries("s")] == ids
    ids += await _chain(store, "s", 3, ids[-1])
    async with store.pool.connection() as conn:
        await conn.execute("SELECT 1")
    ids += await _chain(store, "s", 2, ids[-1])
    assert [e.id for e in await store.load_entries("s")] == ids
    assert len(wires.made) == 1 and not wires.on_loop
    assert store.pool.get_stats()["connections_num"] == 1


async def test_s47_errors_on_the_wire_are_the_stores(
    store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    ids = await _chain(store, "s", 8)  # past the prepare threshold: prepared
    with pytest.raises(SessionNotFound):
        await store.append_entries("missing", [_entry("x")])
    last = MessageEntry(parent_id=ids[-1], message=UserMessage.of("last"))
    await store.append_entries("s", [last])
    await store.append_entries("s", [last])  # a retry after a lost reply (S25)
    with pytest.raises(StoreError, match="repeats an entry id"):
        await store.append_entries("s", [MessageEntry(
            id=last.id, parent_id=ids[-1], message=UserMessage.of("other"))])
    ids.append(last.id)
    # Any other refusal from the server: a StoreError naming the session,
    # psycopg's error chained, and the statement is replanned after the DDL.
    _sql(pg_url, "ALTER TABLE {s}.entries ADD CONSTRAINT h CHECK (kind < 0) NOT VALID",
         pg_schema)
    with pytest.raises(StoreError, match="'s'") as info:
        await store.append_entries("s", [_entry("refused", ids[-1])])
    assert isinstance(info.value.__cause__, psycopg.errors.CheckViolation)
    assert not isinstance(info.value, StoreUnavailable)
    _sql(pg_url, "ALTER TABLE {s}.entries DROP CONSTRAINT h", pg_schema)
    ids += await _chain(store, "s", 2, ids[-1])
    # The prepared statement dropped from the connection: prepared again, sent once.
    async with store.pool.connection() as conn:
        await conn.execute("DEALLOCATE ALL")
    ids += await _chain(store, "s", 2, ids[-1])
    assert [e.id for e in await store.load_entries("s")] == ids
    assert store.pool.get_stats()["connections_num"] == 1


async def _backend_of(url: str, schema: str) -> int:
    """The pid of the store's one connection (its last statement named the schema)."""
    rows = _sql(url, "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND position(%s in query) > 0", schema, schema)
    assert len(rows) == 1, rows
    return int(rows[0][0])


async def test_s47_a_connection_the_server_ends_while_idle_is_let_go(
    store: PostgresStore, pg_url: str, pg_schema: str, wires: Wires
) -> None:
    ids = await _chain(store, "s", 3)
    _sql(pg_url, "SELECT pg_terminate_backend(%s)", pg_schema,
         await _backend_of(pg_url, pg_schema))
    # The next append meets the dead connection: an unknown outcome, safe
    # to retry (S25); the one after runs on a new connection.
    entry = _entry("after", ids[-1])
    with pytest.raises(StoreUnavailable):
        await store.append_entries("s", [entry])
    assert not wires.on_loop
    await store.append_entries("s", [entry])  # through psycopg, after probing the server
    ids += [entry.id, *await _chain(store, "s", 2, entry.id)]  # on a new connection's wire
    assert [e.id for e in await store.load_entries("s")] == ids
    assert len(wires.made) == 2 and not wires.on_loop


async def test_s47_a_cancelled_append_is_cancelled_at_the_server_on_its_connection(
    store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    ids = await _chain(store, "s", 8)

    def not_waiting() -> None:  # cancelled there: no longer waiting for the lock
        assert _sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                    "wait_event_type = 'Lock' AND position(%s in query) > 0",
                    pg_schema, pg_schema) == [(0,)]

    await cancel_while_locked(pg_url, pg_schema, store, _entry("cut", ids[-1]), not_waiting)
    ids += await _chain(store, "s", 2, ids[-1])
    assert [e.id for e in await store.load_entries("s")] == ids
    # The connection went back idle and serves on: none was made anew.
    assert store.pool.get_stats()["connections_num"] == 1


async def test_s47_tasks_sharing_a_pool_append_on_the_wire(
    pg_url: str, pg_schema: str, wires: Wires
) -> None:
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=3)
    try:
        for n in range(6):
            await store.create_session(SessionRecord(id=f"s{n}"))
        chains = await asyncio.gather(*(_chain(store, f"s{n}", 30) for n in range(6)))
        for n, ids in enumerate(chains):
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
        assert 1 <= len(wires.made) <= 3 and not wires.on_loop
    finally:
        await store.close()


async def test_s47_through_pgbouncer_the_wire_names_no_statement(
    pgbouncer_url: str, pg_schema: str, pg_url: str, wires: Wires
) -> None:
    # Transaction pooling hands each statement to any server connection: a
    # named statement would be missing on the next one. Many concurrent
    # appends over few server connections would meet that at once.
    store = PostgresStore(pgbouncer_url, schema=pg_schema, prepare_threshold=None,
                          max_size=6)
    try:
        for n in range(8):
            await store.create_session(SessionRecord(id=f"s{n}"))
        chains = await asyncio.gather(*(_chain(store, f"s{n}", 25) for n in range(8)))
        for n, ids in enumerate(chains):
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
        assert wires.made and not any(w.prepared for w in wires.made)
    finally:
        await store.close()


async def test_s47_an_append_larger_than_the_socket_buffer_waits_to_send(
    store: PostgresStore, wires: Wires
) -> None:
    ids = await _chain(store, "s", 2)
    # The store's one connection gets a small send buffer: on loopback with the
    # server reading as fast as it comes, the default one can take it all at once.
    async with store.pool.connection() as conn:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
    big, parent = [], ids[-1]
    for n in range(8):  # 16 MB in one statement: libpq's flush must wait for room
        big.append(_entry(f"{n}" * (2 << 20), parent))
        parent = big[-1].id
    await store.append_entries("s", big)
    ids += await _chain(store, "s", 2, parent)
    loaded = await store.load_entries("s")
    assert [e.id for e in loaded] == ids[:2] + [e.id for e in big] + ids[2:]
    assert loaded[5].message.text == "3" * (2 << 20)
    assert wires.writes and not wires.on_loop


async def test_s47_a_cancelled_append_whose_cancel_fails_closes_its_connection(
    store: PostgresStore, pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    ids = await _chain(store, "s", 3)

    async def refused(self: psycopg.AsyncConnection[Any], **kwargs: Any) -> None:
        raise psycopg.OperationalError("cancel refused")

    def closed() -> None:
        assert "closing its connection" in caplog.text

    monkeypatch.setattr(psycopg.AsyncConnection, "cancel_safe", refused)
    await cancel_while_locked(pg_url, pg_schema, store, _entry("cut", ids[-1]), closed)
    # The statement may still run once the lock is free: its outcome is
    # unknown, as for any cancelled call. The store goes on, connected anew.
    entry = _entry("after", ids[-1])
    await store.append_entries("s", [entry])
    assert entry.id in [e.id for e in await store.load_entries("s")]
    assert store.pool.get_stats()["connections_num"] == 2


async def test_s47_appends_a_watcher_hears_of_notify_on_the_same_wire(
    pg_url: str, pg_schema: str, wires: Wires
) -> None:
    watching = PostgresStore(pg_url, schema=pg_schema)
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1)
    try:
        await store.create_session(SessionRecord(id="s"))
        heard: list[str] = []

        async def watch() -> None:
            async for entry in watching.watch("s"):
                heard.append(entry.id)
                if len(heard) == 30:
                    return

        watcher = asyncio.create_task(watch())
        for _ in range(500):  # until its LISTEN connection is up
            if watching._notifier.listened_at > 0:
                break
            await asyncio.sleep(0.01)
        ids = await _chain(store, "s", 30)
        await asyncio.wait_for(watcher, 10)
        assert heard == ids
        # Every append notified (someone listens), on the connection's wire,
        # prepared there after prepare_threshold runs like the append.
        assert store._notifier.listened
        [wire] = wires.made
        assert store._wire["notify"].name in wire.prepared
    finally:
        await store.close()
        await watching.close()


async def test_s47_an_append_cancelled_while_its_statement_is_prepared_is_never_sent(
    store: PostgresStore, pg_url: str, pg_schema: str
) -> None:
    ids = await _chain(store, "s", 5)  # prepare_threshold runs: the next one prepares
    async with await psycopg.AsyncConnection.connect(pg_url) as other:
        # Preparing reads the table's definition: it waits for this lock.
        await other.execute(sql.SQL("LOCK TABLE {}.entries IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(pg_schema)))
        task = asyncio.create_task(store.append_entries("s", [_entry("cut", ids[-1])]))
        await blocked_by(pg_url, other.info.backend_pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await other.rollback()
    ids += await _chain(store, "s", 3, ids[-1])
    assert [e.id for e in await store.load_entries("s")] == ids
    assert store.pool.get_stats()["connections_num"] == 1
