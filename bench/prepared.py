"""PostgreSQL behind PgBouncer 1.21+: the store's prepared statements kept, against parsing each.

Through one PgBouncer (transaction pooling, 3 server connections,
``max_prepared_statements=200``), in turns, each variant on sessions of its own:

- kept: ``PostgresStore`` with its default ``prepare_threshold``;
- parsed: the same with ``prepare_threshold=None`` (the floor: the only
  setting that works through PgBouncer before 1.21, where the server parses
  and plans every append).

One task appending one entry at a time, and 8 tasks at once on their own
sessions. Also the server's CPU per append: every ``postgres`` process's
user + system time from ``/proc`` around each block.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from urllib.parse import urlsplit

from bench._harness import Measured, Run, alternate, median, test_helper
from bench._targets import PostgresStore, SessionRecord
from bench._workloads import chat

NEEDS = ("postgres", "pgbouncer")
MINUTES = 2
_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu() -> int:
    """User + system CPU of every ``postgres`` process on this machine, in clock ticks."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        end = stat.rfind(b")")
        if stat[stat.find(b"(") + 1:end] == b"postgres":
            fields = stat[end + 2:].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks


class _Variant:
    def __init__(self, name: str, store: PostgresStore) -> None:
        self.name, self.store = name, store
        self.parents: dict[str, str | None] = {}

    async def _append(self, sid: str, count: int) -> None:
        for _ in range(count):
            entry = chat(self.parents.get(sid))
            await self.store.append_entries(sid, [entry])
            self.parents[sid] = entry.id

    async def block(self, tasks: int, size: int) -> Measured:
        cpu = _server_cpu()
        t0 = time.perf_counter()
        await asyncio.gather(*(self._append(f"{self.name}-{t}", size) for t in range(tasks)))
        wall = time.perf_counter() - t0
        # Per append; /proc counts in ticks of 10 ms, so the median of many blocks.
        return Measured(wall / (tasks * size), (_server_cpu() - cpu) / _TICK / (tasks * size))


def main(run: Run) -> None:
    pgbouncer = test_helper("pgbouncer")
    binary = pgbouncer.prepared_pgbouncer()
    if binary is None:
        raise RuntimeError("needs pgbouncer 1.21 or later (.ci/run builds 1.24 into /opt)")
    run.uses("pgbouncer", ".".join(map(str, pgbouncer.pgbouncer_version(binary))))
    parts = urlsplit(run.pg_url)
    bouncer = pgbouncer.PgBouncer(server_host=parts.hostname or "127.0.0.1",
                                  server_port=parts.port or 5432,
                                  dbname=parts.path.lstrip("/") or "test",
                                  user=parts.username or "postgres", pool_size=3,
                                  binary=binary, max_prepared_statements=200)
    schema = f"tl_bench_pgb_{secrets.token_hex(4)}"
    turns, size = run.pick(30, 2), run.pick(20, 3)
    bouncer.start()

    async def go() -> None:
        variants = [_Variant("parsed", PostgresStore(bouncer.url, schema=schema,
                                                     prepare_threshold=None, max_size=8)),
                    _Variant("kept", PostgresStore(bouncer.url, schema=schema, max_size=8))]
        for v in variants:
            for t in range(8):
                await v.store.create_session(SessionRecord(id=f"{v.name}-{t}"))
            for _ in range(10):  # past the threshold: the kept store's statements are prepared
                await v.block(8, 1)
        for tasks in (1, 8):
            got = await alternate({v.name: lambda v=v, t=tasks: v.block(t, size)  # type: ignore[misc]
                                   for v in variants}, turns)
            what = "one task appending" if tasks == 1 else "8 tasks appending at once"
            versus = "the same store with prepare_threshold=None, same PgBouncer"
            detail = f"median of {turns} blocks of {size} appends per task, in turns"
            run.row(f"through PgBouncer, statements kept, {what}: time per append",
                    got.median("kept") * 1e6, "µs", versus=versus,
                    versus_value=got.median("parsed") * 1e6,
                    ratio=got.paired("kept", "parsed"), detail=detail)
            cpu_kept, cpu_parsed = sum(got.cpu["kept"]), sum(got.cpu["parsed"])
            if cpu_parsed:
                run.row(f"through PgBouncer, statements kept, {what}: server CPU per append",
                        median(got.cpu["kept"]) * 1e6, "µs", versus=versus,
                        versus_value=median(got.cpu["parsed"]) * 1e6,
                        ratio=cpu_kept / cpu_parsed, detail="ratio of the sums over blocks")
        for v in variants:
            await v.store.close()

    try:
        asyncio.run(go())
    finally:
        bouncer.close()
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)
