"""PostgresStore through a real PgBouncer in transaction pooling mode.

The whole conformance suite, multi-process appends included, runs through the
pooler; so does the one-session multi-process test of the PostgreSQL store.
Transaction pooling hands each transaction to whichever server connection is
free, so anything that outlives a transaction on the server (a named prepared
statement, a session setting) would break: ``prepare_threshold=None`` is the
setting that keeps the store inside those rules.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import test_store_postgres
from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, PostgresStore, SessionRecord, Store
from threadline.testing import StoreConformance
from threadline.testing._conformance import StoreOpener


class TestPostgresStoreThroughPgBouncer(StoreConformance):
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
    await test_store_postgres.check_processes_keep_one_order(
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
