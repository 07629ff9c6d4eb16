"""One append at a time, and many at once, against the bare durable write of each store.

- File store (fsync): ``append_entries`` of one realistic entry to a session
  of N=100 and N=10,000 entries, against ``os.write`` + ``os.fdatasync`` of
  the same bytes to a copy of the same file, and that write on a worker
  thread (the least an append that keeps its sync off the event loop pays).
  The three in turns, sample by sample. Goal: p50 at most 1.5x the floor.
- Group commit: 8 tasks of one file store append 50 entries each to one
  session, against the same 400 lines written one write + fdatasync at a
  time; each run next to its own floor. Goal: at least 2x the floor's rate
  in every run (the lowest run is the row).
- SQLite, one process, one session, per ``synchronous`` setting: the store's
  appends against a bare BEGIN IMMEDIATE + INSERT + COMMIT with the same
  setting, in alternating blocks; 8 tasks of one process, each on its own
  session, against as many bare commits in a row.
- PostgreSQL, one process, one session (when the server is reachable): the
  store's appends against a bare INSERT in autocommit, blocking and on an
  ``AsyncConnection``, in alternating blocks.

Rates are appends per second; their ratios are the median of the paired blocks.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from pathlib import Path

from bench._floors import (
    FsyncFile,
    PostgresInsert,
    SQLiteInsert,
    ThreadedFsync,
    fsync_serial,
    postgres_floor_table,
)
from bench._harness import Run, alternate, at_least, at_most, ms
from bench._targets import (
    FileStore,
    MessageEntry,
    PostgresStore,
    SessionRecord,
    SQLiteStore,
    encode_entry,
)
from bench._workloads import chat, realistic

NEEDS = ()
MINUTES = 2
FLOOR = "write + fdatasync of the same bytes"


def file_append(run: Run, preload: int, samples: int) -> None:
    root = run.tmp / f"n{preload}"
    store = FileStore(root)
    sid = f"append-{preload}"
    existing = realistic(preload, seed=preload)
    new = realistic(samples + 1, seed=99)
    state: dict[str, object] = {"parent": existing[-1].id}

    async def go() -> None:
        await store.create_session(SessionRecord(id=sid))
        for start in range(0, preload, 5000):
            await store.append_entries(sid, existing[start:start + 5000])
        path = root / f"{sid}.jsonl"
        floor = FsyncFile(run.tmp / f"floor-{preload}", like=path)
        threaded = ThreadedFsync(run.tmp / f"threaded-{preload}", like=path)

        def before(k: int) -> None:
            entry = MessageEntry(parent_id=state["parent"], message=new[k + 1].message)
            state["parent"] = entry.id
            state["entry"], state["line"] = entry, encode_entry(entry) + b"\n"

        async def append() -> None:
            await store.append_entries(sid, [state["entry"]])  # type: ignore[list-item]

        got = await alternate({
            "store": append,
            "floor": lambda: floor.write(state["line"]),  # type: ignore[arg-type]
            "threaded": lambda: threaded.write_off_loop(state["line"]),  # type: ignore[arg-type]
        }, samples, before=before)
        floor.close()
        threaded.close()
        await store.close()
        f50 = got.median("floor")
        run.row(f"file store append p50, one entry, session of {preload:,}",
                ms(got.median("store")), "ms", versus=FLOOR, versus_value=ms(f50),
                goal=at_most(1.5),
                detail=f"p99 {got.pct('store', 0.99) / got.pct('floor', 0.99):.2f}× the "
                       f"floor's p99; {samples} samples in turns")
        run.row(f"write + fdatasync on a worker thread, awaited, session of {preload:,}",
                ms(got.median("threaded")), "ms", versus=FLOOR, versus_value=ms(f50),
                detail="the least an append that keeps its sync off the event loop costs")

    asyncio.run(go())


def group_commit(run: Run, tasks: int, per_task: int, runs: int) -> None:
    entries = realistic(tasks * per_task, seed=5)
    lines = [encode_entry(e) + b"\n" for e in entries]
    ratios, rates, floor_rates = [], [], []

    async def once(root: Path) -> float:
        store = FileStore(root)
        await store.create_session(SessionRecord(id="g"))

        async def writer(w: int) -> None:
            for e in entries[w::tasks]:
                await store.append_entries("g", [e])

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(tasks)))
        took = time.perf_counter() - t0
        assert len(await store.load_entries("g")) == len(entries)
        await store.close()
        return took

    for k in range(runs):
        # Which goes first alternates from run to run.
        if k % 2:
            store_s = asyncio.run(once(run.tmp / f"group-{k}"))
        floor_s = fsync_serial(run.tmp / f"group-floor-{k}", lines)
        if not k % 2:
            store_s = asyncio.run(once(run.tmp / f"group-{k}"))
        ratios.append(floor_s / store_s)
        rates.append(len(lines) / store_s)
        floor_rates.append(len(lines) / floor_s)
    low = min(range(runs), key=ratios.__getitem__)
    run.row(f"group commit: {tasks} tasks × {per_task} appends to one session, lowest of "
            f"{runs} runs", rates[low], "appends/s",
            versus="the same lines, one write + fdatasync each, serially",
            versus_value=floor_rates[low], ratio=ratios[low], goal=at_least(2.0),
            detail=f"median {statistics.median(ratios):.2f}×, highest {max(ratios):.2f}×; "
                   f"rates as appends per second of each run against its own floor")


def sqlite_one(run: Run, synchronous: str, rounds: int, block: int) -> None:
    path = run.tmp / f"one-{synchronous}.db"

    async def go() -> dict[str, float]:
        store = SQLiteStore(path, synchronous=synchronous)  # type: ignore[arg-type]
        await store.create_session(SessionRecord(id="solo"))
        floor = SQLiteInsert(path, synchronous=synchronous)
        line = encode_entry(chat(None))
        parent: list[str | None] = [None]

        async def append() -> None:
            entry = chat(parent[0])
            parent[0] = entry.id
            await store.append_entries("solo", [entry])

        got = await alternate({"store": append, "floor": lambda: floor.insert(line)},
                              rounds, block=block)
        floor.close()
        await store.close()
        return {"store": got.median("store"), "floor": got.median("floor"),
                "ratio": got.paired("floor", "store")}

    r = asyncio.run(go())
    run.row(f"SQLite append, one process, one session, synchronous={synchronous}",
            1 / r["store"], "appends/s",
            versus=f"BEGIN IMMEDIATE + INSERT + COMMIT, synchronous={synchronous}",
            versus_value=1 / r["floor"], ratio=r["ratio"], goal=at_least(0.9),
            detail=f"{rounds} blocks of {block} in turns; median of paired rate ratios")


def sqlite_tasks(run: Run, tasks: int, appends: int, rounds: int) -> None:
    path = run.tmp / "tasks.db"

    async def go() -> dict[str, float]:
        store = SQLiteStore(path)
        floor = SQLiteInsert(path)
        line = encode_entry(chat(None))
        parents: dict[str, str | None] = {}
        for t in range(tasks):
            await store.create_session(SessionRecord(id=f"t{t}"))

        async def task(t: int) -> None:
            for _ in range(appends):
                entry = chat(parents.get(f"t{t}"))
                await store.append_entries(f"t{t}", [entry])
                parents[f"t{t}"] = entry.id

        async def grouped() -> None:
            await asyncio.gather(*(task(t) for t in range(tasks)))

        def serial() -> None:
            for _ in range(tasks * appends):
                floor.insert(line)

        got = await alternate({"store": grouped, "floor": serial}, rounds)
        floor.close()
        await store.close()
        n = tasks * appends
        return {"store": n / got.median("store"), "floor": n / got.median("floor"),
                "ratio": got.paired("floor", "store")}

    r = asyncio.run(go())
    run.row(f"SQLite, {tasks} tasks of one process appending to their own sessions",
            r["store"], "appends/s", versus="as many bare commits, one after another",
            versus_value=r["floor"], ratio=r["ratio"],
            detail=f"{rounds} rounds of {appends} appends per task, in turns")


def postgres_one(run: Run, rounds: int, block: int) -> None:
    schema = f"tl_bench_append_{secrets.token_hex(4)}"
    postgres_floor_table(run.pg_url, schema)

    async def go() -> dict[str, float]:
        store = PostgresStore(run.pg_url, schema=schema, min_size=1, max_size=1)
        await store.create_session(SessionRecord(id="solo"))
        blocking = PostgresInsert.connect(run.pg_url, schema, "blocking")
        on_loop = await PostgresInsert.connect_async(run.pg_url, schema, "async")
        line = encode_entry(chat(None))
        parent: list[str | None] = [None]

        async def append() -> None:
            entry = chat(parent[0])
            parent[0] = entry.id
            await store.append_entries("solo", [entry])

        got = await alternate({"store": append, "floor": lambda: blocking.insert(line),
                               "async": lambda: on_loop.insert_async(line)},
                              rounds, block=block)
        blocking.close()
        await on_loop.close()
        await store.close()
        return {"store": got.median("store"), "floor": got.median("floor"),
                "async": got.median("async"), "ratio": got.paired("floor", "store"),
                "async_ratio": got.paired("async", "store")}

    try:
        r = asyncio.run(go())
    finally:
        import psycopg

        with psycopg.connect(run.pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    detail = f"{rounds} blocks of {block} in turns; median of paired rate ratios"
    run.row("PostgreSQL append, one process, one session", 1 / r["store"], "appends/s",
            versus="a bare INSERT in autocommit, blocking psycopg connection",
            versus_value=1 / r["floor"], ratio=r["ratio"], goal=at_least(0.9), detail=detail)
    run.row("PostgreSQL append, one process, one session (against asyncio psycopg)",
            1 / r["store"], "appends/s",
            versus="the same INSERT on a psycopg AsyncConnection",
            versus_value=1 / r["async"], ratio=r["async_ratio"], detail=detail)


def main(run: Run) -> None:
    samples = run.pick(300, 20)
    for preload in run.pick((100, 10_000), (100, 1_000)):
        run.say(f"file store, session of {preload}")
        file_append(run, preload, samples)
    run.say("group commit")
    group_commit(run, 8, run.pick(50, 10), run.pick(9, 2))
    for synchronous in ("FULL", "NORMAL"):
        run.say(f"SQLite one process, synchronous={synchronous}")
        sqlite_one(run, synchronous, run.pick(20, 3), run.pick(25, 5))
    sqlite_tasks(run, 8, run.pick(10, 3), run.pick(16, 2))
    if not run.postgres():
        return
    run.say("PostgreSQL one process")
    postgres_one(run, run.pick(200, 3), run.pick(10, 5))
