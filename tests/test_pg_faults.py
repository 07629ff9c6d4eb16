"""Real faults between the durable agent and PostgreSQL (S25).

- a reply lost after the COMMIT (a TCP proxy drops the server's answer);
- ``pg_terminate_backend`` on the store's connections at random moments;
- PgBouncer killed with SIGKILL and started again;
- a private PostgreSQL cluster stopped and started while processes append
  (the shared server on 5432 is never restarted).

After each: every entry the agent acknowledged is stored exactly once, the
store recovers without being reopened, and while the server is unreachable a
call fails at once with ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import random
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import pytest_asyncio

from conftest import require_or_skip
from support.pgbouncer import PgBouncer, PrivateCluster
from support.tcp_proxy import TcpProxy
from threadline import durable
from threadline.ai._messages import UserMessage
from threadline.durable import DurableAgent, RunEvent, StoredMessageEnd
from threadline.errors import StoreUnavailable
from threadline.stores import PostgresStore
from threadline.stores._rows import id_text
from threadline.testing import ScriptedModel, Turn


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query.encode(), params).fetchall()


def _stored_ids(url: str, schema: str, session_id: str) -> list[str]:
    return [id_text(i) for (i,) in _rows(url, f"SELECT entry_id FROM {schema}.entries "
                                     f"WHERE session_id = %s ORDER BY seq", session_id)]


def check_exactly_once(stored: Sequence[str], acknowledged: Sequence[str]) -> None:
    assert len(stored) == len(set(stored)), "an entry is stored twice"
    missing = set(acknowledged) - set(stored)
    assert not missing, f"{len(missing)} acknowledged entries are not stored"
    assert len(acknowledged) == len(set(acknowledged)), "an entry was acknowledged twice"


class LosingProxy(TcpProxy):
    """Told to, it swallows the server's next reply containing ``marker`` and
    cuts the connection, as a network failure would."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.marker: bytes | None = None
        self.cuts = 0

    def cut(self, reply: bytes) -> bool:
        if self.marker is None or self.marker not in reply:
            return False
        self.marker = None
        self.cuts += 1
        return True


@pytest_asyncio.fixture
async def proxy(pg_url: str) -> AsyncIterator[LosingProxy]:
    async with LosingProxy(pg_url) as p:
        yield p


async def test_s25_reply_lost_after_commit_gives_one_receipt(
    pg_url: str, pg_schema: str, proxy: LosingProxy
) -> None:
    store = PostgresStore(proxy.url, schema=pg_schema, max_size=2)
    try:
        agent = await durable.open(None, store=store, session_id="lost-ack")
        # The append's reply ("INSERT 0 1") never arrives: the COMMIT happened,
        # the agent hears a dead connection, retries, and the store recognises
        # the batch.
        proxy.marker = b"INSERT 0 1"
        (entry,) = await agent.append(UserMessage.of("hello"))
        assert proxy.cuts == 1
        assert _stored_ids(pg_url, pg_schema, "lost-ack") == [entry.id]
        assert [e.id for e in agent.entries] == [entry.id]

        # The same through a run: every receipt is issued once, for stored data.
        run_agent = await durable.open(
            durable.model(ScriptedModel([Turn.text("hi there")])), store=store,
            session_id="lost-ack-run")
        proxy.marker = b"INSERT 0 1"
        events: list[RunEvent] = await run_agent.run("hi").collect()
        receipts = [e for e in events if isinstance(e, StoredMessageEnd)]
        assert proxy.cuts == 2
        written = [entry.id for r in receipts for entry in r.entries]
        assert _stored_ids(pg_url, pg_schema, "lost-ack-run") == [e.id for e in run_agent.entries]
        check_exactly_once(_stored_ids(pg_url, pg_schema, "lost-ack-run"), written)
    finally:
        await store.close()


async def _until_stored(store: PostgresStore, session_id: str, count: int) -> None:
    watch = store.watch(session_id)
    seen = 0
    async for _ in watch:
        seen += 1
        if seen >= count:
            break
    await watch.aclose()  # type: ignore[attr-defined]


