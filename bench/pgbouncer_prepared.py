"""Appends through PgBouncer 1.21+, with prepared statements kept (S49) and without.

PgBouncer before 1.21 cannot run a named prepared statement in transaction
pooling, so a store behind it needs ``prepare_threshold=None``: every append
is then parsed and planned by the server again. From 1.21, with
``max_prepared_statements`` set, PgBouncer prepares a client's statements on
the server connection it hands the client, and the store can keep its
default threshold. This measures what that saves, through one PgBouncer
(transaction pooling, 3 server connections, ``max_prepared_statements=200``):

- ``kept``: ``PostgresStore`` with its default ``prepare_threshold``;
- ``parsed``: the same with ``prepare_threshold=None``, the floor here (the
  only setting that works through PgBouncer 1.18);
- ``direct``: the default store straight to PostgreSQL, for reference.

In alternating blocks, each with its own sessions: one task appending one
entry at a time, and 8 tasks appending at once (each to its own session).
Reported: the median wall time of an append, the appends per second of the
8 tasks, and the server's CPU per append (every ``postgres`` process's user +
system time from ``/proc``, before and after each block, summed over the
blocks: the parse and plan a kept statement saves is server work). Each is a
ratio to ``parsed``.

    .venv/bin/python bench/pgbouncer_prepared.py [--blocks 30] [--block 20]

Needs the PostgreSQL server of ``THREADLINE_TEST_PG_URL`` (default
postgresql://postgres@127.0.0.1:5432/test) and a ``pgbouncer`` of 1.21 or
later (``.ci/run`` builds 1.24 into /opt); works in a scratch schema dropped
afterwards. Writes ``bench/results/pgbouncer_prepared.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, PostgresStore, SessionRecord

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "pgbouncer_prepared.json"
TEXT = "An ordinary chat message of about the length people type, give or take. " * 3
_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu() -> dict[int, int]:
    """User + system CPU of each ``postgres`` process on this machine, in clock ticks."""
    ticks: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended since the listing
        name_end = stat.rfind(b")")
        if stat[stat.find(b"(") + 1:name_end] != b"postgres":
            continue
        fields = stat[name_end + 2:].split()
        ticks[int(pid)] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def _spent_s(before: dict[int, int]) -> float:
    """The server's CPU since ``before``, in seconds (a process that ended meanwhile
    takes its share with it; one that started counts whole)."""
    after = _server_cpu()
    return sum(t - before.get(pid, 0) for pid, t in after.items()) / _TICK


class _Variant:
    def __init__(self, name: str, store: PostgresStore) -> None:
        self.name = name
        self.store = store
        self.parents: dict[str, str | None] = {}
        self.one_s: list[float] = []
        self.eight_rates: list[float] = []
        self.cpu_one: list[float] = []
        self.cpu_eight: list[float] = []

    async def append(self, sid: str) -> float:
        entry = MessageEntry(parent_id=self.parents.get(sid), message=UserMessage.of(TEXT))
        started = time.perf_counter()
        await self.store.append_entries(sid, [entry])
        took = time.perf_counter() - started
        self.parents[sid] = entry.id
        return took

    async def sessions(self, count: int) -> None:
        for n in range(count):
            await self.store.create_session(SessionRecord(id=f"{self.name}-{n}"))

    async def one_block(self, size: int) -> None:
        cpu = _server_cpu()
        for _ in range(size):
            self.one_s.append(await self.append(f"{self.name}-0"))
        self.cpu_one.append(_spent_s(cpu))

    async def eight_block(self, size: int) -> None:
        async def task(n: int) -> None:
            for _ in range(size):
                await self.append(f"{self.name}-{n}")

        cpu = _server_cpu()
        started = time.perf_counter()
        await asyncio.gather(*(task(n) for n in range(8)))
        took = time.perf_counter() - started
        self.eight_rates.append(8 * size / took)
        self.cpu_eight.append(_spent_s(cpu))


async def _measure(bouncer_url: str, schema: str, blocks: int, size: int) -> list[_Variant]:
    variants = [
        _Variant("parsed", PostgresStore(bouncer_url, schema=schema, prepare_threshold=None,
                                         max_size=8)),
        _Variant("kept", PostgresStore(bouncer_url, schema=schema, max_size=8)),
        _Variant("direct", PostgresStore(PG_URL, schema=schema, max_size=8)),
    ]
    try:
        for v in variants:
            await v.sessions(8)
            for _ in range(10):  # past the threshold: the kept store's statements are prepared
                await v.one_block(1)
                await v.eight_block(1)
            v.one_s.clear()
            v.eight_rates.clear()
            v.cpu_one.clear()
            v.cpu_eight.clear()
        for k in range(blocks):
            order = variants[k % 3:] + variants[:k % 3]  # each goes first in turn
            for v in order:
                await v.one_block(size)
            for v in order:
                await v.eight_block(size)
    finally:
        for v in variants:
            await v.store.close()
    return variants


def _per_append(cpu: list[float], appends: int) -> float:
    # Summed over every block: /proc counts in clock ticks (10 ms), more
    # than a block's worth of one task's appends.
    return sum(cpu) / appends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block", type=int, default=20, help="appends per task per block")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pgbouncer import PgBouncer, pgbouncer_version, prepared_pgbouncer

    binary = prepared_pgbouncer()
    if binary is None:
        raise SystemExit("needs pgbouncer 1.21 or later (.ci/run builds 1.24 into /opt)")
    parts = urlsplit(PG_URL)
    bouncer = PgBouncer(server_host=parts.hostname or "127.0.0.1", server_port=parts.port or 5432,
                        dbname=parts.path.lstrip("/") or "test",
                        user=parts.username or "postgres", pool_size=3, binary=binary,
                        max_prepared_statements=200)
    schema = f"tl_bench_pgb_{secrets.token_hex(4)}"
    bouncer.start()
    try:
        variants = asyncio.run(_measure(bouncer.url, schema, args.blocks, args.block))
    finally:
        bouncer.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    floor = variants[0]
    base = {
        "one": statistics.median(floor.one_s),
        "eight": statistics.median(floor.eight_rates),
        "cpu_one": _per_append(floor.cpu_one, len(floor.one_s)),
        "cpu_eight": _per_append(floor.cpu_eight, 8 * args.block * args.blocks),
    }
    rows: dict[str, Any] = {}
    version = ".".join(map(str, pgbouncer_version(binary)))
    print(f"PgBouncer {version}, transaction pooling, 3 server connections; "
          f"{args.blocks} blocks of {args.block} appends per task; ratios to 'parsed'")
    print(f"{'store':<8} {'1 task p50 us':>14} {'x':>6} {'server cpu us':>14} {'x':>6} "
          f"{'8 tasks /s':>11} {'x':>6} {'server cpu us':>14} {'x':>6}")
    for v in variants:
        one = statistics.median(v.one_s)
        eight = statistics.median(v.eight_rates)
        cpu_one = _per_append(v.cpu_one, len(v.one_s))
        cpu_eight = _per_append(v.cpu_eight, 8 * args.block * args.blocks)
        rows[v.name] = {
            "one_task_p50_us": one * 1e6, "one_task_ratio": one / base["one"],
            "one_task_server_cpu_us": cpu_one * 1e6,
            "one_task_server_cpu_ratio": cpu_one / base["cpu_one"],
            "eight_tasks_per_s": eight, "eight_tasks_rate_ratio": eight / base["eight"],
            "eight_tasks_server_cpu_us": cpu_eight * 1e6,
            "eight_tasks_server_cpu_ratio": cpu_eight / base["cpu_eight"],
        }
        r = rows[v.name]
        print(f"{v.name:<8} {r['one_task_p50_us']:14.0f} {r['one_task_ratio']:6.2f} "
              f"{r['one_task_server_cpu_us']:14.0f} {r['one_task_server_cpu_ratio']:6.2f} "
              f"{eight:11.0f} {r['eight_tasks_rate_ratio']:6.2f} "
              f"{r['eight_tasks_server_cpu_us']:14.0f} {r['eight_tasks_server_cpu_ratio']:6.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "pgbouncer": version, "blocks": args.blocks, "block": args.block, "stores": rows,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load": os.getloadavg()},
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
