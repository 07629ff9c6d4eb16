"""``bench/peers.py``'s SQLite cold load, sampled many times, old and new load path.

``peers.py`` takes one cold load per (system, N, repetition), too few to read
a difference of a millisecond on a shared machine. This stores each
conversation once per system with ``peers.py``'s own adapters and workload,
then takes many cold loads of it, the systems in rotating turns:
LangGraph ``SqliteSaver`` (``update_state`` per message), the OpenAI Agents
SDK's ``SQLiteSession``, and threadline's SQLite store twice, loading by line
(the path before typed rows decoded straight into entries, swapped in from
``bench/sql_load.py``) and directly. Figures: the median of each system's
time over LangGraph's in the same turn.

Needs ``peers.py``'s environment:

    bench/.venv/bin/python bench/peers_cold.py [--n 100 --n 400 --n 800] [--samples 24]

Writes ``bench/results/peers_cold.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
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


async def run(ns: list[int], samples: int) -> dict[str, Any]:
    peers = _peers()
    texts = peers.make_payloads(max(ns) + 2)
    work = Path(tempfile.mkdtemp(prefix="tl-peers-cold-"))
    out: dict[str, Any] = {}
    for n in ns:
        adapters = {
            "langgraph-sqlite-update": peers.LangGraphAdapter("sqlite", "update",
                                                              work / f"lg{n}", None),
            "openai-agents-sqlite": peers.AgentsAdapter(work / f"oa{n}"),
            "threadline-sqlite": peers.ThreadlineAdapter("sqlite", work / f"tl{n}", None),
        }
        for a in adapters.values():
            a.workdir.mkdir()
            await a.open(n)
            for start in range(0, n, a.step):
                await a.append(texts[start:start + a.step], start)
        tl = adapters["threadline-sqlite"].cold_load
        ways: dict[str, tuple[Callable[[], Awaitable[Any]], Any]] = {
            "langgraph-sqlite-update": (adapters["langgraph-sqlite-update"].cold_load, None),
            "openai-agents-sqlite": (adapters["openai-agents-sqlite"].cold_load, None),
            "threadline-sqlite by line": (tl, decode_by_line),
            "threadline-sqlite direct": (tl, decode_compact),
        }
        names = list(ways)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(samples):
            for name in names[r % len(names):] + names[:r % len(names)]:
                load, path = ways[name]
                if path is not None:
                    sqlite_module.decode_compact = path  # type: ignore[assignment]
                try:
                    timed = await load()
                finally:
                    sqlite_module.decode_compact = decode_compact  # type: ignore[assignment]
                if timed.texts != list(texts[:n]):
                    raise SystemExit(f"{name} N={n}: cold load read back other messages")
                times[name].append(timed.seconds * 1000)
        for a in adapters.values():
            await a.close()
        floor = times["langgraph-sqlite-update"]
        out[str(n)] = {name: {
            "median_ms": statistics.median(t), "best_ms": min(t),
            "vs_langgraph": statistics.median([x / f for x, f in zip(t, floor, strict=True)]),
        } for name, t in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--samples", type=int, default=24)
    args = ap.parse_args()
    ns = args.n or [100, 400, 800]
    results = {"samples": args.samples, "results": asyncio.run(run(ns, args.samples)),
               "loadavg_at_end": os.getloadavg()}
    print(f"\nCold load, {args.samples} samples each, systems in turn\n")
    print(f"{'system':28} {'N':>5} {'median ms':>10} {'best ms':>8} {'vs LangGraph':>13}")
    for n, by_system in results["results"].items():
        for name, x in by_system.items():
            print(f"{name:28} {n:>5} {x['median_ms']:>10.2f} {x['best_ms']:>8.2f} "
                  f"{x['vs_langgraph']:>12.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