async def _append_until(agent: DurableAgent, count: int, acked: list[str],
                        failures: list[BaseException]) -> None:
    n = 0
    while len(acked) < count:
        n += 1
        try:
            batch = await agent.append(*(UserMessage.of(f"m{n}.{k}") for k in range(1 + n % 3)))
        except StoreUnavailable as exc:
            failures.append(exc)  # retries ran out: not acknowledged, maybe stored
            continue
        acked.extend(e.id for e in batch)


async def test_s25_backends_terminated_at_random_points_lose_and_repeat_nothing(
    pg_url: str, pg_schema: str
) -> None:
    tag = f"tl-fault-{secrets.token_hex(4)}"
    store = PostgresStore(f"{pg_url}?application_name={tag}", schema=pg_schema, max_size=3)
    rng = random.Random(25)
    kills = 0
    try:
        agent = await durable.open(None, store=store, session_id="terminated")
        acked: list[str] = []
        failures: list[BaseException] = []
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as killer:
            # Rounds of 50 entries until there were enough kills: how many
            # land in one round depends on the machine's load.
            for _ in range(100):
                if kills >= 20 and len(acked) >= 200:
                    break
                appender = asyncio.ensure_future(
                    _append_until(agent, len(acked) + 50, acked, failures))
                while not appender.done():
                    await asyncio.sleep(rng.uniform(0.005, 0.06))
                    cur = await killer.execute(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                        "FROM pg_stat_activity WHERE application_name = %s", (tag,))
                    row = await cur.fetchone()
                    kills += int(row[0]) if row else 0
                await appender
        assert kills >= 20  # the faults really happened, many times
        stored = _stored_ids(pg_url, pg_schema, "terminated")
        check_exactly_once(stored, acked)
        # The agent's own view is what it was told: the acknowledged entries.
        assert [e.id for e in agent.entries] == acked
        # Recovered without reopening: one more append just works.
        (last,) = await agent.append(UserMessage.of("after the storm"))
        assert _stored_ids(pg_url, pg_schema, "terminated")[-1] == last.id
    finally:
        await store.close()


@pytest.fixture
def own_pgbouncer(pg_url: str) -> Iterator[PgBouncer]:
    if shutil.which("pgbouncer") is None:
        require_or_skip("pgbouncer is not installed (apt-get install pgbouncer)")
    parts = urlsplit(pg_url)
    bouncer = PgBouncer(server_port=parts.port or 5432, dbname=parts.path.lstrip("/"))
    bouncer.start()
    yield bouncer
    bouncer.close()


async def test_s25_pgbouncer_killed_and_restarted(
    pg_url: str, pg_schema: str, own_pgbouncer: PgBouncer
) -> None:
    store = PostgresStore(own_pgbouncer.url, schema=pg_schema, prepare_threshold=None,
                          max_size=3, connect_timeout=2)
    try:
        agent = await durable.open(None, store=store, session_id="bounced")
        acked: list[str] = []
        failures: list[BaseException] = []
        for _ in range(3):
            target = len(acked) + 100
            appender = asyncio.ensure_future(_append_until(agent, target, acked, failures))
            await _until_stored(store, "bounced", target - 60)
            own_pgbouncer.kill()
            # While it is down a call fails at once with the typed error (the
            # probe, not a wait for the pool's 30 s timeout).
            with pytest.raises(StoreUnavailable):
                for _ in range(2):  # the first may meet a dead pooled connection
                    await store.load_entries("bounced")
            await asyncio.sleep(0.3)
            own_pgbouncer.start()
            await appender
        check_exactly_once(_stored_ids(pg_url, pg_schema, "bounced"), acked)
        assert len(await store.load_entries("bounced")) >= len(acked)
    finally:
        await store.close()


