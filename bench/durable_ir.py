"""Instruction counts per message for bench/durable.py's runs, stable under machine load.

Wall and CPU times on a shared machine move with whatever else runs; the
instructions a run executes do not. Under callgrind, the difference between
a setup run ``1 + K`` times and run once, divided by ``K`` times the messages,
is that setup's instructions per message; the warm-up runs and the start of
the interpreter cancel out.

    .venv/bin/python bench/durable_ir.py              # every setup: table + JSON
    .venv/bin/python bench/durable_ir.py --runs 2     # fewer repetitions (faster)
    .venv/bin/python bench/durable_ir.py 4 3          # one setup, 3 runs (for valgrind)

The setups: ``bare`` (the loop alone, the floor every ratio is to); the
breakdown steps of bench/durable.py by number (``0``-``4``, each adding one
part back, ``4`` the full durable run on the memory store); ``ledger`` (the
memory run with a side-effect tool in the loop, never called: the effect
ledger's path for every call); ``file`` (the durable run on a ``FileStore``
with fsync) and ``appends`` (the same appends, one entry per call, on that
store with no agent), so that ``file - bare - appends`` is what the agent adds
around its file appends. Needs ``valgrind`` on the PATH; runs under
``PYTHONHASHSEED=0`` so dictionaries lay out alike in every run.

Writes bench/results/durable_ir.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import durable as bench  # bench/durable.py, next to this file

from threadline import durable
from threadline.session import FileStore, MemoryStore, SessionRecord
from threadline.session._ids import new_id

RESULTS = Path(__file__).resolve().parent / "results" / "durable_ir.json"
SETUPS = ["bare", "0", "1", "2", "3", "4", "ledger", "file", "appends"]


async def _stored_entries() -> list[Any]:
    agent = await durable.open(bench.make_loop, store=MemoryStore())
    await agent.run(bench.INPUT).collect()
    return list(agent.entries)


async def one(setup: str, root: Path, entries: list[Any]) -> None:
    if setup == "bare":
        await bench.cpu_bare()
    elif setup == "ledger":
        await bench.cpu_durable(MemoryStore(), bench.make_ledger_loop)
    elif setup == "file":
        await bench.cpu_durable(FileStore(root))
    elif setup == "appends":
        store = FileStore(root)
        session_id = new_id()
        await store.create_session(SessionRecord(id=session_id))
        for entry in entries:
            await store.append_entries(session_id, [entry])
    else:
        _, off, make_store = bench.BREAKDOWN_STEPS[int(setup)]
        with bench._without(*off):
            await bench.cpu_durable(make_store())


async def run_setup(setup: str, runs: int) -> None:
    entries = await _stored_entries() if setup == "appends" else []
    with tempfile.TemporaryDirectory(prefix="threadline-ir-") as tmp:
        for _ in range(2):
            await one(setup, Path(tmp), entries)
        gc.collect()
        for _ in range(runs):
            await one(setup, Path(tmp), entries)


def _collected(setup: str, runs: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, setup, str(runs)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _count(proc: subprocess.Popen[str]) -> int:
    _, err = proc.communicate()
    found = re.search(r"Collected : (\d+)", err)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed:\n{err[-2000:]}")
    return int(found.group(1))


def table(extra_runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="threadline-pyc-") as pyc:
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPYCACHEPREFIX": pyc}
        per_message: dict[str, float] = {}
        for setup in SETUPS:
            # Once outside valgrind: every module is compiled before either count.
            subprocess.run([sys.executable, __file__, setup, "1"], env=env, check=True)
            once, more = _collected(setup, 1, env), _collected(setup, 1 + extra_runs, env)
            per_message[setup] = (_count(more) - _count(once)) / (extra_runs * bench.MESSAGES)
            print(f"  {setup}: {per_message[setup]:,.0f}", file=sys.stderr)
    bare = per_message["bare"]
    steps: dict[str, float] = {}
    before = bare
    for index, (label, _, _) in enumerate(bench.BREAKDOWN_STEPS):
        steps[label] = per_message[str(index)] - before
        before = per_message[str(index)]
    around = per_message["file"] - bare - per_message["appends"]
    ratios = {
        "durable_memory / bare": per_message["4"] / bare,
        "hand-off alone / bare": per_message["0"] / bare,
        "durable_memory with a ledger / bare": per_message["ledger"] / bare,
        "durable_file_fsync / (bare + its appends alone)":
            per_message["file"] / (bare + per_message["appends"]),
    }
    print(f"{bench.MESSAGES} messages; instructions per message (callgrind, "
          f"{extra_runs} runs counted)")
    print(f"{'bare loop':<52} {bare:>10,.0f}")
    for label, value in steps.items():
        print(f"{'+ ' + label:<52} {value:>10,.0f}")
    print(f"{'= durable run, memory store':<52} {per_message['4']:>10,.0f}")
    print(f"{'the same run, a side-effect tool in the loop':<52} {per_message['ledger']:>10,.0f}")
    print(f"{'durable run, file store (fsync)':<52} {per_message['file']:>10,.0f}")
    print(f"{'its appends alone, no agent':<52} {per_message['appends']:>10,.0f}")
    print(f"{'agent around its file appends':<52} {around:>10,.0f}")
    for name, value in ratios.items():
        print(f"{name:<52} {value:>9.3f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "messages": bench.MESSAGES,
        "runs_counted": extra_runs,
        "instructions_per_message": {k: round(v) for k, v in per_message.items()},
        "steps": {k: round(v) for k, v in steps.items()},
        "agent_around_file_appends": round(around),
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in SETUPS:
        asyncio.run(run_setup(sys.argv[1], int(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs counted per setup")
    args = parser.parse_args()
    table(args.runs)


if __name__ == "__main__":
    main()
