"""Load test of the durable stores: SQLite, PostgreSQL and the JSONL file store.

8 processes x 50 sessions x 100 appends (one entry per append, chained) per
store, all processes released together. Reports appends/s, p50/p99 append
latency, and verifies afterwards that every acknowledged entry is stored, in
order. Each store is set against its floor, measured in the same processes,
interleaved with the appends one write at a time (a floor write after every
5th append), so both see the same load from the other processes and from
whatever else the machine is doing. (Not in blocks: SQLite's write lock is not
a queue, and a tight loop of floor writes that re-takes it within
microseconds of its own commit starves the other processes, which measured
the lock's unfairness rather than the store.)

- PostgreSQL: a bare single-row INSERT committed on the same connection
  (autocommit: one round trip, one WAL flush);
- SQLite: a bare BEGIN IMMEDIATE + INSERT + COMMIT on a connection with the
  same pragmas (WAL, synchronous=FULL) and the store's way of waiting for the
  write lock (short busy-handler slices, retried), no executor hop;
- file: write() of the same line + fdatasync() on a per-session file.

The SQL floors write the store's own row for the entry (``session/_rows.py``)
into a table built like the store's ``entries`` (same columns, same indexes),
so store and floor write the same bytes.

Two more tables, same run:
- one process, one session, appends one after another against the bare loop
  of the floor's write, in alternating blocks (median of the paired ratios);
- SQLite only: the one-process floor write made on the store's own thread
  (through its hop), and the store with its appends on its worker thread
  only (as where io_uring is off, S46); 8 tasks of one process each
  appending to its own session against as many floor writes in a row, the
  store grouping queued appends into one commit (S42), committed on the event
  loop (S46) and, switched in here, on the worker only; opening a store plus
  its first load against a load on an open store, waking a released thread
  or starting one as before, alternating;
- bytes stored for the ``bench/peers.py`` workload (400-character messages of
  random base64, user and assistant in turn) over the raw payload, at two
  sizes, and the bytes each further entry adds (fixed per-table pages cancel).

For PostgreSQL, the append statement's own cost per entry in each form the
store has sent (issue 15's text arrays, binary arrays, a VALUES list) at 1, 8
and 16 entries against the bare INSERT, with ``synchronous_commit`` off for that
connection so the WAL flush, the same for all, drops out; all prepared, and the
bare INSERT and the one-entry VALUES list also parsed and planned at each call,
as behind PgBouncer with ``prepare_threshold=None``.

A second, small table compares ``bytea`` and ``jsonb`` for the entries column
(bytes on disk, load time, byte-identical round trip), the measurement behind
the PostgresStore's column type.

    .venv/bin/python bench/sql_stores.py [--processes 8 --sessions 50 --appends 100]
    .venv/bin/python bench/sql_stores.py --stores file --file-as hop
    .venv/bin/python bench/sql_stores.py --stores sqlite --worker-only

``--file-as floor`` puts the file floor's own write in the store's place (an
A/A run: what the bench gives two identical writes), ``--file-as hop`` that
write on a worker thread, awaited from the event loop (what an append that
keeps its fdatasync off the event loop costs at least). Neither is verified.

appends/s sums each process's appends over the time it spent in them (floor
writes in between excluded); the floor's rate is computed the same way.

Writes ``bench/results/sql_stores.json``. Needs the PostgreSQL server of
``THREADLINE_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test);
it works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import multiprocessing
import os
import platform
import queue
import random
import secrets
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast

import msgspec
import psycopg

from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.session import (
    FileStore,
    MessageEntry,
    PostgresStore,
    SessionRecord,
    SQLiteStore,
    Store,
    _sqlite,
)
from threadline.session._codec import encode_entry
from threadline.session._rows import compact
from threadline.session._sqlite import _BUSY_SLICE

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "sql_stores.json"


def _entry(parent: str | None, worker: int, n: int) -> MessageEntry:
    text = f"worker {worker} turn {n}: " + "some ordinary sentence of chat. " * 6
    return MessageEntry(parent_id=parent, message=UserMessage.of(text))


def _open(kind: str, target: str, schema: str) -> Store:
    if kind == "sqlite":
        return SQLiteStore(target)
    if kind == "postgres":
        return PostgresStore(target, schema=schema, min_size=1, max_size=1)
    return FileStore(target)


def _floor_op(kind: str, target: str, schema: str, sids: list[str],
              line: bytes) -> Callable[[str, int], None]:
    """One bare durable write of ``line``, the way the backend does it at its cheapest."""
    code, key, parent, ts, data = compact(msgspec.json.decode(line, type=MessageEntry), line)
    # Every stored entry but a root has a parent: so does every floor row.
    row = (code, key, key if parent is None else parent, ts, data)
    if kind == "postgres":
        conn = psycopg.connect(target, autocommit=True)
        query = (f"INSERT INTO {schema}.floor (seq, ts, kind, session_id, entry_id, parent_id, "
                 f"data) VALUES (%s, %s, %s, %s, %s, %s, %s)")

        def pg(sid: str, n: int) -> None:
            conn.execute(query, (n, row[3], row[0], sid, row[1][:12] + n.to_bytes(4), row[2],
                                 row[4]))

        return pg
    if kind == "sqlite":
        conn3 = sqlite3.connect(target, timeout=_BUSY_SLICE, isolation_level=None)
        conn3.execute("PRAGMA journal_mode=WAL")
        conn3.execute("PRAGMA synchronous=FULL")

        def begin() -> None:
            # As the store waits: a waiter that let SQLite's busy handler back
            # off (up to 100 ms sleeps) would lose every race to the store.
            while True:
                try:
                    conn3.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc):
                        raise

        # "w3-s7" -> 3007: a key per session, as the store's sessions.key.
        keys = {sid: int(sid[1:sid.index("-")]) * 1000 + int(sid.rsplit("s", 1)[1])
                for sid in sids}

        def lite(sid: str, n: int) -> None:
            begin()
            conn3.execute("INSERT INTO floor (session, kind, id, parent, ts, data) "
                          "VALUES (?, ?, ?, ?, ?, ?)",
                          (keys[sid], row[0], row[1][:12] + n.to_bytes(4), row[2], row[3], row[4]))
            conn3.execute("COMMIT")

        return lite
    fds = {sid: os.open(os.path.join(target, f"floor-{sid}.jsonl"),
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for sid in sids}

    def file(sid: str, n: int) -> None:
        os.write(fds[sid], line + b"\n")
        os.fdatasync(fds[sid])

    return file


Appender = Callable[[str, Sequence[Any]], Awaitable[None]]


def _in_place_of_store(how: str, target: str, sids: list[str],
                       line: bytes) -> Appender:
    """The file floor's own write where the store's append goes (``--file-as``):
    inline, what the bench gives two identical writes; on a worker thread,
    what any append that keeps its fdatasync off the event loop costs."""
    other = os.path.join(target, how)
    os.makedirs(other, exist_ok=True)
    write = _floor_op("file", other, "", sids, line)
    if how == "floor":
        async def inline(sid: str, entries: Sequence[Any]) -> None:
            write(sid, 0)

        return inline
    pool = ThreadPoolExecutor(1)

    async def hop(sid: str, entries: Sequence[Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(pool, write, sid, 0)

    return hop


def _worker(job: dict[str, Any], worker: int, barrier: Any, out: Any) -> None:
    """Append ``appends`` rounds over this worker's sessions; after every
    ``floor_every``-th append, one floor write, so store and floor see the same load."""
    kind, target, schema = job["kind"], job["target"], job["schema"]
    sids = [f"w{worker}-s{s}" for s in range(job["sessions"])]

    async def run() -> None:
        store = _open(kind, target, schema)
        for sid in sids:
            await store.create_session(SessionRecord(id=sid))
        line = encode_entry(_entry(None, worker, 0))
        floor = _floor_op(kind, target, schema, sids, line)
        append: Appender = store.append_entries
        if job["file_as"] != "store":
            append = _in_place_of_store(job["file_as"], target, sids, line)
        parents: dict[str, str | None] = dict.fromkeys(sids)
        acked: dict[str, list[str]] = {sid: [] for sid in sids}
        lat: list[int] = []
        floor_lat: list[int] = []
        await asyncio.to_thread(barrier.wait)
        start = time.time()
        for n in range(job["appends"]):
            for i, sid in enumerate(sids):
                entry = _entry(parents[sid], worker, n)
                t0 = time.perf_counter_ns()
                await append(sid, [entry])
                lat.append(time.perf_counter_ns() - t0)
                parents[sid] = entry.id
                acked[sid].append(entry.id)
                if (n + i) % job["floor_every"] == 0:  # (sid, n) stays unique in floor
                    t0 = time.perf_counter_ns()
                    floor(sid, n)
                    floor_lat.append(time.perf_counter_ns() - t0)
        end = time.time()
        await store.close()  # type: ignore[attr-defined]
        out.put({"start": start, "end": end, "lat": lat, "floor_lat": floor_lat,
                 "acked": acked})

    asyncio.run(run())


def _stats(per_worker: list[list[int]]) -> dict[str, Any]:
    lat = sorted(x for w in per_worker for x in w)
    # Closed-loop workers: each one's rate is its ops over the time it spent on
    # them; the store's rate is their sum (floor writes in between do not count).
    rate = sum(len(w) / (sum(w) / 1e9) for w in per_worker if w)
    return {
        "ops": len(lat),
        "ops_per_s": rate,
        "p50_us": lat[len(lat) // 2] / 1000,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000,
        "mean_us": statistics.fmean(lat) / 1000,
    }


def _run(job: dict[str, Any], processes: int) -> tuple[dict[str, Any], dict[str, Any],
                                                      dict[str, list[str]], float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job, w, barrier, out)) for w in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"{job['kind']} worker failed with exit code {p.exitcode}")
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    acked: dict[str, list[str]] = {}
    for r in results:
        acked.update(r["acked"])
    return (_stats([r["lat"] for r in results]), _stats([r["floor_lat"] for r in results]),
            acked, wall)


async def _verify(kind: str, target: str, schema: str, acked: dict[str, list[str]]) -> int:
    """Acknowledged entries missing or out of order after the run (must be 0)."""
    store = _open(kind, target, schema)
    lost = 0
    for sid, ids in acked.items():
        stored = [e.id for e in await store.load_entries(sid)]
        if stored != ids:
            lost += len(set(ids) - set(stored)) or 1
    await store.close()  # type: ignore[attr-defined]
    return lost


def _prepare_floor(kind: str, target: str, schema: str) -> None:
    """A floor table built like the store's ``entries``: same columns, same indexes."""
    if kind == "postgres":
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {schema}.floor (seq bigint NOT NULL, ts bigint, "
                         f"kind smallint NOT NULL, session_id text COLLATE \"C\" NOT NULL, "
                         f"entry_id bytea NOT NULL, parent_id bytea, data bytea NOT NULL, "
                         f"PRIMARY KEY (session_id, seq), UNIQUE (session_id, entry_id))")
    elif kind == "sqlite":
        with sqlite3.connect(target) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE floor (seq INTEGER PRIMARY KEY, session INTEGER NOT NULL, "
                         "kind INTEGER NOT NULL, id BLOB NOT NULL, parent BLOB, ts INTEGER, "
                         "data BLOB NOT NULL)")
            conn.execute("CREATE UNIQUE INDEX floor_id ON floor (session, id)")
            conn.execute("CREATE INDEX floor_order ON floor (session)")