def _child_appends(url: str, schema: str, session_id: str, count: int) -> tuple[list[str], int]:
    async def run() -> tuple[list[str], int]:
        store = PostgresStore(url, schema=schema, max_size=2, connect_timeout=2)
        try:
            for attempt in range(100):  # the server may be down when the child starts
                try:
                    agent = await durable.open(None, store=store, session_id=session_id)
                    break
                except StoreUnavailable:
                    await asyncio.sleep(0.05 * attempt)
            acked: list[str] = []
            failures: list[BaseException] = []
            await _append_until(agent, count, acked, failures)
            return acked, len(failures)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    if not PrivateCluster.available():
        require_or_skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    c = PrivateCluster()
    c.start()
    c.create_database()
    yield c
    c.close()


async def test_s25_server_restarted_while_processes_append(cluster: PrivateCluster) -> None:
    schema = "tl_restart"
    async with PostgresStore(cluster.url, schema=schema, connect_timeout=2) as store:
        agent = await durable.open(None, store=store, session_id="restarted")
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
            children = [loop.run_in_executor(pool, functools.partial(
                _child_appends, cluster.url, schema, "restarted", 400)) for _ in range(3)]
            await _until_stored(store, "restarted", 150)
            await asyncio.to_thread(cluster.stop, "fast")
            # Down: each call fails at once with the typed error.
            for _ in range(3):
                with pytest.raises(StoreUnavailable):
                    await agent.store.load_entries("restarted")
            await asyncio.sleep(0.5)
            await asyncio.to_thread(cluster.start)
            results = await asyncio.gather(*children)
        acked = [i for ids, _ in results for i in ids]
        stored = _stored_ids(cluster.url, schema, "restarted")
        check_exactly_once(stored, acked)
        # The parent's store came back by itself, too.
        (entry,) = await agent.append(UserMessage.of("still here"))
        assert (await store.load_entries("restarted"))[-1].id == entry.id


async def test_s25_store_opened_while_the_server_is_down_works_once_it_is_up(
    cluster: PrivateCluster,
) -> None:
    cluster.stop("fast")
    store = PostgresStore(cluster.url, schema="tl_late", connect_timeout=1)
    try:
        for _ in range(2):  # each fails at once: nothing listens on the port
            with pytest.raises(StoreUnavailable):
                await durable.open(None, store=store, session_id="late")
        await asyncio.to_thread(cluster.start)
        agent = await durable.open(None, store=store, session_id="late")
        (entry,) = await agent.append(UserMessage.of("the server is back"))
        assert _stored_ids(cluster.url, "tl_late", "late") == [entry.id]
    finally:
        await store.close()


async def test_s26_watcher_resumes_across_a_server_restart(cluster: PrivateCluster) -> None:
    # While the server is down the watch raises StoreUnavailable; the watcher
    # resumes after the last id it got and ends with every entry once, in order.
    async with PostgresStore(cluster.url, schema="tl_watch", connect_timeout=1) as store:
        writer = await durable.open(None, store=store, session_id="w")
        received: list[str] = []
        interruptions = 0
        total = 60
        halfway = asyncio.Event()

        async def follow() -> None:
            nonlocal interruptions
            while len(received) < total:
                watch = store.watch("w", after=received[-1] if received else None)
                try:
                    async for entry in watch:
                        received.append(entry.id)
                        if len(received) == total // 2:
                            halfway.set()
                        if len(received) == total:
                            break
                except StoreUnavailable:
                    interruptions += 1
                    await asyncio.sleep(0.05)
                finally:
                    await watch.aclose()  # type: ignore[attr-defined]

        watcher = asyncio.ensure_future(follow())
        acked = [e.id for _ in range(30) for e in await writer.append(UserMessage.of("before"))]
        await halfway.wait()
        await asyncio.to_thread(cluster.stop, "fast")
        await asyncio.sleep(1.5)  # the watcher's next read (within 1 s) meets the outage
        await asyncio.to_thread(cluster.start)
        acked += [e.id for _ in range(30) for e in await writer.append(UserMessage.of("after"))]
        await asyncio.wait_for(watcher, 60)
        assert interruptions >= 1
        assert received == acked == _stored_ids(cluster.url, "tl_watch", "w")
