"""Catching up with other writers: ``refresh`` against a full reopen, same run.

    .venv/bin/python bench/refresh.py            # 10,000-entry session
    .venv/bin/python bench/refresh.py --quick    # 1,000 entries, for a smoke test

For each store (file, SQLite, and PostgreSQL when it is reachable): a session
of N realistic messages; another agent appends one message; then

- reopen: ``durable.open`` of the session (reads and decodes the whole log),
  the only way to see the new entry before ``refresh`` existed;
- refresh: ``agent.refresh()`` on an agent that has the first N entries
  (reads only what came after its last entry).

Only the read is timed; the other agent's append before each one is not.

And the write side: ``append_linear`` (which reads the last entry in the same
atomic step and then refreshes) against a plain ``append`` of the same
message. Prints a table of medians and ratios and writes
bench/results/refresh.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from threadline import durable
from threadline.ai import UserMessage
from threadline.session import FileStore, SQLiteStore, Store

RESULTS = Path(__file__).resolve().parent / "results" / "refresh.json"
PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def message(n: int) -> UserMessage:
    return UserMessage.of(f"turn {n}: " + "an ordinary sentence of conversation. " * 8)


async def median_ms(op: Callable[[], Awaitable[Any]], repeat: int,
                    before: Callable[[], Awaitable[Any]] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            await before()  # not timed
        start = time.perf_counter()
        await op()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure(name: str, store: Store, other: Store, n: int, repeat: int) -> dict[str, Any]:
    writer = await durable.open(None, store=store, session_id=f"bench-{name}")
    for start in range(0, n, 1000):
        await writer.append(*(message(i) for i in range(start, min(n, start + 1000))))
    reader = await durable.open(None, store=other, session_id=f"bench-{name}")
    counter = iter(range(n, n + 10 * repeat))

    async def append_one() -> None:
        await writer.append(message(next(counter)))

    async def reopen() -> None:
        await durable.open(None, store=other, session_id=f"bench-{name}")

    base = await median_ms(append_one, repeat)
    row = {
        "store": name, "entries": n,
        "append_ms": base,
        "reopen_ms": await median_ms(reopen, repeat, append_one),
        "refresh_ms": await median_ms(reader.refresh, repeat, append_one),
        "append_linear_ms": await median_ms(
            lambda: writer.append_linear(message(next(counter))), repeat),
    }
    row["reopen_over_refresh"] = row["reopen_ms"] / row["refresh_ms"]
    row["linear_over_append"] = row["append_linear_ms"] / base
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, repeat = (1_000, 5) if args.quick else (10_000, 41)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(await measure("file", FileStore(Path(tmp) / "f"), FileStore(Path(tmp) / "f"),
                                  n, repeat))
        db = Path(tmp) / "s.db"
        rows.append(await measure("sqlite", SQLiteStore(db), SQLiteStore(db), n, repeat))
        try:
            import psycopg

            psycopg.connect(PG_URL, connect_timeout=3).close()
        except Exception as exc:
            print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
        else:
            from threadline.session import PostgresStore

            schema = f"bench_refresh_{os.getpid()}"
            a, b = PostgresStore(PG_URL, schema=schema), PostgresStore(PG_URL, schema=schema)
            try:
                rows.append(await measure("postgres", a, b, n, repeat))
            finally:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                await a.close()
                await b.close()
    print(f"{'store':<10}{'entries':>8}{'reopen ms':>11}{'refresh ms':>12}{'reopen/refresh':>16}"
          f"{'append ms':>11}{'linear ms':>11}{'linear/append':>15}")
    for r in rows:
        print(f"{r['store']:<10}{r['entries']:>8}{r['reopen_ms']:>11.2f}{r['refresh_ms']:>12.3f}"
              f"{r['reopen_over_refresh']:>15.0f}x{r['append_ms']:>11.3f}"
              f"{r['append_linear_ms']:>11.3f}{r['linear_over_append']:>14.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "quick": args.quick, "rows": rows,
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())