Run = Callable[[], Awaitable[None]]


class _Chain:
    """Appends of one entry each to one session; a block's entries are made
    before the clock starts (the caller's work, as the floor's row is made
    before its clock)."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store, self.session_id = store, session_id
        self.parent: str | None = None

    def block(self, size: int, r: int) -> Run:
        entries = []
        for _ in range(size):
            entries.append(_entry(self.parent, 0, r))
            self.parent = entries[-1].id

        async def run() -> None:
            for entry in entries:
                await self.store.append_entries(self.session_id, [entry])

        return run


def _numbered_block(write: Callable[[int], Awaitable[None]], n: Iterator[int], size: int,
                    r: int) -> Run:
    async def run() -> None:
        for _ in range(size):
            await write(next(n))

    return run


async def one_process(kind: str, target: str, schema: str, *, rounds: int = 20,
                      block: int = 25) -> dict[str, Any]:
    """One process appending to one session, one entry at a time, against the bare
    floor write in alternating blocks (which goes first alternates too)."""
    store = _open(kind, target, schema)
    await store.create_session(SessionRecord(id="solo"))
    floor_sid = "w0-s999"  # a floor session of its own (key 999)
    floor = _floor_op(kind, target, schema, [floor_sid], encode_entry(_entry(None, 0, 0)))
    n = itertools.count(10_000_000)

    def floor_block(size: int, r: int) -> Run:
        async def run() -> None:
            for _ in range(size):
                floor(floor_sid, next(n))

        return run

    blocks: dict[str, Callable[[int, int], Run]] = {"store": _Chain(store, "solo").block,
                                                     "floor": floor_block}
    third, name, async_floor = await _third_write(kind, store, target, schema, floor_sid)
    if third is not None:
        blocks[name] = partial(_numbered_block, third, n)
    # SQLite: the same store with its appends on its worker thread only, as
    # where io_uring is off (S46), on a session of its own.
    on_worker = await _worker_only(target) if kind == "sqlite" else None
    if on_worker is not None:
        await on_worker.create_session(SessionRecord(id="solo-worker"))
        blocks["worker"] = _Chain(on_worker, "solo-worker").block
    us: dict[str, list[float]] = {part: [] for part in blocks}
    parts = list(blocks)
    for r in range(rounds):
        for part in (parts if r % 2 == 0 else parts[::-1]):
            run = blocks[part](block, r)
            t0 = time.perf_counter()
            await run()
            us[part].append((time.perf_counter() - t0) / block * 1e6)
    for closing in (store, on_worker, async_floor):
        if closing is not None:
            await closing.close()  # type: ignore[attr-defined]
    return {"rounds": rounds, "block": block, **_paired(us, name)}


def _paired(us: dict[str, list[float]], third: str) -> dict[str, Any]:
    """Medians of each write's block times, and of the paired rate ratios."""
    def median_ratio(a: str, b: str) -> float:
        return statistics.median([x / y for x, y in zip(us[a], us[b], strict=True)])

    ratios = [f / st for f, st in zip(us["floor"], us["store"], strict=True)]
    out = {"store_us": statistics.median(us["store"]), "floor_us": statistics.median(us["floor"]),
           "rate_vs_floor": statistics.median(ratios),
           "ratios_min_max": [min(ratios), max(ratios)], "load": os.getloadavg()[0]}
    if third in us:
        out[f"{third}_us"] = statistics.median(us[third])
        out[f"rate_vs_{third}"] = median_ratio(third, "store")
    if "worker" in us:
        out["worker_us"] = statistics.median(us["worker"])
        out["worker_rate_vs_floor"] = median_ratio("floor", "worker")
    return out


