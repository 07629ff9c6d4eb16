"""The PostgreSQL append on the wire (S47): an append on the store's own pool
goes straight through libpq, with the store's own errors, cancellation and
PgBouncer behaviour, and one reader per connection kept on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import sql

from test_store_postgres import cancel_while_locked
from threadline.ai._messages import UserMessage
from threadline.errors import SessionNotFound, StoreError, StoreUnavailable
from threadline.session import MessageEntry, PostgresStore, SessionRecord
from threadline.session._postgres import _Wire


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


def _sql(url: str, query: str, schema: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params)
        return cur.fetchall() if cur.description else []


class Readers:
    """Counts the wire's readers added to and taken off the running loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.added = 0
        self.wires: list[_Wire] = []
        self._add = loop.add_reader

        def add_reader(fd: Any, callback: Callable[..., object], *args: Any) -> None:
            owner = getattr(callback, "__self__", None)
            if isinstance(owner, _Wire):
                self.added += 1
                if owner not in self.wires:
                    self.wires.append(owner)
            self._add(fd, callback, *args)

        loop.add_reader = add_reader  # type: ignore[method-assign]

    @property
    def watching(self) -> int:
        return sum(w.watched for w in self.wires)


@pytest.fixture
def readers() -> Iterator[Callable[[], Readers]]:
    made: list[tuple[asyncio.AbstractEventLoop, Readers]] = []

    def make() -> Readers:
        loop = asyncio.get_running_loop()
        counter = Readers(loop)
        made.append((loop, counter))
        return counter

    yield make
    for loop, counter in made:
        loop.add_reader = counter._add  # type: ignore[method-assign]


@pytest_asyncio.fixture
async def store(pg_url: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    """A store on one pooled connection, with session "s"."""
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1, timeout=5)
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


async def test_s47_appends_keep_one_reader_that_other_work_takes_off(
    pg_url: str, pg_schema: str, readers: Callable[[], Readers],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # No store listens; the look for a listener (a psycopg statement each
    # 0.25 s) is put off so the count does not depend on the machine's speed.
    monkeypatch.setattr("threadline.session._postgres._QUIET", 3600.0)
    counter = readers()
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1)
    try:
        await store.create_session(SessionRecord(id="s"))
        ids = await _chain(store, "s", 2)
        added = counter.added
        ids += await _chain(store, "s", 20, ids[-1])
        assert (counter.added, counter.watching, len(counter.wires)) == (added, 1, 1)
        # psycopg's own operations on the connection read the socket themselves.
        assert [e.id for e in await store.load_entries("s")] == ids
        assert counter.watching == 0
        ids += await _chain(store, "s", 3, ids[-1])
        assert (counter.added, counter.watching) == (added + 1, 1)
        # So does an application's own query on the pool's connection.
        async with store.pool.connection() as conn:
            await conn.execute("SELECT 1")
        assert counter.watching == 0
        ids += await _chain(store, "s", 1, ids[-1])
        assert [e.id for e in await store.load_entries("s")] == ids
        ids += await _chain(store, "s", 1, ids[-1])
        assert counter.watching == 1
    finally:
        await store.close()
    assert counter.watching == 0  # closing the connection took it off first


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
    store: PostgresStore, pg_url: str, pg_schema: str, readers: Callable[[], Readers]
) -> None:
    counter = readers()
    ids = await _chain(store, "s", 3)
    assert counter.watching == 1
    _sql(pg_url, "SELECT pg_terminate_backend(%s)", pg_schema,
         await _backend_of(pg_url, pg_schema))
    for _ in range(100):  # the reader sees the socket close and steps aside
        if not counter.watching:
            break
        await asyncio.sleep(0.01)
    assert counter.watching == 0
    # The next append meets the dead connection: an unknown outcome, safe
    # to retry (S25); the one after runs on a new connection.
    entry = _entry("after", ids[-1])
    with pytest.raises(StoreUnavailable):
        await store.append_entries("s", [entry])
    await store.append_entries("s", [entry])
    assert [e.id for e in await store.load_entries("s")] == [*ids, entry.id]


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
    pg_url: str, pg_schema: str, readers: Callable[[], Readers]
) -> None:
    counter = readers()
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=3)
    try:
        for n in range(6):
            await store.create_session(SessionRecord(id=f"s{n}"))
        chains = await asyncio.gather(*(_chain(store, f"s{n}", 30) for n in range(6)))
        for n, ids in enumerate(chains):
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
        assert 1 <= len(counter.wires) <= 3
    finally:
        await store.close()
    assert counter.watching == 0


