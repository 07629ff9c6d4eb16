"""PostgresStore against the real server: the conformance suite plus what is
particular to PostgreSQL. Every test works in its own schema, dropped after."""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import multiprocessing
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from support.postgres import (
    blocked_by,
    cancel_while_locked,
    check_processes_keep_one_order,
    insert_raw_row,
    listening,
    query_rows,
)
from support.stores import until
from support.tcp_proxy import TcpProxy
from threadline.ai._messages import UserMessage
from threadline.errors import (
    ConfigError,
    CorruptLog,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
)
from threadline.session import MessageEntry, SessionRecord
from threadline.session._codec import encode_entry
from threadline.stores import PostgresStore, Store
from threadline.stores._listing import Filters
from threadline.stores._rows import compact
from threadline.stores.postgres._catalog import list_query
from threadline.stores.postgres._schema import MIGRATIONS
from threadline.stores.postgres._wire import VALUES_MAX as _VALUES_MAX
from threadline.testing import StoreConformance
from threadline.testing._conformance import StoreOpener


class TestPostgresStore(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "search", "multi_process"})

    @pytest.fixture(autouse=True)
    def _schema(self, pg_url: str, pg_schema: str) -> Iterator[None]:
        self.pg_url, self.pg_schema = pg_url, pg_schema
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        return PostgresStore(self.pg_url, schema=self.pg_schema, max_size=4)

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        return functools.partial(PostgresStore, self.pg_url, schema=self.pg_schema,
                                 max_size=2)

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        insert_raw_row(self.pg_url, self.pg_schema, session_id, data)


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


async def test_migrations_recorded_once_and_reopen_is_idempotent(
    pg_url: str, pg_schema: str
) -> None:
    for n in range(3):
        async with PostgresStore(pg_url, schema=pg_schema) as store:
            await store.create_session(SessionRecord(id=f"s{n}"))
    versions = query_rows(pg_url, f"SELECT version FROM {pg_schema}.schema_migrations")
    assert [v for (v,) in versions] == [v for v, _ in MIGRATIONS]
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        assert [r.id for r in (await store.list_sessions()).sessions] == ["s2", "s1", "s0"]


async def test_a_schema_at_version_2_migrates_to_3_and_keeps_its_sessions(
    pg_url: str, pg_schema: str
) -> None:
    # A schema as the store before the NOTIFY trigger left it: versions 1 and 2
    # (the list index), applied the way that runner did, splitting each script
    # at every ";", with a session already in it.
    old = [(v, script) for v, script in MIGRATIONS if v <= 2]
    assert [v for v, _ in old] == [1, 2]
    ident = psycopg.sql.Identifier(pg_schema)
    first = _entry("written at version 2")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(psycopg.sql.SQL(
            "CREATE TABLE {}.schema_migrations (version int PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())").format(ident))
        for version, script in old:
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(psycopg.sql.SQL(statement).format(s=ident))  # type: ignore[arg-type]
            conn.execute(psycopg.sql.SQL(
                "INSERT INTO {}.schema_migrations (version) VALUES (%s)").format(ident),
                (version,))
        conn.execute(psycopg.sql.SQL(
            "INSERT INTO {}.sessions (session_id, created_at, next_seq) "
            "VALUES ('old', now(), 1)").format(ident))
        conn.execute(psycopg.sql.SQL(
            "INSERT INTO {}.entries (session_id, seq, entry_id, type, data) "
            "VALUES ('old', 1, %s, 'message', %s)").format(ident),
            (first.id, encode_entry(first)))
    async with PostgresStore(pg_url, schema=pg_schema) as store, \
            PostgresStore(pg_url, schema=pg_schema) as other:
        assert [e.id for e in await store.load_entries("old")] == [first.id]
        versions = query_rows(pg_url, f"SELECT version FROM {pg_schema}.schema_migrations "
                                      f"ORDER BY version")
        assert [v for (v,) in versions] == [v for v, _ in MIGRATIONS]
        # Version 3's trigger wakes a watcher: with polling pushed out of the
        # way, the entry can only arrive through NOTIFY.
        store.watch_interval = 3600
        watch = store.watch("old", after=first.id)
        pending = asyncio.ensure_future(anext(watch))
        await listening(pg_url, store)
        second = _entry("written at version 3", first.id)
        await other.append_entries("old", [second])
        assert (await asyncio.wait_for(pending, 30)).id == second.id
        await watch.aclose()  # type: ignore[attr-defined]
        assert [r.id for r in (await store.list_sessions()).sessions] == ["old"]