async def _third_write(kind: str, store: Store, target: str, schema: str, floor_sid: str
                       ) -> tuple[Callable[[int], Awaitable[None]] | None, str,
                                  _AsyncFloor | None]:
    """A third write between store and floor, its name in the results, and what to close."""
    if kind == "postgres":
        # The same bare INSERT on an AsyncConnection: what psycopg's asyncio
        # side costs before the store does anything (the store cannot block).
        async_floor = await _async_floor(target, schema)
        return partial(async_floor, floor_sid), "floor_async", async_floor
    if kind != "sqlite":
        return None, "", None
    # The same bare write, made on the store's thread through its hop:
    # what is left between it and the store is the store's own work.
    hop_sid = "w0-s998"
    lite = cast(SQLiteStore, store)
    hop = await lite._call(lambda conn: _floor_op(kind, target, schema, [hop_sid],
                                                  encode_entry(_entry(None, 0, 0))))

    def through_hop(m: int) -> Awaitable[None]:
        return lite._call(lambda conn: hop(hop_sid, m))

    return through_hop, "floor_hop", None


class _AsyncFloor:
    """The PostgreSQL floor's INSERT on a psycopg ``AsyncConnection``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], query: str,
                 row: tuple[Any, ...]) -> None:
        self._conn, self._query, self._row = conn, query, row

    async def __call__(self, sid: str, n: int) -> None:
        code, key, parent, ts, data = self._row
        await self._conn.execute(self._query, (n + 5_000_000, ts, code, sid,
                                               key[:12] + (n + 5_000_000).to_bytes(4), parent,
                                               data))

    async def close(self) -> None:
        await self._conn.close()


async def _async_floor(target: str, schema: str) -> _AsyncFloor:
    line = encode_entry(_entry(None, 0, 0))
    code, key, _, ts, data = compact(msgspec.json.decode(line, type=MessageEntry), line)
    conn = await psycopg.AsyncConnection.connect(target, autocommit=True)
    query = (f"INSERT INTO {schema}.floor (seq, ts, kind, session_id, entry_id, parent_id, "
             f"data) VALUES (%s, %s, %s, %s, %s, %s, %s)")
    return _AsyncFloor(conn, query, (code, key, key, ts, data))


async def _worker_only(target: str) -> SQLiteStore:
    """A store whose appends its worker thread commits, as where io_uring is off (S46)."""
    store = SQLiteStore(target)
    await store._call(lambda conn: None)  # opened: the loop's commits are now ruled out
    store._loop_possible = False
    return store


async def tasks_at_once(target: str, *, tasks: int = 8, appends: int = 10,
                        rounds: int = 16) -> dict[str, Any]:
    """``tasks`` tasks of one process, each appending to its own session, against
    the same number of bare floor writes one after another; and the store with
    its appends grouped on its worker thread only (where io_uring is off, S46),
    alternating blocks."""
    floor_sid = "w0-s997"
    floor = _floor_op("sqlite", target, "", [floor_sid], encode_entry(_entry(None, 0, 0)))
    stores = {"grouped": SQLiteStore(target), "worker only": await _worker_only(target)}
    parents: dict[str, str | None] = {}
    for name, store in stores.items():
        for t in range(tasks):
            await store.create_session(SessionRecord(id=f"{name} {t}"))

    async def task(name: str, t: int) -> None:
        sid = f"{name} {t}"
        for _ in range(appends):
            entry = _entry(parents.get(sid), t, 0)
            await stores[name].append_entries(sid, [entry])
            parents[sid] = entry.id

    us: dict[str, list[float]] = {"grouped": [], "worker only": [], "floor": []}
    n = 20_000_000
    for r in range(rounds):
        for part in (list(us) if r % 2 == 0 else list(us)[::-1]):
            t0 = time.perf_counter()
            if part == "floor":
                for _ in range(tasks * appends):
                    floor(floor_sid, n)
                    n += 1
            else:
                await asyncio.gather(*(task(part, t) for t in range(tasks)))
            us[part].append((time.perf_counter() - t0) / (tasks * appends) * 1e6)
    for store in stores.values():
        await store.close()
    out: dict[str, Any] = {"tasks": tasks, "appends": appends, "rounds": rounds,
                           "floor_us": statistics.median(us["floor"])}
    for name in stores:
        ratios = [f / st for f, st in zip(us["floor"], us[name], strict=True)]
        out[name] = {"us_per_append": statistics.median(us[name]),
                     "rate_vs_floor": statistics.median(ratios),
                     "ratios_min_max": [min(ratios), max(ratios)]}
    return out


async def opening(work: Path, *, entries: int = 100, rounds: int = 40) -> dict[str, Any]:
    """Opening a store plus its first load, against a load on an open store; the
    store either waking a released thread (now) or starting its own (before,
    ``_before_s45_open``), alternating."""
    path = work / "open.db"
    async with SQLiteStore(path) as store:
        await store.create_session(SessionRecord(id="s"))
        parent = None
        for n in range(entries):
            entry = _entry(parent, 0, n)
            await store.append_entries("s", [entry])
            parent = entry.id
        for _ in range(5):
            await store.load_entries("s")
        warm = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            await store.load_entries("s")
            warm.append((time.perf_counter() - t0) * 1e6)
    cold: dict[str, list[float]] = {"released thread": [], "new thread": []}
    kept = _sqlite._IDLE_MAX
    for r in range(rounds):
        for name in (list(cold) if r % 2 == 0 else list(cold)[::-1]):
            if name == "new thread":
                _before_s45_open()
            elif not _sqlite._idle:
                async with SQLiteStore(work / "other.db"):
                    pass  # leaves its thread released
            t0 = time.perf_counter()
            store = SQLiteStore(path)
            await store.load_entries("s")
            cold[name].append((time.perf_counter() - t0) * 1e6)
            await store.close()
            _sqlite._IDLE_MAX = kept
    floor = statistics.median(warm)
    return {"entries": entries, "rounds": rounds, "warm_load_us": floor,
            **{name: {"median_us": statistics.median(v), "p90_us": _pct(v, 0.9),
                      "min_us": min(v), "max_us": max(v),
                      "median_vs_warm": statistics.median(v) / floor}
               for name, v in cold.items()}}


def _before_s45_open() -> None:
    """No released threads, and none kept: a store starts a thread of its own, as before."""
    _sqlite._IDLE_MAX = 0
    with _sqlite._idle_guard:
        idle, _sqlite._idle[:] = list(_sqlite._idle), []
    for handoff in idle:  # a last call with nowhere to park: the thread ends
        jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        jobs.put((None, None, lambda: None, True))
        handoff.put(jobs)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _peers_texts(count: int, seed: int = 7) -> list[str]:
    """``bench/peers.py``'s payloads: 400 characters of base64 of random bytes."""
    rng = random.Random(seed)
    return [base64.b64encode(rng.randbytes(300)).decode() for _ in range(count)]


