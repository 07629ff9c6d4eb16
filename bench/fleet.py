"""Many processes at once: each store under 8 writers, and durable conversations on one PostgreSQL.

- Stores: 8 processes x 50 sessions x 100 appends (one entry per append,
  chained) per store (SQLite, PostgreSQL, file), all released together. Each
  process also makes one floor write after every 5th append, so store and
  floor see the same load: a bare BEGIN IMMEDIATE + INSERT + COMMIT on the
  same database for SQLite, a bare INSERT in autocommit for PostgreSQL, a
  write + fdatasync to a file per session for the file store. Afterwards
  every acknowledged entry must be stored, in order. Goals: at least 0.9x
  the floor's rate and at most 1.5x its p50; nothing lost.
- Conversations (needs ``pgbouncer``): N worker processes (2, 4, 8, 16) run
  scripted durable conversations (two appends per run), each on its own
  sessions (``spread``) or all on two (``hot``), straight to PostgreSQL and
  through a PgBouncer in transaction pooling (10 server connections). The
  floor is a bare INSERT over the same route after every 4th append. Every
  acknowledged entry must be stored exactly once.

Rates sum each process's appends over the time it spent in them (floor
writes in between left out); the floor's rate is taken the same way.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import shutil
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from bench._floors import FsyncFile, PostgresInsert, SQLiteInsert, postgres_floor_table
from bench._harness import Run, at_least, at_most, pct, test_helper
from bench._targets import (
    Entry,
    FileStore,
    PostgresStore,
    ScriptedModel,
    SessionRecord,
    SQLiteStore,
    Turn,
    durable,
    encode_entry,
)
from bench._workloads import chat

NEEDS = ("postgres",)
MINUTES = 8
REPLY = "A scripted answer of ordinary length, about as long as a short chat reply. " * 3


def _open(job: dict[str, Any]) -> Any:
    if job["kind"] == "sqlite":
        return SQLiteStore(job["target"])
    if job["kind"] == "postgres":
        return PostgresStore(job["target"], schema=job["schema"], min_size=1, max_size=1)
    return FileStore(job["target"])


def _floor(job: dict[str, Any], worker: int) -> Any:
    if job["kind"] == "sqlite":
        return SQLiteInsert(job["target"], session=worker).insert
    if job["kind"] == "postgres":
        return PostgresInsert.connect(job["target"], job["schema"], f"w{worker}").insert
    files: dict[str, FsyncFile] = {}

    def write(line: bytes, sid: str = "") -> None:
        if sid not in files:
            files[sid] = FsyncFile(job["floor_dir"] / f"floor-{worker}-{sid}.jsonl")
        files[sid].write(line + b"\n")

    return write


def _store_worker(job: dict[str, Any], worker: int, barrier: Any, out: Any) -> None:
    async def run() -> None:
        store = _open(job)
        sids = [f"w{worker}-s{s}" for s in range(job["sessions"])]
        for sid in sids:
            await store.create_session(SessionRecord(id=sid))
        floor = _floor(job, worker)
        line = encode_entry(chat(None))
        parents: dict[str, str | None] = dict.fromkeys(sids)
        acked: dict[str, list[str]] = {sid: [] for sid in sids}
        lat: list[float] = []
        floor_lat: list[float] = []
        await asyncio.to_thread(barrier.wait)
        for n in range(job["appends"]):
            for i, sid in enumerate(sids):
                entry = chat(parents[sid], n)
                t0 = time.perf_counter()
                await store.append_entries(sid, [entry])
                lat.append(time.perf_counter() - t0)
                parents[sid] = entry.id
                acked[sid].append(entry.id)
                if (n + i) % 5 == 0:
                    t0 = time.perf_counter()
                    if job["kind"] == "file":
                        floor(line, sid)
                    else:
                        floor(line)
                    floor_lat.append(time.perf_counter() - t0)
        await store.close()
        out.put({"lat": lat, "floor_lat": floor_lat, "acked": acked})

    asyncio.run(run())


def _rate(per_worker: Sequence[Sequence[float]]) -> float:
    """Closed-loop workers: each one's calls over the time it spent in them, summed."""
    return sum(len(w) / sum(w) for w in per_worker if w)


