"""Loading a session from the SQL stores: the store against its SELECT.

One session of N entries of ``bench/peers.py``'s workload (400-character
messages of random base64, user and assistant in turn) per store, N = 800
and 10,000. Three ways to read it, in rounds whose order rotates:

- **floor**: a new connection (``sqlite3`` / psycopg's async connection)
  running the store's own SELECT, fetching every row and decoding each row's
  ``data`` once with msgspec (the message text), then closing it;
- **by line**: the store's ``load_entries`` with the load path before rows were
  decoded directly (S37), which rebuilt each row's line and decoded it (kept below as
  ``decode_by_line``, swapped in for the round);
- **direct**: the store's ``load_entries`` as it is now.

Each is timed *cold* (a new store or connection per load, as ``bench/peers.py``
does) and *warm* (one open store or connection, load only). Every figure is
the median over the rounds of (time / that round's floor time).

A last table times the decode alone, per row, on rows fetched once: the
peers workload (single-text rows, kinds 6 and 7) and a session of assistant
messages with a tool call each (kind 1), against one msgspec decode of each
row's data (as a string, or as an untyped object).

    .venv/bin/python bench/sql_load.py [--rounds 21]

Writes ``bench/results/sql_load.json``. Needs the PostgreSQL server of
``THREADLINE_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test);
it works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import random
import secrets
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import psycopg

import threadline.session._postgres as pg_module
import threadline.session._sqlite as sqlite_module
from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.errors import CorruptLog
from threadline.session import MessageEntry, PostgresStore, SessionRecord, SQLiteStore
from threadline.session._codec import decode_entry
from threadline.session._rows import KINDS, VERBATIM, _header, _row_where, decode_compact, id_text
from threadline.session._store import EntryLog
from threadline.session._storekit import from_micros

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results" / "sql_load.json"
NS = (800, 10_000)


def decode_by_line(rows: Iterable[Sequence[Any]], session_id: str, where: str) -> EntryLog:
    """The load path before the direct decode: each row's line rebuilt, then decoded."""
    log = EntryLog()
    texts: dict[bytes, str] = {}
    for row in rows:
        seq, kind, key, parent, ts, data = row
        if seq is None:
            break
        try:
            if kind == VERBATIM:
                line = bytes(data)
            else:
                if ts is None or not 0 < kind < len(KINDS):
                    raise ValueError(f"kind {kind} is not a row this version wrote")
                key = bytes(key)
                text = texts.get(key) or texts.setdefault(key, id_text(key))
                if parent is None:
                    parent_text = None
                else:
                    parent = bytes(parent)
                    parent_text = texts.get(parent) or id_text(parent)
                line = (_header(kind, text, parent_text, from_micros(ts)) + bytes(data)
                        + KINDS[kind][2])
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptLog(f"not a stored entry: {exc}", session_id=session_id,
                             path=_row_where(where, session_id, seq)) from exc
        log.append(decode_entry(line, session_id=session_id))
    return log


