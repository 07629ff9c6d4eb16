"""One owner's conversations, newest activity first, among many sessions (S62).

N sessions (100,000; 2,000 with ``--quick``) spread over N / 100 owners,
each with a metadata change (owner, title) and two messages. The call is
``list_sessions(owner=U, order="activity", limit=20)``, for a different
owner each turn:

- SQLite and PostgreSQL: against the bare indexed query of the same rows
  (``WHERE owner = ? ORDER BY last_activity DESC, id DESC LIMIT 21``) on a
  plain connection to the same database, the floor of any SQL listing
  (goal 2x on PostgreSQL; SQLite's row shows the store's thread hop).
- File store, a handle whose derived catalog is built: against a scan floor,
  ``os.scandir`` of the folder plus one ``stat`` of each file, which any
  listing that must notice another process's appends has to do (goal 3x).
  A new handle's first listing (it reads every log) is shown beside, no goal.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from bench._harness import Run, alternate, at_most, ms
from bench._targets import FileStore, PostgresStore, SessionRecord, SQLiteStore, Store
from bench._workloads import chain
from threadline.stores import set_metadata

NEEDS = ()
MINUTES = 3
PAGE = 20


def _owner(i: int, owners: int) -> str:
    return f"user-{i % owners:05d}"


async def _fill(store: Store, n: int) -> None:
    owners = max(1, n // 100)
    for start in range(0, n, 250):
        ids = [f"s-{i:07d}" for i in range(start, min(n, start + 250))]
        await asyncio.gather(*(store.create_session(SessionRecord(id=i)) for i in ids))
        await asyncio.gather(*(set_metadata(store, i, owner=_owner(k, owners),
                                            title=f"conversation {k}")
                               for k, i in zip(range(start, start + 250), ids, strict=False)))
        await asyncio.gather(*(store.append_entries(i, chain(2)) for i in ids))


def _turn_owner(n: int) -> Any:
    owners = max(1, n // 100)
    state = {"k": 0}

    def next_owner() -> str:
        state["k"] += 7919
        return _owner(state["k"], owners)

    return next_owner


def _listing(store: Any, owner: Any) -> Any:
    async def call() -> None:
        page = await store.list_sessions(owner=owner(), order="activity", limit=PAGE)
        assert len(page.sessions) == PAGE
    return call


def sqlite_rows(run: Run, n: int, turns: int) -> None:
    path = run.tmp / "catalog.db"

    async def go() -> None:
        store = SQLiteStore(path, synchronous="NORMAL")
        await _fill(store, n)
        conn = sqlite3.connect(path)
        bare_owner = _turn_owner(n)

        async def bare() -> None:
            rows = conn.execute(
                "SELECT id, parent_id, created_at, last_activity, title, owner, tenant, labels "
                "FROM sessions WHERE owner = ? ORDER BY last_activity DESC, id DESC LIMIT ?",
                (bare_owner(), PAGE + 1)).fetchall()
            assert len(rows) == PAGE + 1

        got = await alternate({"floor": bare, "store": _listing(store, _turn_owner(n))},
                              turns, block=20)
        conn.close()
        await store.close()
        run.row(f"SQLite, {n:,} sessions: one owner's first page ({PAGE}), newest activity",
                ms(got.median("store")), "ms",
                versus="the bare indexed query, sqlite3 on the same file",
                versus_value=ms(got.median("floor")), ratio=got.paired("store", "floor"),
                detail=f"median of {turns} paired turns of 20 calls; the floor runs on the "
                       f"event loop, the store on its worker thread, whose hop is most of "
                       f"the difference")

    asyncio.run(go())


def postgres_rows(run: Run, n: int, turns: int) -> None:
    import psycopg

    schema = f"tl_bench_catalog_{secrets.token_hex(4)}"

    async def go() -> None:
        store = PostgresStore(run.pg_url, schema=schema, max_size=4)
        await _fill(store, n)
        conn = await psycopg.AsyncConnection.connect(run.pg_url, autocommit=True)
        query = (f'SELECT session_id, parent_id, created_at, last_activity, title, owner, '
                 f'tenant, labels::text FROM "{schema}".sessions WHERE owner = %s '
                 f"ORDER BY last_activity DESC, session_id DESC LIMIT %s")
        bare_owner = _turn_owner(n)

        async def bare() -> None:
            cur = await conn.execute(query, (bare_owner(), PAGE + 1))
            assert len(await cur.fetchall()) == PAGE + 1

        got = await alternate({"floor": bare, "store": _listing(store, _turn_owner(n))},
                              turns, block=20)
        await conn.close()
        await store.close()
        run.row(f"PostgreSQL, {n:,} sessions: one owner's first page ({PAGE}), newest "
                f"activity", ms(got.median("store")), "ms",
                versus="the bare indexed query, psycopg on the same schema",
                versus_value=ms(got.median("floor")), ratio=got.paired("store", "floor"),
                goal=at_most(2.0), detail=f"median of {turns} paired turns of 20 calls")

    try:
        asyncio.run(go())
    finally:
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)


def _stat_scan(root: Path) -> int:
    found = 0
    with os.scandir(root) as it:
        for item in it:
            if item.name.endswith(".jsonl"):
                found += os.stat(item.path, follow_symlinks=False).st_size > 0
    return found


def file_rows(run: Run, n: int, turns: int) -> None:
    root = run.tmp / "catalog-files"

    async def go() -> None:
        filler = FileStore(root, durability="flush")
        await _fill(filler, n)
        await filler.close()
        store = FileStore(root)
        await store.list_sessions(owner="nobody", order="activity")  # builds the catalog

        async def floor() -> None:
            assert await asyncio.to_thread(_stat_scan, root) == n

        async def cold() -> None:
            fresh = FileStore(root)
            page = await fresh.list_sessions(owner=_owner(3, max(1, n // 100)),
                                             order="activity", limit=PAGE)
            assert len(page.sessions) == PAGE

        got = await alternate({"floor": floor, "store": _listing(store, _turn_owner(n))},
                              turns)
        cold_got = await alternate({"floor": floor, "cold": cold}, max(1, turns // 4))
        await store.close()
        floor_text = "os.scandir of the folder + one stat of each file"
        run.row(f"file store, {n:,} sessions: one owner's first page ({PAGE}), newest "
                f"activity", ms(got.median("store")), "ms", versus=floor_text,
                versus_value=ms(got.median("floor")), ratio=got.paired("store", "floor"),
                goal=at_most(3.0), detail=f"a handle whose catalog is built; median of "
                                          f"{turns} paired turns")
        run.row(f"file store, {n:,} sessions: the same page from a new handle",
                ms(cold_got.median("cold")), "ms", versus=floor_text,
                versus_value=ms(cold_got.median("floor")),
                ratio=cold_got.paired("cold", "floor"),
                detail="the catalog is rebuilt from every log (S63)")

    asyncio.run(go())


def main(run: Run) -> None:
    n = run.pick(100_000, 2_000)
    turns = run.pick(15, 3)
    run.say("SQLite")
    sqlite_rows(run, n, turns)
    if run.postgres():
        run.say("PostgreSQL")
        postgres_rows(run, n, turns)
    run.say("file store")
    file_rows(run, n, turns)
