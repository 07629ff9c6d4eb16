"""Instruction counts for bench/durable.py's breakdown, stable under machine load.

Runs one setup of the breakdown (``bare``, or a step number 0-4 of
``BREAKDOWN_STEPS``: each step adds one part back) twice as warm-up, then
``runs`` times. Under callgrind the difference between two run counts,
divided by the messages, is the setup's instructions per message; other jobs
on the machine do not change it::

    for k in 1 3; do
      valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/durable_ir.py 4 $k 2>&1 | grep Collected
    done
    # (Collected at 3 - Collected at 1) / (2 * 200) = instructions per message

Set PYTHONPYCACHEPREFIX to a fresh directory and run each setup once before
measuring, so that no run compiles modules the other did not.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import durable as bench  # bench/durable.py, next to this file


async def one(setup: str) -> None:
    if setup == "bare":
        await bench.cpu_bare()
        return
    _, off, make_store = bench.BREAKDOWN_STEPS[int(setup)]
    with bench._without(*off):
        await bench.cpu_durable(make_store())


async def main(setup: str, runs: int) -> None:
    for _ in range(2):
        await one(setup)
    gc.collect()
    for _ in range(runs):
        await one(setup)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