async def test_stores_migrating_a_new_schema_at_once(pg_url: str, pg_schema: str) -> None:
    stores = [PostgresStore(pg_url, schema=pg_schema, max_size=1) for _ in range(8)]
    # Connect first, so the migrations themselves start together.
    await asyncio.gather(*(s.pool.open(wait=True) for s in stores))
    await asyncio.gather(*(s.create_session(SessionRecord(id=f"p{n}"))
                           for n, s in enumerate(stores)))
    for s in stores:
        await s.close()
    assert query_rows(pg_url, f"SELECT count(*) FROM {pg_schema}.schema_migrations") == [
        (len(MIGRATIONS),)]
    assert query_rows(pg_url, f"SELECT count(*) FROM {pg_schema}.sessions") == [(8,)]


def _open_and_create(url: str, schema: str, n: int) -> int:
    async def run() -> int:
        async with PostgresStore(url, schema=schema, max_size=1) as store:
            await store.create_session(SessionRecord(id=f"p{n}"))
        return n

    return asyncio.run(run())


async def test_processes_migrating_a_new_schema_at_once(pg_url: str, pg_schema: str) -> None:
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        # Warm the workers first, so the migrations really start together.
        await asyncio.gather(*(loop.run_in_executor(pool, abs, n) for n in range(4)))
        done = await asyncio.gather(*(
            loop.run_in_executor(pool, _open_and_create, pg_url, pg_schema, n)
            for n in range(4)))
    assert sorted(done) == list(range(4))
    assert query_rows(pg_url, f"SELECT count(*) FROM {pg_schema}.schema_migrations") == [
        (len(MIGRATIONS),)]
    assert query_rows(pg_url, f"SELECT count(*) FROM {pg_schema}.sessions") == [(4,)]


async def test_s4_processes_appending_to_one_session_keep_one_order(
    pg_url: str, pg_schema: str
) -> None:
    await check_processes_keep_one_order(pg_url, pg_url, pg_schema)


@pytest.mark.parametrize("size", [1, 2, _VALUES_MAX, _VALUES_MAX + 1])
async def test_s25_both_forms_of_the_append_store_alike_and_refuse_repeats_whole(
    pg_url: str, pg_schema: str, size: int
) -> None:
    # Up to _VALUES_MAX entries the append statement is a VALUES list, above it
    # unnest's arrays: either side of the edge, the same rows, numbered the same,
    # a retry accepted and every other repeat refused with nothing stored.
    async with PostgresStore(pg_url, schema=pg_schema, prepare_threshold=0) as store:
        await store.create_session(SessionRecord(id="s"))
        root = _entry("root")
        await store.append_entries("s", [root])
        batch: list[MessageEntry] = []
        for n in range(size):
            batch.append(_entry(f"e{n}", (batch[-1] if batch else root).id))
        await store.append_entries("s", batch)
        await store.append_entries("s", batch)  # the retry of a lost acknowledgement
        last = batch[-1]
        changed = MessageEntry(id=last.id, parent_id=last.parent_id, timestamp=last.timestamp,
                               message=UserMessage.of("other"))
        fresh = _entry("fresh", last.id)
        twice = [_entry(f"t{n}") for n in range(max(size, 2))]
        twice[-1] = twice[0]
        refused = [([*batch[:-1], changed], "different content"),
                   ([*batch, fresh], "is new but others are stored"),
                   ([fresh, *batch[1:], root], "is new but others are stored"),
                   (twice, "holds one id twice")]
        for attempt, why in refused:
            with pytest.raises(StoreError, match=why):
                await store.append_entries("s", attempt)
        loaded = await store.load_entries("s")
        assert [encode_entry(e) for e in loaded] == [encode_entry(e) for e in [root, *batch]]
        assert query_rows(pg_url, f"SELECT seq FROM {pg_schema}.entries ORDER BY seq") == [
            (n,) for n in range(1, size + 2)]
        # The counter names the last entry, so append_linear chains after it,
        # in the same form of the statement.
        chain: list[MessageEntry] = []
        for n in range(size):
            chain.append(_entry(f"l{n}", chain[-1].id if chain else None))
        linear = await store.append_linear("s", chain)
        assert [e.parent_id for e in linear] == [last.id, *(e.id for e in linear[:-1])]
        assert [e.id for e in await store.load_entries_after("s", last.id)] == [
            e.id for e in linear]


