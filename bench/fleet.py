"""A fleet of worker processes running durable conversations on one PostgreSQL.

N worker processes (2, 4, 8, 16) each run scripted conversations
(``ScriptedModel`` through ``durable.model``): open a session, run a turn,
run another. Every run stores two messages (the input, then the reply), one
``append_entries`` each. Two layouts:

- ``spread``: every worker has its own sessions (8 each);
- ``hot``: all workers share 2 sessions, so appends queue on the session row.

Two routes: straight to PostgreSQL, and through a PgBouncer in transaction
pooling mode (started here, pool of 10 server connections). Each worker's
store has a pool of 2 connections.

The floor is a bare single-row INSERT committed on its own connection over
the same route, one after every 4th append of the store, inside the same
processes, so both see the same load. Figures are ratios to it. Connections
used is the most server backends serving this run seen at once (sampled
every 20 ms from ``pg_stat_activity`` by application name). At the end every
session is read back: each acknowledged entry must be stored exactly once.

    .venv/bin/python bench/fleet.py [--workers 2 4 8 16] [--runs 40]

Writes ``bench/results/fleet.json``. Needs the PostgreSQL server of
``THREADLINE_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test)
and the ``pgbouncer`` binary; it works in a scratch schema dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from threadline import durable
from threadline.session import Entry, PostgresStore
from threadline.testing import ScriptedModel, Turn

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "fleet.json"
FLOOR_EVERY = 4
REPLY = "A scripted answer of ordinary length, about as long as a short chat reply. " * 3


class TimedStore:
    """Delegates to a PostgresStore and times each append."""

    def __init__(self, inner: PostgresStore) -> None:
        self.inner = inner
        self.latencies: list[int] = []
        self.acked: dict[str, list[str]] = {}
        self.on_append: Any = None

    async def create_session(self, record: Any) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        t0 = time.perf_counter_ns()
        await self.inner.append_entries(session_id, entries)
        self.latencies.append(time.perf_counter_ns() - t0)
        self.acked.setdefault(session_id, []).extend(e.id for e in entries)
        if self.on_append is not None:
            await self.on_append()


def _worker(job: dict[str, Any], worker: int, barrier: Any, out: Any) -> None:
    async def run() -> None:
        url = f"{job['url']}?application_name={job['tag']}"
        store = TimedStore(PostgresStore(url, schema=job["schema"], min_size=2, max_size=2,
                                         prepare_threshold=None))
        floor = await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                      prepare_threshold=None)
        floor_lat: list[int] = []
        count = 0
        line = REPLY.encode()
        query = f"INSERT INTO {job['schema']}.floor (worker, n, data) VALUES (%s, %s, %s)"

        async def after_append() -> None:
            nonlocal count
            count += 1
            if count % FLOOR_EVERY == 0:
                t0 = time.perf_counter_ns()
                await floor.execute(query, (worker, count, line))
                floor_lat.append(time.perf_counter_ns() - t0)

        if job["layout"] == "hot":
            sessions = [f"hot-{n}" for n in range(2)]
        else:
            sessions = [f"w{worker}-s{n}" for n in range(8)]
        await asyncio.to_thread(barrier.wait)
        store.on_append = after_append
        start = time.monotonic()
        for n in range(job["runs"]):
            sid = sessions[(worker + n) % len(sessions)]
            model = ScriptedModel([Turn.text(REPLY)])
            agent = await durable.open(durable.model(model), store=store, session_id=sid)
            await agent.run(f"worker {worker} question {n}").collect()
        elapsed = time.monotonic() - start
        await floor.close()
        await store.inner.close()
        out.put({"lat": store.latencies, "floor_lat": floor_lat, "acked": store.acked,
                 "elapsed": elapsed, "start": start})

    asyncio.run(run())


def _pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] / 1000 if s else float("nan")


def _sample_connections(tag: str, stop: threading.Event, peak: list[int]) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                               (tag,)).fetchone()
            peak[0] = max(peak[0], int(row[0]) if row else 0)
            time.sleep(0.02)


def _phase(url: str, schema: str, layout: str, workers: int, runs: int) -> dict[str, Any]:
    tag = f"tl-fleet-{secrets.token_hex(4)}"
    job = {"url": url, "schema": schema, "layout": layout, "runs": runs, "tag": tag}
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job, w, barrier, out)) for w in range(workers)]
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sample_connections, args=(tag, stop, peak))
    sampler.start()
    for p in procs:
        p.start()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    stop.set()
    sampler.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a worker failed ({layout}, {workers} workers, {url})")
    lat = [x for r in results for x in r["lat"]]
    floor = [x for r in results for x in r["floor_lat"]]
    wall = max(r["start"] + r["elapsed"] for r in results) - min(r["start"] for r in results)
    acked: dict[str, list[str]] = {}
    for r in results:
        for sid, ids in r["acked"].items():
            acked.setdefault(sid, []).extend(ids)
    lost = duplicated = 0
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for sid, ids in acked.items():
            stored = [i for (i,) in conn.execute(
                f"SELECT entry_id FROM {schema}.entries WHERE session_id = %s", (sid,))]
            duplicated += len(stored) - len(set(stored))
            lost += len(set(ids) - set(stored))
        conn.execute(f"TRUNCATE {schema}.entries, {schema}.sessions, {schema}.floor")
    appends = len(lat)
    # Closed loop: the floor's rate is what one worker's floor writes would do
    # back to back, summed over workers, like the store's.
    floor_rate = sum(len(r["floor_lat"]) / (sum(r["floor_lat"]) / 1e9)
                     for r in results if r["floor_lat"])
    store_rate = sum(len(r["lat"]) / (sum(r["lat"]) / 1e9) for r in results if r["lat"])
    return {
        "layout": layout, "workers": workers, "appends": appends,
        "runs_per_s": workers * runs / wall, "appends_per_s": appends / wall,
        "store_closed_loop_per_s": store_rate, "floor_closed_loop_per_s": floor_rate,
        "p50_us": _pct(lat, 0.5), "p99_us": _pct(lat, 0.99),
        "floor_p50_us": _pct(floor, 0.5), "floor_p99_us": _pct(floor, 0.99),
        "p50_ratio": _pct(lat, 0.5) / _pct(floor, 0.5),
        "p99_ratio": _pct(lat, 0.99) / _pct(floor, 0.99),
        "server_connections_peak": peak[0], "client_connections": workers * 3,
        "lost": lost, "duplicated": duplicated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--runs", type=int, default=40, help="runs per worker and phase")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pgbouncer import PgBouncer  # the tests' runner of a private PgBouncer

    schema = f"tl_fleet_{secrets.token_hex(4)}"
    parts = urlsplit(PG_URL)
    bouncer = PgBouncer(server_port=parts.port or 5432, dbname=parts.path.lstrip("/") or "test",
                        pool_size=10)
    bouncer.start()
    results: dict[str, Any] = {
        "runs_per_worker": args.runs, "floor_every": FLOOR_EVERY, "pgbouncer_pool_size": 10,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "load_average_at_start": os.getloadavg()},
        "phases": [],
    }
    try:
        async def prepare() -> None:
            async with PostgresStore(PG_URL, schema=schema) as store:
                await store.list_sessions(limit=1)  # creates and migrates the schema

        asyncio.run(prepare())
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {schema}.floor (worker int, n int, data bytea, "
                         f"PRIMARY KEY (worker, n))")
            results["machine"]["postgres"] = conn.info.server_version
        _print_header()
        for route, url in (("direct", PG_URL), ("pgbouncer", bouncer.url)):
            for layout in ("spread", "hot"):
                for workers in args.workers:
                    phase = _phase(url, schema, layout, workers, args.runs)
                    phase["route"] = route
                    results["phases"].append(phase)
                    _print_row(phase)
    finally:
        bouncer.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    if any(p["lost"] or p["duplicated"] for p in results["phases"]):
        raise SystemExit("entries were lost or duplicated")


def _print_header() -> None:
    print(f"{'route':<10}{'layout':<8}{'N':>3}{'runs/s':>9}{'appends/s':>11}"
          f"{'p50 µs':>9}{'x floor':>8}{'p99 µs':>9}{'x floor':>8}"
          f"{'server conns':>14}{'lost':>6}{'dup':>5}")


def _print_row(p: dict[str, Any]) -> None:
    print(f"{p['route']:<10}{p['layout']:<8}{p['workers']:>3}{p['runs_per_s']:>9.0f}"
          f"{p['appends_per_s']:>11.0f}{p['p50_us']:>9.0f}{p['p50_ratio']:>8.2f}"
          f"{p['p99_us']:>9.0f}{p['p99_ratio']:>8.2f}"
          f"{p['server_connections_peak']:>14}{p['lost']:>6}{p['duplicated']:>5}")


if __name__ == "__main__":
    main()
