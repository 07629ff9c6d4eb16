"""Durable-agent overhead: one scripted 200-message run with tool calls.

The same run (one user message, 99 turns of an assistant message with one tool
call and its result, a final answer: 200 messages) goes through:

- bare: ``AgentLoop`` alone, nothing stored;
- durable/memory: ``durable.open`` on a ``MemoryStore`` (store each message,
  then forward its receipt);
- durable/file (flush): a ``FileStore`` that writes each append to the OS
  without fsync;
- durable/file (fsync): a ``FileStore`` with its default durability, one
  write + fdatasync per message;

and, in the same run, a floor for the file store: the run's 200 encoded
entries written one line at a time to a fresh file, each ``os.write`` followed
by ``os.fdatasync`` (what any durable per-message log must pay at least).

Reported: durable/memory against bare (the agent's own cost: receipts, the
pump task, the tree index, encoding), and durable/file (fsync) against
bare + floor. Repetitions are interleaved so load from other jobs hits every
variant alike; each time is the best of the repetitions, and each ratio is
given twice: from the best times, and as the median of the ratios computed
within each repetition (robust when the disk's fsync latency swings).

    .venv/bin/python bench/durable.py            # 7 repetitions
    .venv/bin/python bench/durable.py --quick    # 3

Writes bench/results/durable.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from threadline import durable
from threadline.agent import AgentLoop
from threadline.ai import ToolResult, UserMessage, tool
from threadline.session import FileStore, MemoryStore, encode_entry
from threadline.session._store import Store
from threadline.testing import Call, ScriptedModel, Text, Turn

RESULTS = Path(__file__).resolve().parent / "results" / "durable.json"
MESSAGES = 200
TURNS_WITH_TOOLS = (MESSAGES - 2) // 2  # 99: each one assistant message + one result


@tool
async def lookup(step: int) -> ToolResult:
    """Look something up."""
    return ToolResult.text(f"result of step {step}: " + "x" * 120)


def script() -> list[Turn]:
    turns = [
        Turn(Text(f"Step {i}: ", "I will look this up."), Call("lookup", {"step": i}))
        for i in range(TURNS_WITH_TOOLS)
    ]
    turns.append(Turn.text("All ", "steps ", "done."))
    return turns


def make_loop() -> AgentLoop:
    return AgentLoop(ScriptedModel(script()), [lookup], max_turns=None)


INPUT = UserMessage.of("Do the 99 steps, please.")


async def bare() -> float:
    loop = make_loop()
    t = time.perf_counter()
    async for _ in loop.run([], [INPUT]):
        pass
    return time.perf_counter() - t


async def run_durable(store: Store) -> tuple[float, int]:
    agent = await durable.open(make_loop, store=store)
    t = time.perf_counter()
    async for _ in agent.run(INPUT):
        pass
    elapsed = time.perf_counter() - t
    return elapsed, len(agent.entries)


def floor(lines: list[bytes], path: Path) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        t = time.perf_counter()
        for line in lines:
            os.write(fd, line)
            os.fdatasync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 3 if args.quick else 7

    # The floor writes exactly the bytes the file store writes for this run.
    sample = await durable.open(make_loop, store=MemoryStore())
    await sample.run(INPUT).collect()
    assert len(sample.entries) == MESSAGES, len(sample.entries)
    lines = [encode_entry(e) + b"\n" for e in sample.entries]

    times: dict[str, list[float]] = {k: [] for k in (
        "bare", "durable_memory", "durable_file_flush", "durable_file_fsync", "floor_fsync")}
    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as tmp:
        root = Path(tmp)
        variants: list[tuple[str, Callable[[], Awaitable[float]]]] = [
            ("bare", bare),
            ("durable_memory", lambda: _timed(run_durable(MemoryStore()))),
            ("durable_file_flush",
             lambda: _timed(run_durable(FileStore(root / "flush", durability="flush")))),
            ("durable_file_fsync", lambda: _timed(run_durable(FileStore(root / "fsync")))),
        ]
        await bare()  # warm up imports and caches
        for _ in range(reps):
            for name, fn in variants:
                gc.collect()
                times[name].append(await fn())
            times["floor_fsync"].append(floor(lines, root / "floor.jsonl"))

    best = {k: min(v) for k, v in times.items()}
    per_msg_us = {k: v / MESSAGES * 1e6 for k, v in best.items()}
    ratios = {
        "durable_memory / bare": best["durable_memory"] / best["bare"],
        "durable_file_flush / bare": best["durable_file_flush"] / best["bare"],
        "durable_file_fsync / (bare + floor)":
            best["durable_file_fsync"] / (best["bare"] + best["floor_fsync"]),
    }
    def paired(num: str, *den: str) -> float:
        return statistics.median(
            times[num][i] / sum(times[d][i] for d in den) for i in range(reps)
        )

    paired_ratios = {
        "durable_memory / bare": paired("durable_memory", "bare"),
        "durable_file_flush / bare": paired("durable_file_flush", "bare"),
        "durable_file_fsync / (bare + floor)":
            paired("durable_file_fsync", "bare", "floor_fsync"),
    }
    overhead_us = {
        "durable_memory - bare": (best["durable_memory"] - best["bare"]) / MESSAGES * 1e6,
        "durable_file_fsync - (bare + floor)": (
            best["durable_file_fsync"] - best["bare"] - best["floor_fsync"]
        ) / MESSAGES * 1e6,
    }

    print(f"{MESSAGES} messages ({TURNS_WITH_TOOLS} tool calls), best of {reps}")
    print(f"{'variant':<22} {'ms':>9} {'µs/message':>11}")
    for name in times:
        print(f"{name:<22} {best[name] * 1e3:>9.2f} {per_msg_us[name]:>11.1f}")
    print()
    print(f"{'ratio':<38} {'best':>7} {'median':>7}")
    for name, value in ratios.items():
        print(f"{name:<38} {value:>6.2f}x {paired_ratios[name]:>6.2f}x")
    for name, value in overhead_us.items():
        print(f"{name:<38} {value:>6.1f} µs/message")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "messages": MESSAGES,
        "tool_calls": TURNS_WITH_TOOLS,
        "repetitions": reps,
        "best_ms": {k: round(v * 1e3, 3) for k, v in best.items()},
        "per_message_us": {k: round(v, 2) for k, v in per_msg_us.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "median_paired_ratios": {k: round(v, 3) for k, v in paired_ratios.items()},
        "overhead_us_per_message": {k: round(v, 2) for k, v in overhead_us.items()},
        "all_ms": {k: [round(x * 1e3, 3) for x in v] for k, v in times.items()},
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


async def _timed(run: Awaitable[tuple[float, int]]) -> float:
    elapsed, entries = await run
    assert entries == MESSAGES, entries
    return elapsed


if __name__ == "__main__":
    asyncio.run(main())
