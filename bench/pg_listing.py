"""PostgresStore.list_sessions at 100,000 sessions, with and without its index.

    .venv/bin/python bench/pg_listing.py [--sessions 100000]

Every figure is a ratio to a floor measured in the same run: ``load_session``
of one session, a primary-key lookup through the same store, pool and
connection (one round trip, one index probe). Measured on the store as it
is (migration 2 adds ``sessions_newest``) and, in a second schema with the
same rows, without that index (what migration 1 alone gave). Rows are
inserted with ``generate_series``, then ``ANALYZE``.

- first page: ``list_sessions(limit=50)``;
- deep page: the page after a cursor half way through the table;
- all pages: every page of 50 (2,000 pages at 100,000 sessions), the mean
  per page, against the mean of as many ``load_session`` calls in a row.

Writes ``bench/results/pg_listing.json``. Needs the PostgreSQL server of
``THREADLINE_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test);
it works in two scratch schemas that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from threadline.session import PostgresStore, SessionRecord
from threadline.session._store import encode_cursor

RESULTS = Path(__file__).parent / "results" / "pg_listing.json"
URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def fill(schema: str, n: int, *, drop_index: bool) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        ident = sql.Identifier(schema)
        conn.execute(sql.SQL(
            "INSERT INTO {}.sessions (session_id, parent_id, created_at) "
            "SELECT 'session-' || lpad(g::text, 7, '0'), "
            "CASE WHEN g %% 3 = 0 THEN 'parent-' || g END, "
            "timestamptz '2025-01-01' + g * interval '1 second' + (g %% 7) * interval '1 us' "
            "FROM generate_series(1, %s) g").format(ident), (n,))
        if drop_index:
            conn.execute(sql.SQL("DROP INDEX {}.sessions_newest").format(ident))
        conn.execute(sql.SQL("ANALYZE {}.sessions").format(ident))


async def best(fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - started)
    return min(times)


async def measure(store: PostgresStore, n: int, repeats: int) -> dict[str, float]:
    middle = SessionRecord(id=f"session-{n // 2:07d}", created_at=(
        await store.load_session(f"session-{n // 2:07d}")).created_at)
    cursor = encode_cursor(middle)

    async def all_pages() -> None:
        page = await store.list_sessions(limit=50)
        while page.next_cursor is not None:
            page = await store.list_sessions(limit=50, cursor=page.next_cursor)

    floor = await best(lambda: store.load_session(f"session-{n // 3:07d}"), repeats * 10)
    first = await best(lambda: store.list_sessions(limit=50), repeats * 10)
    deep = await best(lambda: store.list_sessions(limit=50, cursor=cursor), repeats * 10)
    pages = await best(all_pages, 1) / (n / 50)

    async def many_lookups() -> None:
        for k in range(n // 50):
            await store.load_session(f"session-{k * 50 + 1:07d}")

    # A mean against a mean: the walk is timed once, so its floor is too.
    floor_mean = await best(many_lookups, 1) / (n // 50)
    return {"floor_ms": floor * 1e3, "first_page_ms": first * 1e3,
            "first_page_ratio": first / floor, "deep_page_ms": deep * 1e3,
            "deep_page_ratio": deep / floor, "floor_mean_ms": floor_mean * 1e3,
            "per_page_of_all_ms": pages * 1e3, "per_page_of_all_ratio": pages / floor_mean}


async def run(n: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {"sessions": n}
    for label, drop in (("with_index", False), ("without_index", True)):
        schema = f"tl_bench_{secrets.token_hex(4)}"
        store = PostgresStore(URL, schema=schema, max_size=2)
        try:
            await store.create_session(SessionRecord(id="warm-up"))
            fill(schema, n, drop_index=drop)
            results[label] = await measure(store, n, repeats)
        finally:
            await store.close()
            with psycopg.connect(URL, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = asyncio.run(run(args.sessions, args.repeats))
    machine = {"python": sys.version.split()[0], "platform": platform.platform(),
               "cpu_count": os.cpu_count()}
    print(f"PostgresStore.list_sessions, {results['sessions']:,} sessions "
          f"(floor: load_session of one session)\n")
    print(f"{'':28} {'with index':>22} {'without index':>22}")
    w, wo = results["with_index"], results["without_index"]
    print(f"{'floor (load_session)':28} {w['floor_ms']:12.3f} ms {'':8} "
          f"{wo['floor_ms']:12.3f} ms")
    for key, label in (("first_page", "first page (limit 50)"),
                       ("deep_page", "page after mid cursor"),
                       ("per_page_of_all", "each page of all pages")):
        print(f"{label:28} {w[key + '_ms']:9.3f} ms {w[key + '_ratio']:7.1f}x "
              f"{wo[key + '_ms']:12.3f} ms {wo[key + '_ratio']:7.1f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, **results}, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