def _texts(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [base64.b64encode(rng.randbytes(300)).decode() for _ in range(count)]


def _entries(n: int) -> list[MessageEntry]:
    entries = []
    parent = None
    for i, text in enumerate(_texts(n)):
        msg: Any = (UserMessage.of(text) if i % 2 == 0
                    else AssistantMessage(content=(TextPart(text=text),)))
        entry = MessageEntry(parent_id=parent, message=msg)
        entries.append(entry)
        parent = entry.id
    return entries


def _tool_entries(n: int) -> list[MessageEntry]:
    entries = []
    parent = None
    for i, text in enumerate(_texts(n)):
        entry = MessageEntry(parent_id=parent, message=AssistantMessage(content=(
            TextPart(text=text[:200]),
            ToolCall(id=f"call_{i}", name="search", arguments={"q": text[200:260], "k": i}))))
        entries.append(entry)
        parent = entry.id
    return entries


_decode = msgspec.json.Decoder(str).decode
_decode_any = msgspec.json.Decoder().decode


def _floor_decode(rows: list[tuple[Any, ...]]) -> int:
    # The least that gets the text out of a row: one decode of its data.
    return len([_decode(b'"' + r[5] + b'"') for r in rows if r[0] is not None])


Timer = Callable[[], Awaitable[int]]


async def _rounds(ways: dict[str, Timer], rounds: int) -> dict[str, Any]:
    """Median over rounds of each way's time over the floor's; the order rotates."""
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            count = await ways[name]()
            times[name].append(time.perf_counter() - t0)
            assert count > 0
    out: dict[str, Any] = {}
    for name in names:
        ratios = [t / f for t, f in zip(times[name], times["floor"], strict=True)]
        out[name] = {"ms": statistics.median(times[name]) * 1000,
                     "best_ms": min(times[name]) * 1000,
                     "vs_floor": statistics.median(ratios),
                     "vs_floor_min_max": [min(ratios), max(ratios)]}
    out["direct_vs_by_line"] = statistics.median(
        [d / b for d, b in zip(times["direct"], times["by_line"], strict=True)])
    return out


def _swap(path: Callable[..., EntryLog]) -> None:
    sqlite_module.decode_compact = path  # type: ignore[assignment]
    pg_module.decode_compact = path  # type: ignore[assignment]


def _with(path: Callable[..., EntryLog], load: Callable[[], Awaitable[int]]) -> Timer:
    async def run() -> int:
        _swap(path)
        try:
            return await load()
        finally:
            _swap(decode_compact)
    return run


async def sqlite_load(work: Path, n: int, rounds: int) -> dict[str, Any]:
    path = work / f"load-{n}.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="bench"))
    entries = _entries(n)
    for i in range(0, n, 500):
        await store.append_entries("bench", entries[i:i + 500])
    query = (f"SELECT {sqlite_module._ROW} FROM sessions s LEFT JOIN entries e "
             "ON e.session = s.key WHERE s.id = ? ORDER BY e.seq")
    want = await store.load_entries("bench")
    assert want == entries and decode_by_line(
        sqlite3.connect(path).execute(query, ("bench",)).fetchall(), "bench", "x") == want

    async def floor_cold() -> int:
        conn = sqlite3.connect(path)
        try:
            return _floor_decode(conn.execute(query, ("bench",)).fetchall())
        finally:
            conn.close()

    async def store_cold() -> int:
        s = SQLiteStore(path)
        try:
            return len(await s.load_entries("bench"))
        finally:
            await s.close()

    warm_conn = sqlite3.connect(path)

    async def floor_warm() -> int:
        return _floor_decode(warm_conn.execute(query, ("bench",)).fetchall())

    async def store_warm() -> int:
        return len(await store.load_entries("bench"))

    out = {"cold": await _rounds({"floor": floor_cold,
                                  "by_line": _with(decode_by_line, store_cold),
                                  "direct": _with(decode_compact, store_cold)}, rounds),
           "warm": await _rounds({"floor": floor_warm,
                                  "by_line": _with(decode_by_line, store_warm),
                                  "direct": _with(decode_compact, store_warm)}, rounds)}
    warm_conn.close()
    await store.close()
    return out


async def postgres_load(schema: str, n: int, rounds: int) -> dict[str, Any]:
    where = f"{schema}_l{n}"
    store = PostgresStore(PG_URL, schema=where, min_size=1, max_size=1)
    await store.create_session(SessionRecord(id="bench"))
    entries = _entries(n)
    for i in range(0, n, 500):
        await store.append_entries("bench", entries[i:i + 500])
    query = store._q["load"]
    assert await store.load_entries("bench") == entries

    async def fetch(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query, ("bench",), binary=True)
        return await cur.fetchall()

    async def floor_cold() -> int:
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
        try:
            return _floor_decode(await fetch(conn))
        finally:
            await conn.close()

    async def store_cold() -> int:
        async with PostgresStore(PG_URL, schema=where, min_size=1, max_size=1) as s:
            return len(await s.load_entries("bench"))

    warm_conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)

    async def floor_warm() -> int:
        return _floor_decode(await fetch(warm_conn))

    async def store_warm() -> int:
        return len(await store.load_entries("bench"))

    try:
        return {"cold": await _rounds({"floor": floor_cold,
                                       "by_line": _with(decode_by_line, store_cold),
                                       "direct": _with(decode_compact, store_cold)}, rounds),
                "warm": await _rounds({"floor": floor_warm,
                                       "by_line": _with(decode_by_line, store_warm),
                                       "direct": _with(decode_compact, store_warm)}, rounds)}
    finally:
        await warm_conn.close()
        await store.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {where} CASCADE")


