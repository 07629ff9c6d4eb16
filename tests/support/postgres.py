"""Reaching into a PostgreSQL store's tables from outside: raw rows, held locks, processes."""

from __future__ import annotations

import asyncio
import functools
import itertools
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg
import pytest

from threadline.ai import UserMessage
from threadline.session import MessageEntry, SessionRecord, new_id
from threadline.stores import PostgresStore
from threadline.stores._rows import id_key, id_text
from threadline.stores.postgres._wire import VALUES_MAX as _VALUES_MAX
from threadline.testing._conformance import check_concurrent_log


def insert_raw_row(url: str, schema: str, session_id: str, data: bytes) -> None:
    """Store ``data`` as a whole line (row kind 0), as if another program wrote it."""
    query_rows(url, f"WITH s AS (UPDATE {schema}.sessions SET next_seq = next_seq + 1 "
                    f"WHERE session_id = %s RETURNING next_seq) INSERT INTO {schema}.entries "
                    f"(seq, kind, session_id, entry_id, data) SELECT s.next_seq, 0, %s, %s, %s "
                    "FROM s", session_id, session_id, id_key(new_id()), data)


def query_rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []


BATCH_SIZES = (1, 2, 3, _VALUES_MAX, _VALUES_MAX + 1)


def append_chain(url: str, schema: str, sid: str, writer: int, count: int, *,
                 prepare_threshold: int | None = 5) -> list[str]:
    async def run() -> list[str]:
        acknowledged: list[str] = []
        parent = None
        async with PostgresStore(url, schema=schema, max_size=1,
                                 prepare_threshold=prepare_threshold) as store:
            for n in range(count):
                # A batch must stay contiguous, in either form of the append
                # statement (a VALUES list up to _VALUES_MAX entries, arrays above).
                batch = []
                for k in range(BATCH_SIZES[(writer + n) % len(BATCH_SIZES)]):
                    entry = _entry(f"w{writer} {n}.{k}", parent)
                    parent = entry.id
                    batch.append(entry)
                await store.append_entries(sid, batch)
                acknowledged += [e.id for e in batch]
        return acknowledged

    return asyncio.run(run())


async def check_processes_keep_one_order(
    url: str, pg_url: str, pg_schema: str, *, prepare_threshold: int | None = 5
) -> None:
    """Six processes append to one session through ``url``; ``pg_url`` checks."""
    async with PostgresStore(url, schema=pg_schema, prepare_threshold=prepare_threshold) as store:
        await store.create_session(SessionRecord(id="hot"))
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(6, mp_context=multiprocessing.get_context("spawn")) as pool:
            chains = await asyncio.gather(*(
                loop.run_in_executor(pool, functools.partial(
                    append_chain, url, pg_schema, "hot", w, 40,
                    prepare_threshold=prepare_threshold))
                for w in range(6)))
        loaded = await store.load_entries("hot")
        check_concurrent_log(loaded, chains)
        # The sequence is gapless, and every batch sits in one contiguous run.
        seqs = query_rows(pg_url, f"SELECT seq, entry_id FROM {pg_schema}.entries "
                                  f"WHERE session_id = 'hot' ORDER BY seq")
        assert [s for s, _ in seqs] == list(range(1, len(loaded) + 1))
        assert [id_text(i) for _, i in seqs] == [e.id for e in loaded]
        writer_of = {i: w for w, chain in enumerate(chains) for i in chain}
        runs = sum(1 for a, b in itertools.pairwise(loaded)
                   if writer_of[a.id] != writer_of[b.id])
        assert runs >= 1  # the writers really interleaved


async def blocked_by(url: str, pid: int) -> None:
    """Return once some server connection waits on a lock that backend ``pid`` holds
    (thirty seconds is a guard against a hang, not a wait)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with asyncio.timeout(30):
            while True:
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                         "WHERE %s = ANY(pg_blocking_pids(pid))", (pid,))
                row = await cur.fetchone()
                if row is not None and row[0] > 0:
                    return
                await asyncio.sleep(0.01)


async def listening(url: str, store: PostgresStore) -> None:
    """Return once ``store``'s LISTEN connection is listening (thirty seconds is a
    guard against a hang, not a wait)."""
    name = store._notifier.listener_name
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with asyncio.timeout(30):
            while True:
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                         "application_name = %s AND query LIKE 'LISTEN %%'",
                                         (name,))
                row = await cur.fetchone()
                if row is not None and row[0] > 0:
                    return
                await asyncio.sleep(0.01)


async def cancel_while_locked(url: str, schema: str, store: PostgresStore, entry: MessageEntry,
                              check: Callable[[], object] = lambda: None) -> None:
    """Append ``entry`` to session "s" and cancel it while its statement is at the
    server, waiting on the session row another transaction holds; ``check``
    runs before that transaction lets the row go."""
    async with await psycopg.AsyncConnection.connect(url) as other:
        await other.execute(psycopg.sql.SQL(
            "SELECT 1 FROM {}.sessions WHERE session_id = 's' FOR UPDATE").format(
                psycopg.sql.Identifier(schema)))
        task = asyncio.create_task(store.append_entries("s", [entry]))
        await blocked_by(url, other.info.backend_pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        check()
        await other.rollback()


def _entry(text: str, parent: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))