# The append of the release before the VALUES form (schema version 4 too),
# as a process still running it sends it.
_PREVIOUS_APPEND = (
    "WITH s AS (UPDATE {s}.sessions SET next_seq = next_seq + %(n)s "
    "WHERE session_id = %(sid)s RETURNING next_seq - %(n)s AS base) "
    "INSERT INTO {s}.entries (seq, ts, kind, session_id, entry_id, parent_id, data) "
    "SELECT s.base + e.ord, e.ts, e.kind, %(sid)s, e.entry_id, e.parent_id, e.data "
    "FROM s, unnest(%(kinds)s::smallint[], %(ids)s::bytea[], %(parents)s::bytea[], "
    "%(ts)s::bigint[], %(datas)s::bytea[]) "
    "WITH ORDINALITY AS e(kind, entry_id, parent_id, ts, data, ord)")


async def test_s38_appends_of_the_previous_release_and_this_one_share_a_session(
    pg_url: str, pg_schema: str
) -> None:
    # Same schema, same counter: during a rolling upgrade both releases append
    # to one session, and neither's entries are lost, renumbered or refused.
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        log: list[MessageEntry] = []

        def chain(n: int) -> list[MessageEntry]:
            batch: list[MessageEntry] = []
            for k in range(n):
                parent = batch[-1] if batch else (log[-1] if log else None)
                batch.append(_entry(f"{len(log)}.{k}", None if parent is None else parent.id))
            log.extend(batch)
            return batch

        for n in (1, _VALUES_MAX + 1, 3):
            await store.append_entries("s", chain(n))
            old = chain(n)
            rows = [compact(e, encode_entry(e, session_id="s")) for e in old]
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(_PREVIOUS_APPEND.replace("{s}", pg_schema).encode(), {
                    "sid": "s", "n": n, **{k: [r[i] for r in rows] for i, k in enumerate(
                        ("kinds", "ids", "parents", "ts", "datas"))}})
        await store.append_entries("s", log[-2:])  # a retry over the old release's rows
        assert [encode_entry(e) for e in await store.load_entries("s")] == [
            encode_entry(e) for e in log]
        assert query_rows(pg_url, f"SELECT seq FROM {pg_schema}.entries ORDER BY seq") == [
            (n,) for n in range(1, len(log) + 1)]


async def _prepared_statements(store: PostgresStore) -> int:
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize(("threshold", "expect_prepared"), [(None, False), (0, True)])
async def test_prepare_threshold_none_leaves_no_server_side_statements(
    pg_url: str, pg_schema: str, threshold: int | None, expect_prepared: bool
) -> None:
    # PgBouncer in transaction mode breaks on named prepared statements; with
    # prepare_threshold=None the server must never hold one.
    async with PostgresStore(pg_url, schema=pg_schema, prepare_threshold=threshold,
                             min_size=1, max_size=1) as store:
        await store.create_session(SessionRecord(id="s"))
        for n in range(8):
            await store.append_entries("s", [_entry(str(n))])
            await store.load_entries("s")
            await store.list_sessions()
        assert len(await store.load_entries("s")) == 8
        assert (await _prepared_statements(store) > 0) is expect_prepared


async def test_pool_passed_in_is_used_committed_and_left_open(
    pg_url: str, pg_schema: str
) -> None:
    # A pool handing out connections outside autocommit: the store must commit.
    async with AsyncConnectionPool(pg_url, min_size=1, max_size=2, open=False,
                                   name="app-pool") as pool:
        store = PostgresStore(pool, schema=pg_schema)
        await store.create_session(SessionRecord(id="s", parent_id="p"))
        await store.append_entries("s", [_entry("one"), _entry("two")])
        await store.close()
        assert not pool.closed
        assert query_rows(pg_url, f"SELECT count(*) FROM {pg_schema}.entries") == [(2,)]
        again = PostgresStore(pool, schema=pg_schema)
        assert (await again.load_session("s")).parent_id == "p"
        assert len(await again.load_entries("s")) == 2
        assert "app-pool" in repr(again)