def _spawn(target: Any, job: dict[str, Any], workers: int) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=target, args=(job, w, barrier, out)) for w in range(workers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a {job.get('kind', 'fleet')} worker exited with {p.exitcode}")
    return results


def stores(run: Run, processes: int, sessions: int, appends: int) -> None:
    schema = f"tl_bench_fleet_{secrets.token_hex(4)}"
    postgres_floor_table(run.pg_url, schema)
    (run.tmp / "files").mkdir()
    targets = {"sqlite": str(run.tmp / "fleet.db"), "postgres": run.pg_url,
               "file": str(run.tmp / "files")}
    names = {"sqlite": "SQLite", "postgres": "PostgreSQL", "file": "file store"}
    floors = {"sqlite": "BEGIN IMMEDIATE + INSERT + COMMIT, same database, same processes",
              "postgres": "a bare INSERT in autocommit, same processes",
              "file": "write + fdatasync to a file per session, same processes"}
    try:
        for kind, target in targets.items():
            run.say(f"{kind}: {processes} processes × {sessions} sessions × {appends}")
            job = {"kind": kind, "target": target, "schema": schema, "sessions": sessions,
                   "appends": appends, "floor_dir": run.tmp / "files"}
            results = _spawn(_store_worker, job, processes)
            lat = [r["lat"] for r in results]
            floor = [r["floor_lat"] for r in results]
            acked: dict[str, list[str]] = {}
            for r in results:
                acked.update(r["acked"])
            lost = asyncio.run(_lost(job, acked))
            every = [x for w in lat for x in w]
            floor_every = [x for w in floor for x in w]
            what = f"{names[kind]}, {processes} processes × {sessions} sessions"
            run.row(f"{what}: appends per second", _rate(lat), "appends/s",
                    versus=floors[kind], versus_value=_rate(floor), goal=at_least(0.9))
            run.row(f"{what}: append p50", pct(every, 0.5) * 1e3, "ms", versus=floors[kind],
                    versus_value=pct(floor_every, 0.5) * 1e3, goal=at_most(1.5),
                    detail=f"p99 {pct(every, 0.99) / pct(floor_every, 0.99):.2f}× the "
                           "floor's")
            run.row(f"{what}: acknowledged entries lost", lost, "entries",
                    versus="entries acknowledged", versus_value=len(every),
                    goal=at_most(0, on="value"))
    finally:
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)


async def _lost(job: dict[str, Any], acked: dict[str, list[str]]) -> int:
    store = _open(job)
    lost = 0
    for sid, ids in acked.items():
        stored = [e.id for e in await store.load_entries(sid)]
        if stored != ids:
            lost += len(set(ids) - set(stored)) or 1
    await store.close()
    return lost


class _Timed:
    """A PostgresStore that times each append and makes a floor write after every 4th."""

    def __init__(self, inner: PostgresStore, floor: PostgresInsert) -> None:
        self.inner, self.floor = inner, floor
        self.lat: list[float] = []
        self.floor_lat: list[float] = []
        self.acked: dict[str, list[str]] = {}
        self.line = REPLY.encode()

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        t0 = time.perf_counter()
        await self.inner.append_entries(session_id, entries)
        self.lat.append(time.perf_counter() - t0)
        self.acked.setdefault(session_id, []).extend(e.id for e in entries)
        if len(self.lat) % 4 == 0:
            t0 = time.perf_counter()
            await self.floor.insert_async(self.line)
            self.floor_lat.append(time.perf_counter() - t0)


def _conversation_worker(job: dict[str, Any], worker: int, barrier: Any, out: Any) -> None:
    async def run() -> None:
        url = f"{job['url']}?application_name={job['tag']}"
        floor = await PostgresInsert.connect_async(url, job["schema"], f"w{worker}",
                                                   prepare_threshold=None)
        store = _Timed(PostgresStore(url, schema=job["schema"], min_size=2, max_size=2,
                                     prepare_threshold=None), floor)
        sessions = ([f"hot-{n}" for n in range(2)] if job["layout"] == "hot"
                    else [f"w{worker}-s{n}" for n in range(8)])
        await asyncio.to_thread(barrier.wait)
        start = time.perf_counter()
        for n in range(job["runs"]):
            sid = sessions[(worker + n) % len(sessions)]
            model = ScriptedModel([Turn.text(REPLY)])
            agent = await durable.open(durable.model(model), store=store,  # type: ignore[arg-type]
                                       session_id=sid)
            await agent.run(f"worker {worker} question {n}").collect()
        elapsed = time.perf_counter() - start
        await floor.close()
        await store.inner.close()
        out.put({"lat": store.lat, "floor_lat": store.floor_lat, "acked": store.acked,
                 "elapsed": elapsed})

    asyncio.run(run())


