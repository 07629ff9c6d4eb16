"""Seeing what other writers appended: ``watch`` delivery and ``refresh``, per store.

- watch: a child process appends 500 entries one per call, 2 ms apart; the
  parent follows the session with ``watch()``. Delivery is from the start of
  an append (``time.monotonic``, one clock for every process) to the entry
  reaching the watcher, against the store's own append latency in the same
  run (an entry cannot arrive before it is stored). The file and SQLite
  stores poll (50 ms by default); PostgreSQL and the memory store (same
  process) are woken.
- refresh: an agent on a session of 10,000 entries catches up with one entry
  another agent appended, ``agent.refresh()`` against a new ``durable.open``
  of the session (reading it all); and ``append_linear`` against ``append``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from bench._harness import Run, alternate, pct, test_helper
from bench._targets import (
    FileStore,
    MemoryStore,
    MessageEntry,
    PostgresStore,
    SessionRecord,
    SQLiteStore,
    UserMessage,
    durable,
)

NEEDS = ()
MINUTES = 2


def _open(kind: str, target: str, schema: str, listen: str = "") -> Any:
    if kind == "file":
        return FileStore(target)
    if kind == "sqlite":
        return SQLiteStore(target)
    return PostgresStore(target, schema=schema, max_size=2, prepare_threshold=None,
                         listen_url=listen or target)


async def _append(store: Any, sid: str, count: int, pause: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    parent = None
    for n in range(count):
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"entry {n} " + "x" * 200))
        t0 = time.monotonic()
        await store.append_entries(sid, [entry])
        times[entry.id] = [t0, time.monotonic()]
        parent = entry.id
        await asyncio.sleep(pause)
    return times


def _child(job: dict[str, Any], out: Any) -> None:
    async def run() -> None:
        store = _open(job["kind"], job["target"], job["schema"], job["listen"])
        out.put(await _append(store, job["sid"], job["count"], job["pause"]))
        await store.close()

    asyncio.run(run())


async def _follow(store: Any, sid: str, count: int) -> dict[str, float]:
    seen: dict[str, float] = {}
    watch = store.watch(sid)
    async for entry in watch:
        seen[entry.id] = time.monotonic()
        if len(seen) == count:
            break
    await watch.aclose()
    return seen


async def delivery(kind: str, target: str, schema: str, listen: str, *, count: int,
                   pause: float) -> tuple[list[float], list[float]]:
    sid = f"watch-{secrets.token_hex(4)}"
    store = MemoryStore() if kind == "memory" else _open(kind, target, schema, listen)
    await store.create_session(SessionRecord(id=sid))
    watcher = asyncio.ensure_future(_follow(store, sid, count))
    if kind == "memory":
        times = await _append(store, sid, count, pause)
    else:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        job = {"kind": kind, "target": target, "schema": schema, "listen": listen, "sid": sid,
               "count": count, "pause": pause}
        proc = ctx.Process(target=_child, args=(job, out))
        proc.start()
        times = await asyncio.to_thread(out.get, True, 600)
        await asyncio.to_thread(proc.join)
    seen = await watcher
    if kind != "memory":
        await store.close()
    if list(seen) != list(times):
        raise RuntimeError(f"{kind}: watch skipped, repeated or reordered an entry")
    return ([seen[i] - t0 for i, (t0, _) in times.items()],
            [t1 - t0 for t0, t1 in times.values()])


def message(n: int) -> UserMessage:
    return UserMessage.of(f"turn {n}: " + "an ordinary sentence of conversation. " * 8)


async def refresh(run: Run, name: str, store: Any, other: Any, *, n: int, turns: int) -> None:
    sid = f"refresh-{name}"
    writer = await durable.open(None, store=store, session_id=sid)
    for start in range(0, n, 1000):
        await writer.append(*(message(i) for i in range(start, min(n, start + 1000))))
    reader = await durable.open(None, store=other, session_id=sid)
    counter = iter(range(n, 10**9))

    async def one_more(_: int) -> None:
        await writer.append(message(next(counter)))

    got = await alternate({
        "reopen": lambda: durable.open(None, store=other, session_id=sid),
        "refresh": reader.refresh,
    }, turns, before=one_more)
    run.row(f"{name}: catch up with one entry another agent appended, session of {n:,}",
            got.median("refresh") * 1e3, "ms",
            versus="durable.open of the session again (reads all of it)",
            versus_value=got.median("reopen") * 1e3, ratio=got.paired("refresh", "reopen"),
            detail=f"median of {turns} paired turns")
    got = await alternate({"linear": lambda: writer.append_linear(message(next(counter))),
                           "append": lambda: writer.append(message(next(counter)))}, turns)
    run.row(f"{name}: append_linear (checks the leaf in the same step)",
            got.median("linear") * 1e3, "ms", versus="append of the same message",
            versus_value=got.median("append") * 1e3, ratio=got.paired("linear", "append"),
            detail=f"median of {turns} paired turns")
    await store.close()
    await other.close()


def main(run: Run) -> None:
    count, pause = run.pick(500, 30), 0.002
    schema = f"tl_bench_watch_{secrets.token_hex(4)}"
    postgres = run.postgres()
    stores = [("memory", "", ""), ("file", str(run.tmp / "files"), ""),
              ("sqlite", str(run.tmp / "w.db"), "")]
    bouncer = None
    if postgres:
        stores.append(("postgres", run.pg_url, ""))
        if shutil.which("pgbouncer") is not None:
            bouncer = test_helper("pgbouncer").PgBouncer()
            bouncer.start()
            stores.append(("postgres via PgBouncer", bouncer.url, run.pg_url))
    try:
        for kind, target, listen in stores:
            run.say(f"watch, {kind}")
            seen, stored = asyncio.run(delivery(kind.split()[0], target, schema, listen,
                                                count=count, pause=pause))
            run.row(f"watch delivery p50, {kind}, another "
                    f"{'task' if kind == 'memory' else 'process'} appending",
                    pct(seen, 0.5) * 1e3, "ms", versus="the store's own append p50, same run",
                    versus_value=pct(stored, 0.5) * 1e3,
                    detail=f"{count} entries; p99 {pct(seen, 0.99) * 1e3:.1f} ms")
        n, turns = run.pick(10_000, 500), run.pick(41, 3)
        root = run.tmp / "refresh"
        asyncio.run(refresh(run, "file store", FileStore(root), FileStore(root), n=n,
                              turns=turns))
        db = Path(run.tmp / "refresh.db")
        asyncio.run(refresh(run, "SQLite store", SQLiteStore(db), SQLiteStore(db), n=n,
                              turns=turns))
        if postgres:
            asyncio.run(refresh(run, "PostgreSQL store", PostgresStore(run.pg_url, schema=schema),
                                PostgresStore(run.pg_url, schema=schema), n=n, turns=turns))
    finally:
        if bouncer is not None:
            bouncer.close()
        if postgres:
            from bench.disk import drop_schema

            drop_schema(run.pg_url, schema)
