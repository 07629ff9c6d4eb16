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

The effect ledger (``docs/tools-with-side-effects.md``): the same run with the
tool declared ``side_effects=True`` on the fsync file store, so each of the 99
calls also gets its durable "started" record before it runs. Its cost per call
(tracked minus untracked, divided by 99) is reported against one
``os.write`` + ``os.fdatasync`` of a started record's line, measured in the
same run: the promise is one durable append per tool call and nothing more.

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
from threadline.session import CustomEntry, FileStore, MemoryStore, encode_entry
from threadline.session._store import Store
from threadline.testing import Call, ScriptedModel, Text, Turn

RESULTS = Path(__file__).resolve().parent / "results" / "durable.json"
MESSAGES = 200
TURNS_WITH_TOOLS = (MESSAGES - 2) // 2  # 99: each one assistant message + one result


@tool
async def lookup(step: int) -> ToolResult:
    """Look something up."""
    return ToolResult.text(f"result of step {step}: " + "x" * 120)


@tool(side_effects=True)
async def charge(step: int) -> ToolResult:
    """Charge something (declared as having side effects, so its calls are tracked)."""
    return ToolResult.text(f"result of step {step}: " + "x" * 120)


def script(name: str = "lookup") -> list[Turn]:
    turns = [
        Turn(Text(f"Step {i}: ", "I will look this up."), Call(name, {"step": i}))
        for i in range(TURNS_WITH_TOOLS)
    ]
    turns.append(Turn.text("All ", "steps ", "done."))
    return turns


def make_loop() -> AgentLoop:
    return AgentLoop(ScriptedModel(script()), [lookup], max_turns=None)


def make_tracked_loop() -> AgentLoop:
    return AgentLoop(ScriptedModel(script("charge")), [charge], max_turns=None)


# Per tool call the tracked run stores a plan (in the assistant's own append)
# and a started record (one more append).
TRACKED_ENTRIES = MESSAGES + 2 * TURNS_WITH_TOOLS


INPUT = UserMessage.of("Do the 99 steps, please.")


async def bare() -> float:
    loop = make_loop()
    t = time.perf_counter()
    async for _ in loop.run([], [INPUT]):
        pass
    return time.perf_counter() - t


async def run_durable(store: Store, factory: Callable[[], AgentLoop] = make_loop
                      ) -> tuple[float, int]:
    agent = await durable.open(factory, store=store)
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
    tracked = await durable.open(make_tracked_loop, store=MemoryStore())
    await tracked.run(INPUT).collect()
    started_lines = [encode_entry(e) + b"\n" for e in tracked.entries
                     if isinstance(e, CustomEntry) and e.kind == "threadline.tool_started"]
    assert len(started_lines) == TURNS_WITH_TOOLS, len(started_lines)

    times: dict[str, list[float]] = {k: [] for k in (
        "bare", "durable_memory", "durable_file_flush", "durable_file_fsync", "floor_fsync",
        "durable_file_fsync_tracked", "floor_started")}
    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as tmp:
        root = Path(tmp)
        variants: list[tuple[str, Callable[[], Awaitable[float]]]] = [
            ("bare", bare),
            ("durable_memory", lambda: _timed(run_durable(MemoryStore()))),
            ("durable_file_flush",
             lambda: _timed(run_durable(FileStore(root / "flush", durability="flush")))),
            ("durable_file_fsync", lambda: _timed(run_durable(FileStore(root / "fsync")))),
            ("durable_file_fsync_tracked", lambda: _timed(
                run_durable(FileStore(root / "tracked"), make_tracked_loop), TRACKED_ENTRIES)),
        ]
        await bare()  # warm up imports and caches
        for _ in range(reps):
            for name, fn in variants:
                gc.collect()
                times[name].append(await fn())
            times["floor_fsync"].append(floor(lines, root / "floor.jsonl"))
            times["floor_started"].append(floor(started_lines, root / "started.jsonl"))

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
    def started_cost(i: int | None) -> float:
        pick = (lambda k: best[k]) if i is None else (lambda k: times[k][i])
        extra = pick("durable_file_fsync_tracked") - pick("durable_file_fsync")
        return extra / pick("floor_started")  # both are over the same 99 appends

    ratios["started record per call / one write+fdatasync"] = started_cost(None)
    paired_ratios["started record per call / one write+fdatasync"] = statistics.median(
        started_cost(i) for i in range(reps))
    overhead_us = {
        "durable_memory - bare": (best["durable_memory"] - best["bare"]) / MESSAGES * 1e6,
        "durable_file_fsync - (bare + floor)": (
            best["durable_file_fsync"] - best["bare"] - best["floor_fsync"]
        ) / MESSAGES * 1e6,
        "started record per tool call": (
            best["durable_file_fsync_tracked"] - best["durable_file_fsync"]
        ) / TURNS_WITH_TOOLS * 1e6,
        "one write+fdatasync of a started line": best["floor_started"] / TURNS_WITH_TOOLS * 1e6,
    }

    print(f"{MESSAGES} messages ({TURNS_WITH_TOOLS} tool calls), best of {reps}")
    print(f"{'variant':<28} {'ms':>9} {'µs/message':>11}")
    for name in times:
        print(f"{name:<28} {best[name] * 1e3:>9.2f} {per_msg_us[name]:>11.1f}")
    print()
    print(f"{'ratio':<48} {'best':>7} {'median':>7}")
    for name, value in ratios.items():
        print(f"{name:<48} {value:>6.2f}x {paired_ratios[name]:>6.2f}x")
    for name, value in overhead_us.items():
        unit = "µs/call" if "call" in name or "started" in name else "µs/message"
        print(f"{name:<48} {value:>6.1f} {unit}")

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


async def _timed(run: Awaitable[tuple[float, int]], expected: int = MESSAGES) -> float:
    elapsed, entries = await run
    assert entries == expected, entries
    return elapsed


if __name__ == "__main__":
    asyncio.run(main())