async def test_schemas_isolate_stores(pg_url: str, pg_schema: str) -> None:
    other = pg_schema + "_b"
    try:
        async with PostgresStore(pg_url, schema=pg_schema) as a, \
                PostgresStore(pg_url, schema=other) as b:
            await a.create_session(SessionRecord(id="same"))
            await b.create_session(SessionRecord(id="same"))
            await a.append_entries("same", [_entry("in a")])
            assert len(await a.load_entries("same")) == 1
            assert list(await b.load_entries("same")) == []
            await b.delete_session("same")
            assert len(await a.load_entries("same")) == 1
        tables = query_rows(pg_url, "SELECT table_schema, table_name FROM "
                            "information_schema.tables WHERE table_schema IN (%s, %s) "
                            "ORDER BY 1, 2", pg_schema, other)
        assert tables == sorted(
            (s, t) for s in (pg_schema, other) for t in ("blobs", "entries",
                                                           "schema_migrations", "search",
                                                           "sessions"))
    finally:
        query_rows(pg_url, f"DROP SCHEMA IF EXISTS {other} CASCADE")


async def test_s72_every_unique_key_starts_with_tenant_then_session_id(
    pg_url: str, pg_schema: str
) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
    keys = query_rows(
        pg_url,
        "SELECT c.relname, a.attname, b.attname, i.indisunique FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0] "
        "LEFT JOIN pg_attribute b ON b.attrelid = t.oid AND b.attnum = i.indkey[1] "
        "WHERE n.nspname = %s AND t.relname IN ('sessions', 'entries')", pg_schema)
    # Two primary keys and the entry-id unique key: the tenant, then the session, lead.
    assert {(first, second) for _, first, second, unique in keys if unique} == {
        ("tenant", "session_id")}
    assert sum(unique for *_, unique in keys) == 3
    # The listing indexes are the only others (per-shard indexes when distributed):
    # by creation, by activity, within an owner or a tenant, and labels (S62), each
    # within the store's tenant but the labels' GIN index.
    assert sorted((name, first, second) for name, first, second, unique in keys
                  if not unique) == [
        ("sessions_activity", "tenant", "last_activity"), ("sessions_labels", "labels", None),
        ("sessions_newest", "tenant", "created_at"),
        ("sessions_owner_activity", "tenant", "owner"),
        ("sessions_tenant_activity", "tenant", "meta_tenant")]


async def test_list_sessions_reads_the_index_in_order(pg_url: str, pg_schema: str) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        query_rows(pg_url, f"INSERT INTO {pg_schema}.sessions (session_id, created_at, "
                           f"last_activity) SELECT 'g' || n, now() - n * interval '1 second', "
                           f"(extract(epoch FROM now() - n * interval '1 second') * 1e6)::bigint "
                           f"FROM generate_series(1, 20000) n")
        query_rows(pg_url, f"ANALYZE {pg_schema}.sessions")
        page = await store.list_sessions(limit=3)
        assert [r.id for r in page.sessions] == ["s", "g1", "g2"]
        assert page.next_cursor is not None
        later = await store.list_sessions(limit=2, cursor=page.next_cursor)
        assert [r.id for r in later.sessions] == ["g3", "g4"]
    none = Filters(None, None, None)
    for order, index, after in (
        ("created", "sessions_newest", None), ("created", "sessions_newest",
                                              (datetime.now(UTC), "g10")),
        ("activity", "sessions_activity", None), ("activity", "sessions_activity",
                                                  (datetime.now(UTC), "g10")),
    ):
        query, args = list_query("", 50, after, none, order)  # type: ignore[arg-type]
        query = query.replace("{s}", pg_schema)
        plan = "\n".join(r[0] for r in query_rows(pg_url, "EXPLAIN " + query, *args))
        assert index in plan and "Sort" not in plan, plan


async def test_corrupt_row_names_table_and_row(pg_url: str, pg_schema: str) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", [_entry("fine"), _entry("to be broken")])
        query_rows(pg_url, f"UPDATE {pg_schema}.entries SET data = '\\x7b226e6f74'::bytea "
                           f"WHERE seq = 2")
        with pytest.raises(CorruptLog) as info:
            await store.load_entries("s")
        assert "table entries" in str(info.value) and "seq=2" in str(info.value)
        assert pg_schema in str(info.value)


async def test_unreachable_server_is_a_store_error_without_the_password() -> None:
    store = PostgresStore("postgresql://u:hunter2@127.0.0.1:9/x", connect_timeout=1)
    with pytest.raises(StoreError) as info:
        await store.load_entries("s")
    assert "hunter2" not in str(info.value) and "127.0.0.1:9" in str(info.value)
    await store.close()