def _schema_bytes(schema: str) -> int:
    """Heap + TOAST + indexes of every table in ``schema`` after VACUUM, as peers.py counts."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for (table,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s",
                                     (schema,)).fetchall():
            conn.execute(psycopg.sql.SQL("VACUUM {}").format(psycopg.sql.Identifier(schema,
                                                                                 table)))
        row = conn.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM "
                           "pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname = %s AND c.relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def _sqlite_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def stored_bytes(kind: str, work: Path, schema: str,
                       ns: tuple[int, int] = (800, 3200)) -> dict[str, Any]:
    """Bytes stored over raw payload for the peers workload, at two sizes."""
    texts = _peers_texts(max(ns))
    out: dict[str, Any] = {}
    for n in ns:
        target = str(work / f"bytes-{n}.db") if kind == "sqlite" else PG_URL
        where = f"{schema}_b{n}"
        store = _open(kind, target, where)
        await store.create_session(SessionRecord(id="bench"))
        parent = None
        for i, text in enumerate(texts[:n]):
            msg: Any = (UserMessage.of(text) if i % 2 == 0
                        else AssistantMessage(content=(TextPart(text=text),)))
            entry = MessageEntry(parent_id=parent, message=msg)
            await store.append_entries("bench", [entry])
            parent = entry.id
        await store.close()  # type: ignore[attr-defined]
        size = _sqlite_bytes(Path(target)) if kind == "sqlite" else _schema_bytes(where)
        if kind == "postgres":
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {where} CASCADE")
        payload = sum(len(t.encode()) for t in texts[:n])
        out[str(n)] = {"payload_bytes": payload, "stored_bytes": size, "ratio": size / payload}
    a, b = (out[str(n)] for n in ns)
    out["marginal_ratio"] = ((b["stored_bytes"] - a["stored_bytes"])
                             / (b["payload_bytes"] - a["payload_bytes"]))
    return out


_decode = msgspec.json.Decoder().decode


def storage_format(schema: str, rows: int = 3000) -> dict[str, Any]:
    """bytea vs jsonb vs text for the entries column: size, load time, fidelity."""
    entries = []
    parent = None
    for n in range(rows):
        msg: Any = (UserMessage.of(f"question {n} " + "words " * (n % 40)) if n % 2 == 0 else
                    AssistantMessage(content=(TextPart(text="answer " * (n % 60)), ToolCall(
                        id=f"c{n}", name="search", arguments={"q": "x" * (n % 30), "k": n}))))
        e = MessageEntry(parent_id=parent, message=msg)
        parent = e.id
        entries.append(encode_entry(e))
    out: dict[str, Any] = {"rows": rows, "payload_bytes": sum(map(len, entries))}
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for col in ("bytea", "jsonb", "text"):
            table = f"{schema}.fmt_{col}"
            conn.execute(f"CREATE TABLE {table} (session_id text, seq bigint, data {col}, "
                         f"PRIMARY KEY (session_id, seq))")
            values = [(n, e if col == "bytea" else e.decode()) for n, e in enumerate(entries)]
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES ('s', %s, %s)", values)
            conn.execute(f"VACUUM ANALYZE {table}")
            size = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()
            best = float("inf")
            loaded: list[bytes] = []
            for _ in range(7):
                t0 = time.perf_counter()
                # jsonb comes back as its text form (not parsed by the driver),
                # as a store reading it for msgspec would fetch it.
                expr = "data::text" if col == "jsonb" else "data"
                cur = conn.execute(f"SELECT {expr} FROM {table} WHERE session_id = 's' "
                                   f"ORDER BY seq", binary=(col == "bytea"))
                loaded = [g if isinstance(g, bytes) else g.encode() for (g,) in cur.fetchall()]
                for line in loaded:
                    _decode(line)
                best = min(best, time.perf_counter() - t0)
            out[col] = {"table_bytes": size[0] if size else 0, "load_ms": best * 1000,
                        "byte_identical": loaded == entries}
    return out


# The append statement as issue 15 left it (text arrays, unnest), for the
# statement table: the store no longer sends it.
_TEXT_ARRAYS = ("WITH s AS (UPDATE {s}.sessions SET next_seq = next_seq + %s "
                "WHERE session_id = %s RETURNING session_id, next_seq - %s AS base) "
                "INSERT INTO {s}.entries (seq, ts, kind, session_id, entry_id, parent_id, data) "
                "SELECT s.base + e.ord, e.ts, e.kind, s.session_id, e.entry_id, e.parent_id, "
                "e.data FROM s, unnest(%s::smallint[], %s::bytea[], %s::bytea[], %s::bigint[], "
                "%s::bytea[]) WITH ORDINALITY AS e(kind, entry_id, parent_id, ts, data, ord)")


def append_statements(schema: str, rounds: int = 12, block: int = 50) -> dict[str, Any]:
    """What one append statement costs the server, per form, against the bare INSERT.

    A blocking psycopg connection with ``synchronous_commit`` off for its own
    session: every form waits for the same WAL flush, so leaving it out shows
    the statement's own cost (parse/bind of its parameters, plan, the counter
    UPDATE). Alternating blocks, the median of each form's per-entry time.
    """
    from threadline.session._postgres import _Q, _VALUES_MAX, _append_values

    where = f"{schema}_stmt"
    forms: dict[str, tuple[int, str]] = {
        "bare INSERT": (1, "INSERT INTO {s}.entries (seq, ts, kind, session_id, entry_id, "
                           "parent_id, data) VALUES (%s, %s, %s, %s, %s, %s, %s)"),
        "text arrays (before), 1 entry": (1, _TEXT_ARRAYS),
        "binary arrays, 1 entry": (1, _Q["append"]),
        "VALUES, 1 entry": (1, _append_values(1)),
    }
    for n in (_VALUES_MAX, 2 * _VALUES_MAX):
        forms[f"binary arrays, {n} entries"] = (n, _Q["append"])
        forms[f"VALUES, {n} entries"] = (n, _append_values(n))
    # Parsed and planned at every call, as behind PgBouncer's transaction
    # pooling (prepare_threshold=None); every other form is prepared, as the
    # store's are by default (S47) and psycopg's after 5 runs.
    unprepared = {"bare INSERT, not prepared": forms["bare INSERT"],
                  "VALUES, 1 entry, not prepared": forms["VALUES, 1 entry"]}
    forms.update(unprepared)
    line = encode_entry(_entry(None, 0, 0))
    code, key, _, ts, data = compact(msgspec.json.decode(line, type=MessageEntry), line)

    async def make() -> None:
        async with PostgresStore(PG_URL, schema=where) as store:
            for name in forms:
                await store.create_session(SessionRecord(id=name))

    asyncio.run(make())
    per_entry: dict[str, list[float]] = {name: [] for name in forms}
    made = 0
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            queries = {name: psycopg.sql.SQL(q).format(s=psycopg.sql.Identifier(where))
                       .as_string(conn) for name, (_, q) in forms.items()}
            for r in range(rounds):
                for name in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
                    n, query = forms[name][0], queries[name]
                    t0 = time.perf_counter()
                    prepare = None if name not in unprepared else False
                    for _ in range(block):
                        rows = [(code, (made + k).to_bytes(16), key, ts, data) for k in range(n)]
                        made += n
                        if name.startswith("bare INSERT"):
                            conn.execute(query, (made, ts, code, name, rows[0][1], key, data),
                                         prepare=prepare)
                        elif name.startswith("VALUES"):
                            conn.execute(query, [name, *(x for row in rows for x in row)],
                                         prepare=prepare)
                        else:
                            conn.execute(query, [n, name, n, *map(list, zip(*rows, strict=True))])
                    per_entry[name].append((time.perf_counter() - t0) / block / n * 1e6)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {where} CASCADE")
    floor = statistics.median(per_entry["bare INSERT"])
    return {"rounds": rounds, "block": block,
            "forms": {name: {"entries": forms[name][0], "us_per_entry": statistics.median(v),
                             "vs_bare_insert": statistics.median(v) / floor}
                      for name, v in per_entry.items()}}


def _one_process_tables(kind: str, target: str, schema: str, work: Path,
                        results: dict[str, Any]) -> None:
    print(f"{kind}: one process ...", flush=True)
    results["one_process"][kind] = asyncio.run(one_process(kind, target, schema))
    if kind == "sqlite":
        print("sqlite: tasks at once, opening ...", flush=True)
        results["sqlite_tasks"] = asyncio.run(tasks_at_once(target))
        results["sqlite_open"] = asyncio.run(opening(work))
    print(f"{kind}: bytes stored ...", flush=True)
    results["bytes"][kind] = asyncio.run(stored_bytes(kind, work, schema))


def _keep_others(results: dict[str, Any], chosen: list[str]) -> None:
    """A run of some stores keeps the others' figures from the last run."""
    if set(chosen) >= {"sqlite", "postgres", "file"} or not RESULTS.exists():
        return
    kept = json.loads(RESULTS.read_text())
    for key in ("stores", "one_process", "bytes"):
        results[key] = {**{k: v for k, v in kept.get(key, {}).items() if k not in chosen},
                        **results[key]}
    for key, v in kept.items():
        results.setdefault(key, v)