async def test_s47_through_pgbouncer_the_wire_names_no_statement(
    pgbouncer_url: str, pg_schema: str, pg_url: str, readers: Callable[[], Readers]
) -> None:
    # Transaction pooling hands each statement to any server connection: a
    # named statement would be missing on the next one. Many concurrent
    # appends over few server connections would meet that at once.
    counter = readers()
    store = PostgresStore(pgbouncer_url, schema=pg_schema, prepare_threshold=None,
                          max_size=6)
    try:
        for n in range(8):
            await store.create_session(SessionRecord(id=f"s{n}"))
        chains = await asyncio.gather(*(_chain(store, f"s{n}", 25) for n in range(8)))
        for n, ids in enumerate(chains):
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
        assert counter.wires and not any(w.prepared for w in counter.wires)
    finally:
        await store.close()


async def test_s47_an_append_larger_than_the_socket_buffer_waits_to_send(
    store: PostgresStore
) -> None:
    ids = await _chain(store, "s", 2)
    big, parent = [], ids[-1]
    for n in range(8):  # 16 MB in one statement: libpq's flush must wait for room
        big.append(_entry(f"{n}" * (2 << 20), parent))
        parent = big[-1].id
    await store.append_entries("s", big)
    ids += await _chain(store, "s", 2, parent)
    loaded = await store.load_entries("s")
    assert [e.id for e in loaded] == ids[:2] + [e.id for e in big] + ids[2:]
    assert loaded[5].message.text == "3" * (2 << 20)


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
    pg_url: str, pg_schema: str, readers: Callable[[], Readers]
) -> None:
    counter = readers()
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
            if watching._listened_at > 0:
                break
            await asyncio.sleep(0.01)
        ids = await _chain(store, "s", 30)
        await asyncio.wait_for(watcher, 10)
        assert heard == ids
        # Every append notified (someone listens), on the connection's one reader.
        assert store._listened
        assert (counter.added, len(counter.wires), counter.watching) == (1, 1, 1)
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
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await other.rollback()
    ids += await _chain(store, "s", 3, ids[-1])
    assert [e.id for e in await store.load_entries("s")] == ids
    assert store.pool.get_stats()["connections_num"] == 1


async def test_s47_a_pool_without_the_state_the_quick_checkout_reads_uses_its_own_way(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quick checkout reads psycopg_pool's private state; a release that
    # renamed any of it must cost speed, never an append.
    from threadline.session import _postgres

    taken: list[object] = []
    real_take = _postgres._take

    def counted(pool: Any) -> Any:
        taken.append(pool)
        return real_take(pool)

    monkeypatch.setattr(_postgres, "_take", counted)
    monkeypatch.setattr(_postgres, "_POOL_STATE", (*_postgres._POOL_STATE, "_renamed_since"))
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1, timeout=5)
    try:
        await store.create_session(SessionRecord(id="s"))
        first = _entry("one")
        await store.append_entries("s", [first])
        await store.append_entries("s", [_entry("two", first.id)])
        assert [e.message.text for e in await store.load_entries("s")] == ["one", "two"]
        assert taken == []
    finally:
        await store.close()
    monkeypatch.setattr(_postgres, "_POOL_STATE", _postgres._POOL_STATE[:-1])
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1, timeout=5)
    try:
        for text in ("three", "four"):
            await store.append_entries("s", [_entry(text)])
        assert taken  # the same pool, with the state there, takes the quick way
    finally:
        await store.close()