async def test_bad_arguments(pg_url: str, pg_schema: str) -> None:
    with pytest.raises(ConfigError):
        PostgresStore(pg_url, schema="")
    with pytest.raises(ConfigError):
        PostgresStore(pg_url, min_size=5, max_size=2)
    with pytest.raises(ConfigError):
        PostgresStore(42)  # type: ignore[arg-type]
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        with pytest.raises(InvalidSessionId):
            await store.create_session(SessionRecord(id="nul\x00id"))


async def test_closed_store_refuses_work_and_keeps_its_pool_closed(
    pg_url: str, pg_schema: str
) -> None:
    store = PostgresStore(pg_url, schema=pg_schema)
    await store.create_session(SessionRecord(id="s"))
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.load_entries("s")
    assert store.pool.closed
    never_used = PostgresStore(pg_url, schema=pg_schema)
    await never_used.close()
    with pytest.raises(StoreError, match="closed"):
        await never_used.load_entries("s")
    assert never_used.pool.closed


async def test_s26_appender_that_saw_no_listener_notifies_a_watcher_that_came_later(
    pg_url: str, pg_schema: str
) -> None:
    # The appender skips NOTIFY while no store listens, and looks again within
    # a quarter of a second: a watcher that starts later is woken by NOTIFY
    # (polling is pushed out of the way), not left to its next read.
    async with PostgresStore(pg_url, schema=pg_schema) as appender, \
            PostgresStore(pg_url, schema=pg_schema) as watcher:
        await appender.create_session(SessionRecord(id="late"))
        first = _entry("nobody listens yet")
        await appender.append_entries("late", [first])
        await appender.append_entries("late", [_entry("still nobody", first.id)])
        watcher.watch_interval = 3600
        watch = watcher.watch("late")
        assert (await asyncio.wait_for(anext(watch), 30)).id == first.id
        await anext(watch)
        pending = asyncio.ensure_future(anext(watch))
        await listening(pg_url, watcher)
        await until(lambda: not appender._notifier.quiet())  # "nobody listens" expired
        third = _entry("now somebody does")
        await appender.append_entries("late", [third])
        assert (await asyncio.wait_for(pending, 30)).id == third.id
        await watch.aclose()  # type: ignore[attr-defined]


async def test_s26_close_ends_the_listen_connection_after_the_loop_was_busy(
    pg_url: str, pg_schema: str
) -> None:
    # psycopg waits on the LISTEN socket through wait_for with a 0.1 s timeout.
    # When that timeout falls due while the loop is busy (here: decoding a
    # 5 MiB entry) and close() cancels, CPython 3.11's wait_for can lose the
    # cancel, and close() used to hang for good.
    big = _entry("b" * (5 << 20))
    for n in range(20):
        watcher = PostgresStore(pg_url, schema=pg_schema, max_size=2)
        await watcher.create_session(SessionRecord(id=f"busy-{n}"))
        await watcher.append_entries(f"busy-{n}", [big, _entry("small", big.id)])
        watch = watcher.watch(f"busy-{n}")
        await asyncio.wait_for(anext(watch), 30)
        await asyncio.wait_for(anext(watch), 30)
        await watch.aclose()  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            await watcher.close()
        name = watcher._notifier.listener_name
        for _ in range(100):  # the server notices the disconnect soon after
            rows = query_rows(pg_url, "SELECT count(*) FROM pg_stat_activity "
                              "WHERE application_name = %s", name)
            if rows == [(0,)]:
                break
            await asyncio.sleep(0.05)
        assert rows == [(0,)], f"{name} still connected 5 s after close()"


async def test_s38_a_store_that_waited_for_another_migration_sees_its_schema(
    pg_url: str, pg_schema: str
) -> None:
    # Another process holds the schema's migration lock and creates the schema
    # while this store's first use, having found no schema, waits for the
    # lock: the store must then find the schema, not collide with it or skip
    # its own tables.
    key = int.from_bytes(hashlib.blake2b(f"threadline:{pg_schema}".encode(),
                                         digest_size=8).digest(), "big", signed=True)
    other = await psycopg.AsyncConnection.connect(pg_url)
    await other.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
    store = PostgresStore(pg_url, schema=pg_schema)  # opened by its first use
    try:
        first_use = asyncio.ensure_future(store.create_session(SessionRecord(id="after")))
        await blocked_by(pg_url, other.info.backend_pid)  # it found no schema, waits
        assert not first_use.done()
        await other.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(
            psycopg.sql.Identifier(pg_schema)))
        await other.commit()
        await asyncio.wait_for(first_use, 30)
        assert (await store.load_session("after")).id == "after"
    finally:
        await other.close()
        await store.close()


