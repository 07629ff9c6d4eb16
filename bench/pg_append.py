"""One process, one session: a PostgresStore append against the bare INSERT, finely alternated.

``bench/sql_stores.py``'s one-process table alternates 20 blocks of 25
appends; on a machine shared with other work its ratios move by 2x from one
block to the next. This one alternates many short blocks (default 200 rounds
of 10), so a change in load hits every write alike, and reports per write
the median wall time and the process's CPU time (``time.process_time``:
what the client itself spends, which load moves far less), and the median
of the paired wall ratios:

- ``floor``: the bare single-row INSERT of the store's row into a table built
  like ``entries``, on a blocking psycopg connection in autocommit (the
  floor of ``bench/sql_stores.py``);
- ``floor async``: the same INSERT on a psycopg ``AsyncConnection``;
- ``store``: ``PostgresStore.append_entries`` of one entry (made before the
  clock starts), on the store's own pool;
- ``before``, with ``--before PATH``: the same with the ``_postgres.py`` at
  PATH loaded beside this one (for example main's, from ``git show
  main:src/threadline/session/_postgres.py``), an A/B in one process.

``--no-flush`` sets ``synchronous_commit=off`` for every connection, so the
WAL flush, the same for all, drops out and the clients' own cost shows.

    .venv/bin/python bench/pg_append.py [--before /tmp/main_postgres.py] [--no-flush]

Writes ``bench/results/pg_append.json``. Needs the PostgreSQL server of
``THREADLINE_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test);
it works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from sql_stores import PG_URL, _async_floor, _entry, _floor_op, _prepare_floor

from threadline.session import MessageEntry, PostgresStore, SessionRecord
from threadline.session._codec import encode_entry

RESULTS = Path(__file__).parent / "results" / "pg_append.json"


def _store_class(path: str | None) -> Any:
    """``PostgresStore`` from the ``_postgres.py`` at ``path``, loaded as a module of its own."""
    if path is None:
        return PostgresStore
    spec = importlib.util.spec_from_file_location("threadline.session._postgres_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PostgresStore


Write = Callable[[], Awaitable[None]]


class _Appends:
    """Each store's appends to a session of its own, one entry at a time, from
    entries made before the clock starts (the caller's work)."""

    def __init__(self, stores: dict[str, Any]) -> None:
        self.stores = stores
        self.pending: dict[str, list[MessageEntry]] = {name: [] for name in stores}
        self.parents: dict[str, str | None] = dict.fromkeys(stores)

    def make(self, name: str, count: int) -> None:
        chain = []
        for _ in range(count):
            chain.append(_entry(self.parents[name], 0, 0))
            self.parents[name] = chain[-1].id
        self.pending[name] = chain[::-1]

    def write(self, name: str) -> Write:
        async def append() -> None:
            await self.stores[name].append_entries(name, [self.pending[name].pop()])
        return append


async def _alternate(writes: dict[str, Write], appends: _Appends, rounds: int,
                     block: int) -> dict[str, Any]:
    wall: dict[str, list[float]] = {name: [] for name in writes}
    cpu: dict[str, list[float]] = {name: [] for name in writes}
    for r in range(rounds):
        for name in (list(writes) if r % 2 == 0 else list(writes)[::-1]):
            if name in appends.stores:
                appends.make(name, block)
            write = writes[name]
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(block):
                await write()
            cpu[name].append((time.process_time() - c0) / block * 1e6)
            wall[name].append((time.perf_counter() - w0) / block * 1e6)
    return {name: {"wall_us": statistics.median(wall[name]),
                   "cpu_us": statistics.median(cpu[name]),
                   "rate_vs_floor": statistics.median(
                       [f / w for f, w in zip(wall["floor"], wall[name], strict=True)])}
            for name in writes}


async def run(url: str, schema: str, rounds: int, block: int,
              before: str | None) -> dict[str, Any]:
    _prepare_floor("postgres", url, schema)
    floor_sid = "w0-s999"
    blocking = _floor_op("postgres", url, schema, [floor_sid], encode_entry(_entry(None, 0, 0)))
    async_floor = await _async_floor(url, schema)
    stores = {"store": PostgresStore(url, schema=schema, min_size=1, max_size=1)}
    if before is not None:
        stores["before"] = _store_class(before)(url, schema=schema, min_size=1, max_size=1)
    for name, store in stores.items():
        await store.create_session(SessionRecord(id=name))
    appends = _Appends(stores)
    n = [20_000_000]

    async def floor() -> None:
        n[0] += 1
        blocking(floor_sid, n[0])

    async def floor_async() -> None:
        n[0] += 1
        await async_floor(floor_sid, n[0])

    writes = {"floor": floor, "floor async": floor_async,
              **{name: appends.write(name) for name in stores}}
    await _alternate(writes, appends, 1, 10)  # past the prepare thresholds and first calls
    try:
        return await _alternate(writes, appends, rounds, block)
    finally:
        for store in stores.values():
            await store.close()
        await async_floor.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--before", help="a _postgres.py to measure beside this one")
    ap.add_argument("--no-flush", action="store_true",
                    help="synchronous_commit=off for every connection")
    ap.add_argument("--schema-prefix", default="tl_bench_append")
    args = ap.parse_args()
    if args.no_flush:  # libpq reads it for every connection this process makes
        os.environ["PGOPTIONS"] = (os.environ.get("PGOPTIONS", "")
                                   + " -c synchronous_commit=off").strip()
    schema = f"{args.schema_prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        server = conn.info.server_version
    load = os.getloadavg()
    try:
        writes = asyncio.run(run(PG_URL, schema, args.rounds, args.block, args.before))
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    results = {"rounds": args.rounds, "block": args.block, "flush": not args.no_flush,
               "before": args.before, "load_before": load, "load_after": os.getloadavg(),
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "postgres": server},
               "writes": writes}
    print(f"one process, one session, {args.rounds} rounds of {args.block} "
          f"({'no flush' if args.no_flush else 'with the flush'}), load "
          f"{load[0]:.1f} -> {results['load_after'][0]:.1f}")
    print(f"{'write':12} {'wall us':>8} {'cpu us':>7} {'rate vs floor':>14}")
    for name, w in writes.items():
        print(f"{name:12} {w['wall_us']:>8.0f} {w['cpu_us']:>7.1f} {w['rate_vs_floor']:>14.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