def _results_head(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "processes": args.processes, "sessions_per_process": args.sessions,
        "appends_per_session": args.appends, "floor_every": args.floor_every,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "sqlite": sqlite3.sqlite_version, "platform": platform.platform()},
        "stores": {}, "one_process": {}, "bytes": {},
        "worker_only": args.worker_only,
    }


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--appends", type=int, default=100)
    ap.add_argument("--floor-every", type=int, default=5,
                    help="one floor write after every Nth append")
    ap.add_argument("--stores", default="sqlite,postgres,file",
                    help="comma-separated: which stores to run")
    ap.add_argument("--schema-prefix", default="tl_bench",
                    help="the scratch schema's name starts with this (runs side by side "
                         "keep apart)")
    ap.add_argument("--worker-only", action="store_true",
                    help="THREADLINE_IO_URING=0 for the whole run: SQLite and file stores "
                         "write through their worker threads (S44, S46 off)")
    ap.add_argument("--file-as", choices=("store", "floor", "hop"), default="store",
                    help="in the file store's place: the floor's own write (an A/A run), "
                         "or that write on a worker thread; file only, not verified")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    chosen = args.stores.split(",")
    if args.worker_only:
        os.environ["THREADLINE_IO_URING"] = "0"  # the spawned workers inherit it

    schema = f"{args.schema_prefix}_{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix="tl-bench-", dir=os.environ.get("BENCH_DIR")))
    results = _results_head(args)
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
            results["machine"]["postgres"] = conn.info.server_version
        targets = {
            "sqlite": str(work / "bench.db"),
            "postgres": PG_URL,
            "file": str(work / "files"),
        }
        for kind, target in targets.items():
            if kind not in chosen:
                continue
            if kind == "file":
                os.makedirs(target, exist_ok=True)
            print(f"{kind}: {args.processes} x {args.sessions} x {args.appends} appends ...",
                  flush=True)
            _prepare_floor(kind, target, schema)
            file_as = args.file_as if kind == "file" else "store"
            job = {"kind": kind, "target": target, "schema": schema,
                   "sessions": args.sessions, "appends": args.appends,
                   "floor_every": args.floor_every, "file_as": file_as}
            store, floor, acked, wall = _run(job, args.processes)
            store["lost"] = (asyncio.run(_verify(kind, target, schema, acked))
                             if file_as == "store" else None)
            store["expected_entries"] = sum(map(len, acked.values()))
            results["stores"][kind if file_as == "store" else f"file:{file_as}"] = {
                "store": store, "floor": floor, "wall_s": wall,
                "p50_vs_floor": store["p50_us"] / floor["p50_us"],
                "throughput_vs_floor": store["ops_per_s"] / floor["ops_per_s"],
                "load": os.getloadavg()[0],
            }
            if kind != "file":
                _one_process_tables(kind, target, schema, work, results)
        if "postgres" in chosen:
            print("append statements ...", flush=True)
            results["postgres_append_statement"] = append_statements(schema)
            print("storage format ...", flush=True)
            results["postgres_entry_column"] = storage_format(schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        shutil.rmtree(work, ignore_errors=True)

    _print(results)  # this run's figures only
    _keep_others(results, chosen)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    if any(s["store"]["lost"] for s in results["stores"].values()):
        raise SystemExit("acknowledged entries were lost")


def _print_sqlite(r: dict[str, Any]) -> None:
    if "sqlite_tasks" in r:
        t = r["sqlite_tasks"]
        print(f"\nSQLite, one process, {t['tasks']} tasks each appending to its own session "
              f"({t['appends']} appends each), against as many bare floor writes in a row "
              f"({t['floor_us']:.0f} us each)")
        print(f"{'appends':14} {'us/append':>10} {'rate vs floor':>14} {'(min..max)':>12}")
        for name in ("grouped", "worker only"):
            g = t[name]
            lo, hi = g["ratios_min_max"]
            print(f"{name:14} {g['us_per_append']:>10.0f} {g['rate_vs_floor']:>14.2f} "
                  f"{lo:>5.2f}..{hi:<5.2f}")
    if "sqlite_open" in r:
        o = r["sqlite_open"]
        print(f"\nSQLite, opening a store + its first load of {o['entries']} entries, "
              f"alternating, against a load on an open store ({o['warm_load_us']:.0f} us)")
        print(f"{'store thread':16} {'median us':>10} {'p90 us':>8} {'min..max us':>14} "
              f"{'x warm load':>12}")
        for name in ("released thread", "new thread"):
            c = o[name]
            print(f"{name:16} {c['median_us']:>10.0f} {c['p90_us']:>8.0f} "
                  f"{c['min_us']:>6.0f}..{c['max_us']:<7.0f} {c['median_vs_warm']:>12.2f}")


def _print_one_process(r: dict[str, Any]) -> None:
    if not r["one_process"]:
        return
    print("\nOne process, one session, one entry per append, alternating blocks with "
          "the bare floor write")
    print(f"{'store':9} {'store us':>9} {'floor us':>9} {'rate vs floor':>14} "
          f"{'(min..max)':>12}")
    for kind, o in r["one_process"].items():
        lo, hi = o["ratios_min_max"]
        print(f"{kind:9} {o['store_us']:>9.0f} {o['floor_us']:>9.0f} "
              f"{o['rate_vs_floor']:>14.2f} {lo:>5.2f}..{hi:<5.2f}")
        for key, what, ratio, versus in (
                ("floor_async", "the floor's INSERT on an AsyncConnection", "rate_vs_floor_async",
                 "store rate {:.2f}x"),
                ("floor_hop", "the floor write on the store's thread, through its hop",
                 "rate_vs_floor_hop", "store rate {:.2f}x"),
                ("worker", "the store on its worker thread only (io_uring off)",
                 "worker_rate_vs_floor", "rate {:.2f}x the floor")):
            if f"{key}_us" in o:
                print(f"{'':9} {what}: {o[f'{key}_us']:.0f} us, {versus.format(o[ratio])}")
        if "load" in o:
            print(f"{'':9} load average (1 min) after the table: {o['load']:.2f}")


def _print(r: dict[str, Any]) -> None:
    print(f"\n{r['processes']} processes x {r['sessions_per_process']} sessions x "
          f"{r['appends_per_session']} appends, one entry per append\n")
    head = (f"{'store':10} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'lost':>5} | "
            f"{'floor/s':>9} {'floor p50':>9} {'floor p99':>9} | {'p50 x floor':>11} "
            f"{'rate vs floor':>13}")
    print(head)
    print("-" * len(head))
    for kind, s in r["stores"].items():
        st, fl = s["store"], s["floor"]
        lost = "-" if st["lost"] is None else st["lost"]
        print(f"{kind:10} {st['ops_per_s']:>10,.0f} {st['p50_us'] / 1000:>8.2f} "
              f"{st['p99_us'] / 1000:>8.2f} {lost:>5} | {fl['ops_per_s']:>9,.0f} "
              f"{fl['p50_us'] / 1000:>9.2f} {fl['p99_us'] / 1000:>9.2f} | "
              f"{s['p50_vs_floor']:>11.2f} {s['throughput_vs_floor']:>13.2f}"
              + (f"   (load {s['load']:.1f})" if "load" in s else ""))
    _print_one_process(r)
    _print_sqlite(r)
    if r["bytes"]:
        print("\nBytes stored / raw payload, bench/peers.py workload (400-char base64 messages)")
        for kind, b in r["bytes"].items():
            sizes = "  ".join(f"N={n}: {v['ratio']:.3f}x" for n, v in b.items()
                              if isinstance(v, dict))
            print(f"{kind:9} {sizes}  each further entry: {b['marginal_ratio']:.3f}x")
    if "postgres_append_statement" in r:
        print("\nPostgreSQL append statement, server cost per entry (synchronous_commit off, "
              "alternating blocks)")
        print(f"{'form':32} {'us/entry':>9} {'x bare INSERT':>14}")
        for name, st in r["postgres_append_statement"]["forms"].items():
            print(f"{name:32} {st['us_per_entry']:>9.0f} {st['vs_bare_insert']:>14.2f}")
    if "postgres_entry_column" not in r:
        return
    f = r["postgres_entry_column"]
    print(f"\nPostgreSQL entry column, {f['rows']} entries ({f['payload_bytes']:,} bytes of "
          f"JSON), one session:")
    print(f"{'type':6} {'table+index bytes':>18} {'load ms':>8} {'byte-identical':>15}")
    for col in ("bytea", "text", "jsonb"):
        c = f[col]
        print(f"{col:6} {c['table_bytes']:>18,} {c['load_ms']:>8.2f} "
              f"{c['byte_identical']!s:>15}")


if __name__ == "__main__":
    main()