async def decode_only(work: Path, rounds: int, n: int = 800) -> dict[str, Any]:
    """Per row: decode_by_line and decode_compact of rows fetched once, against
    one msgspec decode of each row's data."""
    out: dict[str, Any] = {}
    for name, entries in (("text (kinds 6, 7)", _entries(n)), ("tool call (kind 1)",
                                                               _tool_entries(n))):
        path = work / f"decode-{len(out)}.db"
        store = SQLiteStore(path)
        await store.create_session(SessionRecord(id="bench"))
        await store.append_entries("bench", entries)
        await store.close()
        with sqlite3.connect(path) as conn:
            rows = conn.execute(f"SELECT {sqlite_module._ROW} FROM entries e "
                                "ORDER BY e.seq").fetchall()
        kinds = sorted({r[1] for r in rows})
        assert decode_compact(rows, "bench", "x") == decode_by_line(rows, "bench", "x") == entries

        async def floor(rows: list[tuple[Any, ...]] = rows) -> int:
            if rows[0][1] in (6, 7):
                return len([_decode(b'"' + r[5] + b'"') for r in rows])
            return len([_decode_any(b"{" + r[5][1:]) for r in rows])

        async def by_line(rows: list[tuple[Any, ...]] = rows) -> int:
            return len(decode_by_line(rows, "bench", "x"))

        async def direct(rows: list[tuple[Any, ...]] = rows) -> int:
            return len(decode_compact(rows, "bench", "x"))

        got = await _rounds({"floor": floor, "by_line": by_line, "direct": direct}, rounds * 2)
        for way in ("floor", "by_line", "direct"):
            # The best round: on a loaded machine a median of times mostly
            # measures how often the process was descheduled.
            got[way]["us_per_row"] = got[way]["best_ms"] * 1000 / n
        out[name] = {"kinds": kinds, **got}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    chosen = args.stores.split(",")
    results: dict[str, Any] = {
        "rounds": args.rounds, "workload": "bench/peers.py texts, user/assistant in turn",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "sqlite": sqlite3.sqlite_version, "platform": platform.platform()},
        "stores": {}}
    work = Path(tempfile.mkdtemp(prefix="tl-load-", dir=os.environ.get("BENCH_DIR")))
    schema = f"tl_load_{secrets.token_hex(4)}"
    try:
        for n in NS:
            # Fewer rounds of the big session: each is 12 times the work.
            rounds = args.rounds if n < 5000 else max(5, args.rounds // 2)
            if "sqlite" in chosen:
                print(f"sqlite N={n} ...", flush=True)
                results["stores"].setdefault("sqlite", {})[str(n)] = await sqlite_load(
                    work, n, rounds)
            if "postgres" in chosen:
                print(f"postgres N={n} ...", flush=True)
                results["stores"].setdefault("postgres", {})[str(n)] = await postgres_load(
                    schema, n, rounds)
        print("decode only ...", flush=True)
        results["decode_only"] = await decode_only(work, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _print(r: dict[str, Any]) -> None:
    print(f"\nLoad of one session, median of {r['rounds']} rounds (N=10,000: fewer), "
          f"each time over its round's floor\n")
    head = (f"{'store':9} {'N':>6} {'':5} {'floor ms':>9} {'by line ms':>11} {'direct ms':>10} "
            f"{'by line/floor':>14} {'direct/floor':>13} {'direct/by line':>15}")
    print(head)
    print("-" * len(head))
    for kind, by_n in r["stores"].items():
        for n, both in by_n.items():
            for temp in ("cold", "warm"):
                x = both[temp]
                print(f"{kind:9} {int(n):>6} {temp:5} {x['floor']['ms']:>9.2f} "
                      f"{x['by_line']['ms']:>11.2f} {x['direct']['ms']:>10.2f} "
                      f"{x['by_line']['vs_floor']:>13.2f}x {x['direct']['vs_floor']:>12.2f}x "
                      f"{x['direct_vs_by_line']:>14.2f}x")
    print("\nDecode only, 800 rows fetched once, us per row (best round), each over the "
          "floor (median of rounds): "
          "one msgspec decode of each row's data")
    print(f"{'rows':20} {'floor':>6} {'by line':>8} {'direct':>7} {'by line/floor':>14} "
          f"{'direct/floor':>13} {'direct/by line':>15}")
    for name, x in r["decode_only"].items():
        print(f"{name:20} {x['floor']['us_per_row']:>6.2f} {x['by_line']['us_per_row']:>8.2f} "
              f"{x['direct']['us_per_row']:>7.2f} {x['by_line']['vs_floor']:>13.2f}x "
              f"{x['direct']['vs_floor']:>12.2f}x {x['direct_vs_by_line']:>14.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--stores", default="sqlite,postgres")
    args = ap.parse_args()
    results = asyncio.run(run(args))
    _print(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
