"""How soon a watcher sees an entry another process appended (S26), per store.

A child process appends ``--entries`` entries one per ``append_entries``,
pausing ``--pause`` ms between them, and notes when each append started and
when it returned. The parent follows the session with ``watch()`` and notes
when each entry arrives. Both use ``time.monotonic`` (CLOCK_MONOTONIC, one
clock for every process on the machine).

- delivery: from the start of the append to the entry reaching the watcher;
- the store's own append latency, measured in the same run, is the floor:
  an entry cannot arrive before it is stored.

The file store and SQLite poll (``watch_interval``, 50 ms by default), so
their delivery is about half the interval; PostgreSQL and the memory store
(same process) are woken.

    .venv/bin/python bench/watch.py [--entries 500 --pause 2]

Writes ``bench/results/watch.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from threadline.ai._messages import UserMessage
from threadline.session import (
    FileStore,
    MemoryStore,
    MessageEntry,
    PostgresStore,
    SessionRecord,
    SQLiteStore,
    Store,
    WatchableStore,
)

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "watch.json"


def _open(kind: str, target: str, schema: str) -> Store:
    if kind == "file":
        return FileStore(target)
    if kind == "sqlite":
        return SQLiteStore(target)
    return PostgresStore(target, schema=schema, max_size=2, prepare_threshold=None,
                         listen_url=PG_URL)


async def _append(store: Store, sid: str, count: int, pause: float) -> dict[str, list[float]]:
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
        store = _open(job["kind"], job["target"], job["schema"])
        out.put(await _append(store, job["sid"], job["count"], job["pause"]))
        await store.close()  # type: ignore[attr-defined]

    asyncio.run(run())


async def _watch(store: WatchableStore, sid: str, count: int) -> dict[str, float]:
    seen: dict[str, float] = {}
    watch = store.watch(sid)
    async for entry in watch:
        seen[entry.id] = time.monotonic()
        if len(seen) == count:
            break
    await watch.aclose()  # type: ignore[attr-defined]
    return seen


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] * 1e6


async def measure(kind: str, target: str, schema: str, count: int, pause: float) -> dict[str, Any]:
    sid = f"watch-{secrets.token_hex(4)}"
    if kind == "memory":
        store: Any = MemoryStore()
        await store.create_session(SessionRecord(id=sid))
        watcher = asyncio.ensure_future(_watch(store, sid, count))
        times = await _append(store, sid, count, pause)
        seen = await watcher
    else:
        store = _open(kind, target, schema)
        await store.create_session(SessionRecord(id=sid))
        watcher = asyncio.ensure_future(_watch(store, sid, count))
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        job = {"kind": kind, "target": target, "schema": schema, "sid": sid, "count": count,
               "pause": pause}
        proc = ctx.Process(target=_child, args=(job, out))
        proc.start()
        times = await asyncio.to_thread(out.get, True, 600)
        await asyncio.to_thread(proc.join)
        seen = await watcher
        await store.close()
    assert list(seen) == list(times), "watch skipped, repeated or reordered an entry"
    delivery = [seen[i] - t0 for i, (t0, _) in times.items()]
    append = [t1 - t0 for t0, t1 in times.values()]
    return {
        "entries": count,
        "delivery_p50_us": _pct(delivery, 0.5), "delivery_p99_us": _pct(delivery, 0.99),
        "append_p50_us": _pct(append, 0.5), "append_p99_us": _pct(append, 0.99),
        "p50_ratio_to_append": _pct(delivery, 0.5) / _pct(append, 0.5),
        "p99_ratio_to_append": _pct(delivery, 0.99) / _pct(append, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=500)
    parser.add_argument("--pause", type=float, default=2.0, help="ms between appends")
    args = parser.parse_args()
    pause = args.pause / 1000
    tmp = Path(tempfile.mkdtemp(prefix="tl-watch-bench-"))
    schema = f"tl_watch_{secrets.token_hex(4)}"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pgbouncer import PgBouncer  # the tests' runner of a private PgBouncer

    bouncer = PgBouncer()
    bouncer.start()
    results: dict[str, Any] = {
        "entries": args.entries, "pause_ms": args.pause,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "load_average_at_start": os.getloadavg()},
        "stores": {},
    }
    try:
        stores = [("memory", ""), ("file", str(tmp / "files")),
                  ("sqlite", str(tmp / "db.sqlite")), ("postgres", PG_URL),
                  ("postgres via pgbouncer", bouncer.url)]
        for kind, target in stores:
            opener = "postgres" if kind.startswith("postgres") else kind
            r = asyncio.run(measure(opener, target, schema, args.entries, pause))
            results["stores"][kind] = r
    finally:
        bouncer.close()
        shutil.rmtree(tmp, ignore_errors=True)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(f"{'store':<24}{'delivery p50 µs':>16}{'p99 µs':>10}{'append p50 µs':>15}"
          f"{'p99 µs':>10}{'p50 x append':>14}{'p99 x append':>14}")
    for kind, r in results["stores"].items():
        print(f"{kind:<24}{r['delivery_p50_us']:>16.0f}{r['delivery_p99_us']:>10.0f}"
              f"{r['append_p50_us']:>15.0f}{r['append_p99_us']:>10.0f}"
              f"{r['p50_ratio_to_append']:>14.2f}{r['p99_ratio_to_append']:>14.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