@pytest_asyncio.fixture
async def proxy(pg_url: str) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(pg_url) as p:
        yield p


@pytest.mark.parametrize(("min_size", "max_size"), [(0, 3), (1, 1), (1, 10), (3, 3)])
async def test_s43_a_cold_open_and_load_connects_once_and_keeps_min_size(
    pg_url: str, pg_schema: str, proxy: TcpProxy, min_size: int, max_size: int
) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as writer:
        await writer.create_session(SessionRecord(id="s"))
        await writer.append_entries("s", [_entry("hello")])
    store = PostgresStore(proxy.url, schema=pg_schema, min_size=min_size,
                          max_size=max_size)
    try:
        assert [e.message.text for e in await store.load_entries("s")] == ["hello"]
        if min_size <= 1:
            assert proxy.made == 1
        # The pool still fills to the min_size it was given, and no further.
        await store.pool.wait(timeout=10)
        await asyncio.sleep(0.1)
        assert store.pool.get_stats()["pool_size"] == max(min_size, 1) == proxy.made
    finally:
        await store.close()
    assert await proxy.closed()


async def test_s43_a_store_closed_before_its_pool_took_the_first_connection_closes_it(
    pg_url: str, pg_schema: str, proxy: TcpProxy
) -> None:
    # min_size=0: no pool connection is asked for until the first call.
    async with PostgresStore(proxy.url, schema=pg_schema, min_size=0):
        assert (proxy.made, proxy.open) == (1, 1)
    assert await proxy.closed()


