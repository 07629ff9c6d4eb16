"""``bench/peers.py``'s SQLite cold load, sampled many times, old and new load path.

``peers.py`` takes one cold load per (system, N, repetition), too few to read
a difference of a millisecond on a shared machine. This stores each
conversation once per system with ``peers.py``'s own adapters and workload,
then takes many cold loads of it, the systems in rotating turns:
LangGraph ``SqliteSaver`` (``update_state`` per message), the OpenAI Agents
SDK's ``SQLiteSession``, and threadline's SQLite store twice, loading by line
(the path before typed rows decoded straight into entries, swapped in from
``bench/sql_load.py``) and directly. ``--postgres`` does the same for
LangGraph's ``PostgresSaver`` and threadline's PostgreSQL store (N = 50,
200, 800 unless told), in ``peers.py``'s database. Figures: the median of
each system's time over LangGraph's in the same turn.

Needs ``peers.py``'s environment:

    bench/.venv/bin/python bench/peers_cold.py [--n 100 --n 400 --n 800] [--samples 24]
    bench/.venv/bin/python bench/peers_cold.py --postgres [--pg-url URL]

Writes ``bench/results/peers_cold.json`` (``--postgres``: ``peers_cold_postgres.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import threadline.session._sqlite as sqlite_module
from threadline.session._rows import decode_compact

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from sql_load import decode_by_line  # noqa: E402

RESULTS = HERE / "results" / "peers_cold.json"


def _peers() -> Any:
    spec = importlib.util.spec_from_file_location("peers", HERE / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = module
    spec.loader.exec_module(module)
    return module


def _sqlite_adapters(peers: Any, work: Path, n: int) -> dict[str, Any]:
    return {
        "langgraph-sqlite-update": peers.LangGraphAdapter("sqlite", "update", work / f"lg{n}",
                                                          None),
        "openai-agents-sqlite": peers.AgentsAdapter(work / f"oa{n}"),
        "threadline-sqlite": peers.ThreadlineAdapter("sqlite", work / f"tl{n}", None),
    }


Ways = dict[str, tuple[Any, Callable[..., Any] | None]]
"""Each way's adapter, and the load path swapped in for its turn (None: as it is)."""


def _sqlite_ways(adapters: dict[str, Any]) -> Ways:
    tl = adapters["threadline-sqlite"]
    return {
        "langgraph-sqlite-update": (adapters["langgraph-sqlite-update"], None),
        "openai-agents-sqlite": (adapters["openai-agents-sqlite"], None),
        "threadline-sqlite by line": (tl, decode_by_line),
        "threadline-sqlite direct": (tl, decode_compact),
    }


def _postgres_adapters(peers: Any, work: Path, n: int, pg: Any) -> dict[str, Any]:
    adapters = {
        "langgraph-postgres-update": peers.LangGraphAdapter("postgres", "update",
                                                            work / f"lg{n}", pg),
        "threadline-postgres": peers.ThreadlineAdapter("postgres", work / f"tl{n}", pg),
    }
    tag = secrets.token_hex(3)  # the schemas follow the name: concurrent runs stay apart
    for a in adapters.values():
        a.name = f"{a.name}-{tag}"
    return adapters


def _postgres_ways(adapters: dict[str, Any]) -> Ways:
    return {name: (a, None) for name, a in adapters.items()}


async def _let_go(adapter: Any) -> None:
    """Close what a cold load opened (untimed), keeping the adapter's first store or
    connection, so many samples do not pile up server connections."""
    for store in getattr(adapter, "_stores", [])[1:]:
        await store.close()
    for conn in getattr(adapter, "_conns", [])[1:]:
        conn.close()
    for kept in ("_stores", "_conns"):
        if hasattr(adapter, kept):
            del getattr(adapter, kept)[1:]


async def run(ns: list[int], samples: int, pg_url: str | None = None) -> dict[str, Any]:
    peers = _peers()
    texts = peers.make_payloads(max(ns) + 2)
    work = Path(tempfile.mkdtemp(prefix="tl-peers-cold-"))
    pg = None
    if pg_url is not None:
        pg = peers.Postgres(pg_url)
        pg.prepare()
    out: dict[str, Any] = {}
    for n in ns:
        adapters = (_sqlite_adapters(peers, work, n) if pg is None
                    else _postgres_adapters(peers, work, n, pg))
        for a in adapters.values():
            a.workdir.mkdir()
            await a.open(n)
            for start in range(0, n, a.step):
                await a.append(texts[start:start + a.step], start)
        ways = _sqlite_ways(adapters) if pg is None else _postgres_ways(adapters)
        names = list(ways)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(samples):
            for name in names[r % len(names):] + names[:r % len(names)]:
                adapter, path = ways[name]
                if path is not None:
                    sqlite_module.decode_compact = path  # type: ignore[assignment]
                try:
                    timed = await adapter.cold_load()
                finally:
                    sqlite_module.decode_compact = decode_compact  # type: ignore[assignment]
                if timed.texts != list(texts[:n]):
                    raise SystemExit(f"{name} N={n}: cold load read back other messages")
                times[name].append(timed.seconds * 1000)
                await _let_go(adapter)
        for a in adapters.values():
            await a.close()
        floor = times["langgraph-sqlite-update" if pg is None else "langgraph-postgres-update"]
        out[str(n)] = {name: {
            "median_ms": statistics.median(t), "best_ms": min(t),
            "vs_langgraph": statistics.median([x / f for x, f in zip(t, floor, strict=True)]),
        } for name, t in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--postgres", action="store_true",
                    help="PostgresSaver against threadline's PostgreSQL store")
    ap.add_argument("--pg-url", default=None, help="default: peers.py's")
    args = ap.parse_args()
    ns = args.n or ([50, 200, 800] if args.postgres else [100, 400, 800])
    pg_url = (args.pg_url or _peers().DEFAULT_PG) if args.postgres else None
    results = {"samples": args.samples, "backend": "postgres" if args.postgres else "sqlite",
               "results": asyncio.run(run(ns, args.samples, pg_url)),
               "loadavg_at_end": os.getloadavg()}
    print(f"\nCold load, {args.samples} samples each, systems in turn\n")
    print(f"{'system':28} {'N':>5} {'median ms':>10} {'best ms':>8} {'vs LangGraph':>13}")
    for n, by_system in results["results"].items():
        for name, x in by_system.items():
            print(f"{name:28} {n:>5} {x['median_ms']:>10.2f} {x['best_ms']:>8.2f} "
                  f"{x['vs_langgraph']:>12.2f}x")
    out = RESULTS.with_name("peers_cold_postgres.json") if args.postgres else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
