"""PostgresStore through a real PgBouncer in transaction pooling mode.

The whole conformance suite, multi-process appends included, runs through the
pooler; so does the one-session multi-process test of the PostgreSQL store.
Transaction pooling hands each transaction to whichever server connection is
free, so anything that outlives a transaction on the server (a named prepared
statement, a session setting) would break: ``prepare_threshold=None`` is the
setting that keeps the store inside those rules on PgBouncer 1.18 (Debian 12).

PgBouncer 1.21 and later, with ``max_prepared_statements`` set, prepare a
client's protocol-level statements on whichever server connection runs them
(S49). The same suite runs through such a PgBouncer (1.24, which ``.ci/run``
builds) with the store's default ``prepare_threshold``, on three server
connections for all of the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from support.pgbouncer import PgBouncer
from support.postgres import check_processes_keep_one_order
from threadline.ai._messages import UserMessage
from threadline.errors import SessionNotFound, StoreUnavailable
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import PostgresStore, Store
from threadline.testing import StoreConformance
from threadline.testing._conformance import StoreOpener

T = TypeVar("T")


class TestPostgresStoreThroughPgBouncer(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    @pytest.fixture(autouse=True)
    def _schema(self, pgbouncer_url: str, pg_schema: str, pg_url: str) -> Iterator[None]:
        self.url, self.pg_schema, self.pg_url = pgbouncer_url, pg_schema, pg_url
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        # LISTEN needs a session connection: watchers listen on PostgreSQL itself.
        return PostgresStore(self.url, schema=self.pg_schema, max_size=4,
                             prepare_threshold=None, listen_url=self.pg_url)

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        return functools.partial(PostgresStore, self.url, schema=self.pg_schema,
                                 max_size=2, prepare_threshold=None, listen_url=self.pg_url)


async def test_s4_processes_through_pgbouncer_keep_one_order(
    pgbouncer_url: str, pg_schema: str, pg_url: str
) -> None:
    await check_processes_keep_one_order(
        pgbouncer_url, pg_url, pg_schema, prepare_threshold=None)


async def test_pgbouncer_sees_no_prepared_statement_errors(
    pgbouncer_url: str, pg_schema: str
) -> None:
    # Many more transactions than server connections: each lands on whichever
    # server connection is free, so a leaked prepared statement would fail here.
    async with PostgresStore(pgbouncer_url, schema=pg_schema, prepare_threshold=None,
                             max_size=8) as store:
        for n in range(20):
            await store.create_session(SessionRecord(id=f"s{n}"))
            await store.append_entries(f"s{n}", [MessageEntry(message=UserMessage.of("x"))])
            assert len(await store.load_entries(f"s{n}")) == 1
        assert len((await store.list_sessions(limit=100)).sessions) == 20


# -- PgBouncer 1.21+ keeping prepared statements (S49) ---------------------------


class TestPostgresStoreThroughPgBouncerKeepingStatements(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    @pytest.fixture(autouse=True)
    def _schema(self, pgbouncer_prepared: PgBouncer, pg_schema: str,
                pg_url: str) -> Iterator[None]:
        self.url, self.pg_schema, self.pg_url = pgbouncer_prepared.url, pg_schema, pg_url
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        # The default prepare_threshold: statements prepared after 5 runs.
        return PostgresStore(self.url, schema=self.pg_schema, max_size=4,
                             listen_url=self.pg_url)

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        return functools.partial(PostgresStore, self.url, schema=self.pg_schema,
                                 max_size=2, listen_url=self.pg_url)


def _servers(bouncer: PgBouncer) -> list[dict[str, Any]]:
    """PgBouncer's own view of its server connections (its admin console)."""
    admin = f"postgresql://postgres@127.0.0.1:{bouncer.port}/pgbouncer"
    with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
        cur = conn.execute("SHOW SERVERS")
        names = [column.name for column in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


async def _chains(store: PostgresStore, sessions: int, count: int) -> list[list[str]]:
    """``count`` more chained appends to each of sessions s0.., all at once; every id.

    A call that meets a lost connection raises ``StoreUnavailable`` and is
    made again, as S25 allows (an append's retry is recognised as one).
    """
    async def retried(call: Callable[[], Awaitable[T]]) -> T:
        for _ in range(3):
            try:
                return await call()
            except StoreUnavailable:
                pass
        return await call()

    async def chain(sid: str) -> list[str]:
        ids = [e.id for e in await retried(lambda: store.load_entries(sid))]
        for n in range(count):
            entry = MessageEntry(parent_id=ids[-1] if ids else None,
                                 message=UserMessage.of(f"{sid} {n}"))
            await retried(functools.partial(store.append_entries, sid, [entry]))
            ids.append(entry.id)
        return ids

    return await asyncio.gather(*(chain(f"s{n}") for n in range(sessions)))


@contextlib.asynccontextmanager
async def _every_statement_prepared(bouncer: PgBouncer, schema: str,
                                    sessions: int) -> AsyncIterator[PostgresStore]:
    """A store through ``bouncer`` with 8 client connections that prepares
    every statement at once, with sessions s0.. made."""
    async with PostgresStore(bouncer.url, schema=schema, prepare_threshold=0,
                             max_size=8) as store:
        for n in range(sessions):
            await store.create_session(SessionRecord(id=f"s{n}"))
        yield store


async def test_s49_processes_through_pgbouncer_keeping_statements_keep_one_order(
    pgbouncer_prepared: PgBouncer, pg_schema: str, pg_url: str
) -> None:
    await check_processes_keep_one_order(
        pgbouncer_prepared.url, pg_url, pg_schema, prepare_threshold=0)


async def test_s49_statements_prepared_through_pgbouncer_run_on_every_server_connection(
    pgbouncer_prepared: PgBouncer, pg_schema: str, pg_url: str
) -> None:
    # Eight clients over three server connections, every statement prepared
    # at once: each append lands on whichever server connection is free, so
    # PgBouncer must prepare the store's statements on each of them.
    async with _every_statement_prepared(pgbouncer_prepared, pg_schema, 8) as store:
        chains = await _chains(store, 8, 15)
        for n, ids in enumerate(chains):
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
    servers = _servers(pgbouncer_prepared)
    assert 2 <= len(servers) <= 3
    assert all(server["prepared_statements"] > 0 for server in servers)


async def test_s49_server_connections_lost_under_pgbouncer_come_back_prepared(
    pgbouncer_prepared: PgBouncer, pg_schema: str, pg_url: str
) -> None:
    # Every server connection ended by PostgreSQL between appends: PgBouncer
    # opens new ones and prepares on them again. A call that PgBouncer had
    # already handed to a dead one gets StoreUnavailable and is made again
    # (S25); nothing acknowledged is lost, nothing is stored twice.
    async with _every_statement_prepared(pgbouncer_prepared, pg_schema, 6) as store:
        await _chains(store, 6, 8)
        before = {server["remote_pid"] for server in _servers(pgbouncer_prepared)}
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for pid in before:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        chains = await _chains(store, 6, 8)
        for n, ids in enumerate(chains):
            assert len(ids) == 16
            assert [e.id for e in await store.load_entries(f"s{n}")] == ids
    after = _servers(pgbouncer_prepared)
    assert not before & {server["remote_pid"] for server in after}
    assert all(server["prepared_statements"] > 0 for server in after)


@pytest.mark.parametrize("tenant", [None, "acme"])
async def test_s49_appends_after_a_rolled_back_call_still_name_known_statements(
    pgbouncer_prepared: PgBouncer, pg_schema: str, tenant: str | None
) -> None:
    """A call that rolls back (deleting a session that is not there) makes psycopg
    send DEALLOCATE ALL, which PgBouncer 1.22+ applies to the client's statements:
    the wire's prepared appends must be prepared again, not named (PgBouncer
    would end the connection)."""
    async with PostgresStore(pgbouncer_prepared.url, schema=pg_schema, max_size=1,
                             tenant=tenant, trusted=True) as store:
        await store.create_session(SessionRecord(id="s"))
        for _ in range(8):
            for n in range(8):  # past the prepare threshold: the wire prepares its statements
                await store.append_entries("s", [MessageEntry(message=UserMessage.of(f"{n}"))])
            for _ in range(6):  # prepared by psycopg after 5 (a ROLLBACK resets its counts)
                await store.load_session("s")
            with pytest.raises(SessionNotFound):
                await store.delete_session("missing")
        assert len(await store.load_entries("s")) == 64
        assert store.pool.get_stats().get("connections_lost", 0) == 0