def _peak_connections(url: str, tag: str, stop: threading.Event, peak: list[int]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                               "WHERE application_name = %s", (tag,)).fetchone()
            peak[0] = max(peak[0], int(row[0]) if row else 0)
            stop.wait(0.02)


def _phase(run: Run, url: str, schema: str, *, layout: str, workers: int,
           runs: int) -> dict[str, Any]:
    import psycopg

    tag = f"tl-fleet-{secrets.token_hex(4)}"
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_peak_connections, args=(run.pg_url, tag, stop, peak))
    sampler.start()
    try:
        results = _spawn(_conversation_worker, {"url": url, "schema": schema,
                                                "layout": layout, "runs": runs, "tag": tag},
                         workers)
    finally:
        stop.set()
        sampler.join()
    acked: dict[str, list[str]] = {}
    for r in results:
        for sid, ids in r["acked"].items():
            acked.setdefault(sid, []).extend(ids)
    lost = duplicated = 0
    with psycopg.connect(run.pg_url, autocommit=True) as conn:
        store = PostgresStore(run.pg_url, schema=schema, min_size=1, max_size=1)

        async def stored() -> dict[str, list[str]]:
            got = {sid: [e.id for e in await store.load_entries(sid)] for sid in acked}
            await store.close()
            return got

        for sid, ids in asyncio.run(stored()).items():
            duplicated += len(ids) - len(set(ids))
            lost += len(set(acked[sid]) - set(ids))
        conn.execute(f"TRUNCATE {schema}.entries, {schema}.sessions, {schema}.floor")
    lat = [x for r in results for x in r["lat"]]
    floor = [x for r in results for x in r["floor_lat"]]
    return {"lat": lat, "floor": floor, "lost": lost, "duplicated": duplicated,
            "rate": len(lat) / max(r["elapsed"] for r in results), "peak": peak[0]}


def conversations(run: Run, workers: Sequence[int], runs: int) -> None:
    pgbouncer = test_helper("pgbouncer")
    schema = f"tl_bench_conv_{secrets.token_hex(4)}"
    parts = urlsplit(run.pg_url)
    bouncer = pgbouncer.PgBouncer(server_port=parts.port or 5432,
                                  dbname=parts.path.lstrip("/") or "test", pool_size=10)
    bouncer.start()

    async def prepare() -> None:
        async with PostgresStore(run.pg_url, schema=schema) as store:
            await store.list_sessions(limit=1)  # creates the schema

    problems = appends = 0
    try:
        asyncio.run(prepare())
        postgres_floor_table(run.pg_url, schema)
        for route, url in (("direct", run.pg_url), ("through PgBouncer", bouncer.url)):
            for layout in ("spread", "hot"):
                for n in workers:
                    run.say(f"conversations, {route}, {layout}, {n} workers")
                    p = _phase(run, url, schema, layout=layout, workers=n, runs=runs)
                    problems += p["lost"] + p["duplicated"]
                    appends += len(p["lat"])
                    run.row(f"PostgreSQL {route}, {n} processes of durable conversations, "
                            f"{layout} sessions: append p50", pct(p["lat"], 0.5) * 1e3, "ms",
                            versus="a bare INSERT over the same route, same processes",
                            versus_value=pct(p["floor"], 0.5) * 1e3,
                            detail=f"{p['rate']:.0f} appends/s; at most {p['peak']} server "
                                   f"connections; {p['lost']} lost, {p['duplicated']} "
                                   "duplicated")
    finally:
        bouncer.close()
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)
    run.row("durable conversations: acknowledged entries lost or stored twice, every phase",
            problems, "entries", versus="entries acknowledged", versus_value=appends,
            goal=at_most(0, on="value"))


def main(run: Run) -> None:
    stores(run, run.pick(8, 2), run.pick(50, 3), run.pick(100, 5))
    if shutil.which("pgbouncer") is None:
        run.say("no pgbouncer on the PATH: the conversation rows are left out")
        return
    conversations(run, run.pick((2, 4, 8, 16), (2,)), run.pick(40, 3))