async def test_s43_create_false_on_a_missing_schema_fails_in_one_connection_and_closes_it(
    pg_url: str, pg_schema: str, proxy: TcpProxy
) -> None:
    store = PostgresStore(proxy.url, schema=pg_schema, create=False)
    for _ in range(2):  # and again: the pool was never opened
        with pytest.raises(StoreError, match="no threadline store.*" + pg_schema) as info:
            await store.load_entries("s")
        assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
        assert await proxy.closed()
    assert proxy.made == 2 and store.pool.closed
    await store.close()
    assert query_rows(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", pg_schema) == []


class _Replies(TcpProxy):
    """Reads the server's messages on the one connection through it, once ``counting``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.counting = False
        self.ready = 0  # ReadyForQuery: one per round trip
        self.tags: list[str] = []  # CommandComplete tags: one per statement
        self._buf = b""

    def cut(self, reply: bytes) -> bool:
        if self.counting:  # started between calls, so at a message boundary
            self._buf += reply
            while len(self._buf) >= 5:
                size = int.from_bytes(self._buf[1:5], "big") + 1
                if len(self._buf) < size:
                    break
                kind, body, self._buf = self._buf[:1], self._buf[5:size], self._buf[size:]
                if kind == b"Z":
                    self.ready += 1
                elif kind == b"C":
                    self.tags.append(body.rstrip(b"\0").decode())
        return False


async def test_s45_an_append_is_one_statement_in_one_round_trip(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No store listens; the look for a listener (one round trip each 0.25 s)
    # is put off so the count does not depend on the machine's speed.
    monkeypatch.setattr("threadline.stores.postgres._watch._QUIET", 3600.0)
    async with _Replies(pg_url) as proxy:
        store = PostgresStore(proxy.url, schema=pg_schema, min_size=1, max_size=1)
        try:
            await store.create_session(SessionRecord(id="s"))
            parent = None
            # Past the prepare threshold (its one extra round trip) and the first
            # append's look for a listener.
            for n in range(8):
                entry = _entry(f"warm {n}", parent)
                await store.append_entries("s", [entry])
                parent = entry.id
            proxy.counting = True
            for sizes in ([1] * 5, [2, 8]):
                for size in sizes:
                    batch = []
                    for n in range(size):
                        batch.append(_entry(f"{size} {n}", parent))
                        parent = batch[-1].id
                    await store.append_entries("s", batch)
            proxy.counting = False
            assert proxy.ready == 7
            assert proxy.tags == ["INSERT 0 1"] * 5 + ["INSERT 0 2", "INSERT 0 8"]
            assert len(await store.load_entries("s")) == 8 + 5 + 10
            assert proxy.made == 1
        finally:
            await store.close()


async def test_s45_a_failed_or_cancelled_append_gives_its_connection_back(
    pg_url: str, pg_schema: str
) -> None:
    # One connection and a short pool timeout: a connection kept by a failed
    # call would make every later call fail with StoreUnavailable.
    store = PostgresStore(pg_url, schema=pg_schema, min_size=1, max_size=1, timeout=2)
    try:
        await store.create_session(SessionRecord(id="s"))
        first = _entry("first")
        await store.append_entries("s", [first])
        for _ in range(3):
            with pytest.raises(SessionNotFound):
                await store.append_entries("missing", [_entry("x")])
            with pytest.raises(StoreError, match="repeats an entry id"):
                # The same id with other content: a conflict, not a retry (S25).
                await store.append_entries("s", [MessageEntry(
                    id=first.id, message=UserMessage.of("other"))])
        await cancel_while_locked(pg_url, pg_schema, store, _entry("cut", first.id))
        last = _entry("after", first.id)
        await asyncio.wait_for(store.append_entries("s", [last]), 10)
        assert [e.id for e in await store.load_entries("s")] == [first.id, last.id]
    finally:
        await store.close()


def _held_by(pg_url: str, name: str) -> int:
    """How many connections named ``name`` the server holds, once it has seen
    the ones closed just now go (it notices a closed socket soon after)."""
    for _ in range(100):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (held,) = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                   "WHERE application_name = %s", (name,)).fetchone() or (0,)
        if held == 0:
            break
        time.sleep(0.05)
    return int(held)


def test_s33_loops_that_ended_do_not_keep_their_connections(pg_url: str, pg_schema: str) -> None:
    # A store used through asyncio.run, call after call, makes a pool per
    # loop. asyncio.run cancels a loop's tasks before closing it, the pool's
    # own among them: the store's closer task closes the pool then, so no
    # ended loop keeps a connection open.
    name = f"tl-ended-{pg_schema}"
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{sep}application_name={name}", schema=pg_schema)
    parent: str | None = None
    asyncio.run(store.create_session(SessionRecord(id="s")))
    for n in range(6):
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"call {n}"))
        asyncio.run(store.append_entries("s", [entry]))
        parent = entry.id
        assert _held_by(pg_url, name) == 0, f"loop {n} ended with its connections open"

    async def last() -> int:
        n = len(await store.load_entries("s"))
        await store.close()
        return n

    assert asyncio.run(last()) == 6


# Closing a loop whose tasks still wait (psycopg_pool's among them) is what
# asyncio warns about; that is this test's point.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_s33_a_loop_closed_without_cancelling_its_tasks_leaves_its_pool_to_the_collector(
    pg_url: str, pg_schema: str
) -> None:
    # Such a loop ran no closer: the next loop's first call drops its pool,
    # and the garbage collector closes the pool's connections.
    name = f"tl-manual-{pg_schema}"
    sep = "&" if "?" in pg_url else "?"
    store = PostgresStore(f"{pg_url}{sep}application_name={name}", schema=pg_schema)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    parent: str | None = None
    for n in range(3):
        loop = asyncio.new_event_loop()
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"manual {n}"))
        loop.run_until_complete(store.append_entries("s", [entry]))
        parent = entry.id
        loop.close()
    del loop

    async def last() -> int:
        n = len(await store.load_entries("s"))
        await store.close()
        return n

    assert asyncio.run(last()) == 3
    gc.collect()
    assert _held_by(pg_url, name) == 0


async def test_async_with_opens_the_store_and_closes_its_pool(
    pg_url: str, pg_schema: str, proxy: TcpProxy
) -> None:
    async with PostgresStore(proxy.url, schema=pg_schema) as store:
        assert proxy.open == 1  # entering connected and made the schema
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", [_entry("inside")])
    assert await proxy.closed()
    with pytest.raises(StoreError, match="closed"):
        await store.load_entries("s")
    async with PostgresStore(pg_url, schema=pg_schema) as again:
        assert [e.message.text for e in await again.load_entries("s")] == ["inside"]

