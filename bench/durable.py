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

The same-moment floor: the fsync run once more with every append paired
with one ``os.write`` + ``os.fdatasync`` of the same bytes to another file,
right before or after it (alternating). The shared disk's sync latency
swings between the floor block above and the runs; pairs see it alike. The
wrapper's own time is taken out of the run's.

The effect ledger (``docs/tools-with-side-effects.md``): the same run with the
tool declared ``side_effects=True`` on the fsync file store, so each of the 99
calls also gets its durable "started" record before it runs. Each started
record's append is timed inside the run, and right before it the same line is
written to a separate file with one ``os.write`` + ``os.fdatasync``: the pair
sees the same disk at the same moment, so the ratio holds even when the
disk's sync latency swings. The promise is one durable append per tool call
and nothing more, so the ratio should be close to 1.

Where the time goes: the memory run again with its parts switched off one at
a time from the bottom up (a store that keeps nothing, no ledger, no check,
no append at all), all measured in CPU time (``time.thread_time``, which other
jobs on a shared machine disturb far less than wall time), median of the
repetitions. The steps between them are the per-message cost of each part.
The run's tools need no effect ledger (S41); the same run with a tool that
has side effects in the loop (never called) takes the ledger's path for
every call, as every run did before S41.

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
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from threadline import durable
from threadline.agent import AgentLoop
from threadline.ai import ToolContext, ToolResult, UserMessage, tool
from threadline.durable import _agent as agent_module
from threadline.durable import _effects as effects_module
from threadline.session import (
    CustomEntry,
    Entry,
    FileStore,
    MemoryStore,
    SessionRecord,
    encode_entry,
)
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


def make_ledger_loop() -> AgentLoop:
    # The same calls of `lookup`; `charge` is never called, but a loop that
    # holds a tool with side effects gets the effect ledger (S41).
    return AgentLoop(ScriptedModel(script()), [lookup, charge], max_turns=None)


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


def _is_started(entries: Sequence[Entry]) -> bool:
    return len(entries) == 1 and isinstance(entries[0], CustomEntry) and \
        entries[0].kind == "threadline.tool_started"


class PairedStarted:
    """A store wrapper timing each chosen append against a bare write+fdatasync of its line.

    By default the started records; ``pick`` chooses others. ``spent`` is the
    wall time the wrapper itself adds to the run (the floor writes and the
    encoding of their lines), so a caller can take it out of the run's time.
    """

    def __init__(self, inner: FileStore, floor_path: Path,
                 pick: Callable[[Sequence[Entry]], bool] = _is_started) -> None:
        self.inner = inner
        self.pick = pick
        self.fd = os.open(floor_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.pairs: list[tuple[float, float]] = []  # (append, floor) seconds
        self.spent = 0.0

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if not self.pick(entries):
            await self.inner.append_entries(session_id, entries)
            return
        t_encode = time.perf_counter()
        line = b"".join(encode_entry(e) + b"\n" for e in entries)
        self.spent += time.perf_counter() - t_encode
        # Alternate which of the pair goes first, so neither gains from the order.
        first_floor = len(self.pairs) % 2 == 0
        if first_floor:
            floor_s = self._floor(line)
        t0 = time.perf_counter()
        await self.inner.append_entries(session_id, entries)
        append_s = time.perf_counter() - t0
        if not first_floor:
            floor_s = self._floor(line)
        self.pairs.append((append_s, floor_s))

    def _floor(self, line: bytes) -> float:
        t0 = time.perf_counter()
        os.write(self.fd, line)
        os.fdatasync(self.fd)
        took = time.perf_counter() - t0
        self.spent += took
        return took

    def close(self) -> None:
        os.close(self.fd)


# -- the breakdown ----------------------------------------------------------------


class KeepNothing(MemoryStore):
    """A store whose appends accept and keep nothing: the store's own cost taken out."""

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        return None

    def _append_checked(self, session_id: str, entries: Sequence[Entry],
                        lines: Sequence[bytes]) -> None:
        return None


async def _admit(self: Any, call: Any, tool: Any, arguments: Any) -> None:
    return None


async def _begin(self: Any, call: Any, tool: Any) -> ToolContext:
    return ToolContext(call_id=call.id, tool_name=call.name, idempotency_key=call.id)


async def _no_records(self: Any, message: Any) -> list[Entry]:
    return []


def _receipt_only(self: Any, message: Any, *, plain: bool = False) -> Any:
    return durable.StoredMessageEnd(message=message, entries=())


def _no_check(entry: Entry, session_id: str | None) -> tuple[bytes, Entry]:
    return b"", entry


def _no_copy(entry: Entry, session_id: str) -> Entry:
    return entry


@contextlib.contextmanager
def _without(*parts: str) -> Iterator[None]:
    """Switch parts of the durable run off (for the breakdown only)."""
    patches: list[tuple[Any, str, Any]] = []
    if "append" in parts:
        patches.append((agent_module._Pump, "_store", _receipt_only))
    if "check" in parts:
        # The one check (encode, decode back, compare) that gives the store
        # its line and the agent its copy; the copy alone for other stores.
        patches += [(agent_module, "check_entry", _no_check),
                    (agent_module, "_held_copy", _no_copy)]
    if "ledger" in parts:
        patches += [(effects_module.Ledger, "admit", _admit),
                    (effects_module.Ledger, "begin", _begin),
                    (effects_module.Ledger, "records_for", _no_records)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


# (label, parts switched off, store); each step adds one part back.
BREAKDOWN_STEPS: list[tuple[str, tuple[str, ...], Callable[[], Store]]] = [
    ("hand-off: pump task, channel, receipts", ("append", "check", "ledger"), KeepNothing),
    ("entries: ids, chaining, tree index", ("check", "ledger"), KeepNothing),
    ("effect ledger (none for these tools: S41)", ("check",), KeepNothing),
    ("check: line stored, copy held (S16, S40)", (), KeepNothing),
    ("memory store append (keeping the line)", (), MemoryStore),
]


async def cpu_bare() -> float:
    loop = make_loop()
    t = time.thread_time()
    async for _ in loop.run([], [INPUT]):
        pass
    return time.thread_time() - t


async def cpu_durable(store: Store, factory: Callable[[], AgentLoop] = make_loop) -> float:
    agent = await durable.open(factory, store=store)
    t = time.thread_time()
    async for _ in agent.run(INPUT):
        pass
    return time.thread_time() - t


async def breakdown(reps: int) -> dict[str, Any]:
    """CPU time per message of each part of a durable memory run, and the two ratios."""
    cpu: dict[str, list[float]] = {"bare": [], LEDGER_RUN: []}
    cpu.update({label: [] for label, _, _ in BREAKDOWN_STEPS})
    for _ in range(reps):
        gc.collect()
        cpu["bare"].append(await cpu_bare())
        for label, off, make_store in BREAKDOWN_STEPS:
            gc.collect()
            with _without(*off):
                cpu[label].append(await cpu_durable(make_store()))
        gc.collect()
        cpu[LEDGER_RUN].append(await cpu_durable(MemoryStore(), make_ledger_loop))
    medians = {k: statistics.median(v) for k, v in cpu.items()}
    steps: dict[str, float] = {}
    before = medians["bare"]
    for label, _, _ in BREAKDOWN_STEPS:
        steps[label] = (medians[label] - before) / MESSAGES * 1e6
        before = medians[label]
    full = BREAKDOWN_STEPS[-1][0]
    return {
        "bare_us_per_message": medians["bare"] / MESSAGES * 1e6,
        "durable_memory_us_per_message": medians[full] / MESSAGES * 1e6,
        "steps_us_per_message": steps,
        CPU_KEY: statistics.median(
            d / b for d, b in zip(cpu[full], cpu["bare"], strict=True)),
        "ledger_run_us_per_message": medians[LEDGER_RUN] / MESSAGES * 1e6,
        LEDGER_KEY: statistics.median(
            d / b for d, b in zip(cpu[LEDGER_RUN], cpu["bare"], strict=True)),
    }


CPU_KEY = "durable_memory / bare (cpu, median of paired)"
LEDGER_RUN = "the same run with a ledger"
LEDGER_KEY = "durable_memory with a ledger / bare (cpu, median of paired)"


def print_breakdown(parts: dict[str, Any], reps: int) -> None:
    print(f"\nwhere a durable memory run's time goes (CPU time, median of {reps}; per message)")
    print(f"{'bare loop':<48} {parts['bare_us_per_message']:>6.1f} µs")
    for name, value in parts["steps_us_per_message"].items():
        print(f"{'+ ' + name:<48} {value:>6.1f} µs")
    print(f"{'= durable run, memory store':<48} {parts['durable_memory_us_per_message']:>6.1f} µs")
    print(f"{CPU_KEY:<48} {parts[CPU_KEY]:>6.2f}x")
    print(f"{'the same run, a side-effect tool in the loop':<48} "
          f"{parts['ledger_run_us_per_message']:>6.1f} µs (ledger on every call, S41)")
    print(f"{LEDGER_KEY:<48} {parts[LEDGER_KEY]:>6.2f}x")


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


async def measure(reps: int) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """Every variant's wall time per repetition, interleaved, and the started-record pairs."""
    # The floor writes exactly the bytes the file store writes for this run.
    sample = await durable.open(make_loop, store=MemoryStore())
    await sample.run(INPUT).collect()
    assert len(sample.entries) == MESSAGES, len(sample.entries)
    lines = [encode_entry(e) + b"\n" for e in sample.entries]
    times: dict[str, list[float]] = {k: [] for k in (
        "bare", "durable_memory", "durable_file_flush", "durable_file_fsync", "floor_fsync",
        "durable_file_fsync_tracked", "durable_file_fsync_paired", "paired_floor",
        "paired_appends")}
    paired_started: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as tmp:
        root = Path(tmp)
        variants: list[tuple[str, Callable[[], Awaitable[float]]]] = [
            ("bare", bare),
            ("durable_memory", lambda: _timed(run_durable(MemoryStore()))),
            ("durable_file_flush",
             lambda: _timed(run_durable(FileStore(root / "flush", durability="flush")))),
            ("durable_file_fsync", lambda: _timed(run_durable(FileStore(root / "fsync")))),
        ]

        async def tracked() -> float:
            store = PairedStarted(FileStore(root / "tracked"), root / "started-floor.jsonl")
            try:
                return await _timed(run_durable(store, make_tracked_loop), TRACKED_ENTRIES)
            finally:
                store.close()
                assert len(store.pairs) == TURNS_WITH_TOOLS, len(store.pairs)
                paired_started.extend(store.pairs)

        variants.append(("durable_file_fsync_tracked", tracked))

        async def paired_run() -> float:
            # Every append of the run paired with a write+fdatasync of its
            # bytes at the same moment: a floor that sees the disk as the run does.
            store = PairedStarted(FileStore(root / "paired"), root / "paired-floor.jsonl",
                                  pick=lambda entries: True)
            try:
                elapsed = await _timed(run_durable(store))
            finally:
                store.close()
            floors = sum(f for _, f in store.pairs)
            times["paired_floor"].append(floors)
            times["paired_appends"].append(sum(a for a, _ in store.pairs))
            return elapsed - store.spent  # the run as it would be without the wrapper

        variants.append(("durable_file_fsync_paired", paired_run))
        await bare()  # warm up imports and caches
        for _ in range(reps):
            for name, fn in variants:
                gc.collect()
                times[name].append(await fn())
            times["floor_fsync"].append(floor(lines, root / "floor.jsonl"))

    return times, paired_started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    breakdown_reps = max(reps, 5) * 3

    times, paired_started = await measure(reps)

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

    paired_key = "durable_file_fsync / (bare + same-moment floor)"
    ratios[paired_key] = best["durable_file_fsync_paired"] / (best["bare"] + best["paired_floor"])
    appends_key = "file store appends / same-moment floor"
    ratios[appends_key] = best["paired_appends"] / best["paired_floor"]
    paired_ratios = {
        appends_key: paired("paired_appends", "paired_floor"),
        paired_key: paired("durable_file_fsync_paired", "bare", "paired_floor"),
        "durable_memory / bare": paired("durable_memory", "bare"),
        "durable_file_flush / bare": paired("durable_file_flush", "bare"),
        "durable_file_fsync / (bare + floor)":
            paired("durable_file_fsync", "bare", "floor_fsync"),
    }
    appends = [a for a, _ in paired_started]
    floors = [f for _, f in paired_started]
    started_key = "started record append / one write+fdatasync"
    ratios[started_key] = sum(appends) / sum(floors)
    paired_ratios[started_key] = statistics.median(a / f for a, f in paired_started)
    overhead_us = {
        "durable_memory - bare": (best["durable_memory"] - best["bare"]) / MESSAGES * 1e6,
        "durable_file_fsync - (bare + floor)": (
            best["durable_file_fsync"] - best["bare"] - best["floor_fsync"]
        ) / MESSAGES * 1e6,
        "durable agent around its file appends (paired, median)": statistics.median(
            (times["durable_file_fsync_paired"][i] - times["bare"][i]
             - times["paired_appends"][i]) for i in range(reps)) / MESSAGES * 1e6,
        "started record append (median)": statistics.median(appends) * 1e6,
        "one write+fdatasync of its line (median)": statistics.median(floors) * 1e6,
    }

    print(f"{MESSAGES} messages ({TURNS_WITH_TOOLS} tool calls), best of {reps}")
    print(f"{'variant':<28} {'ms':>9} {'µs/message':>11}")
    for name in times:
        print(f"{name:<28} {best[name] * 1e3:>9.2f} {per_msg_us[name]:>11.1f}")
    print()
    print(f"\n{len(paired_started)} started records, each paired with a write+fdatasync "
          "of its line")
    print(f"{'ratio':<48} {'best/sum':>8} {'median':>7}")
    for name, value in ratios.items():
        print(f"{name:<48} {value:>7.2f}x {paired_ratios[name]:>6.2f}x")
    for name, value in overhead_us.items():
        unit = "µs/message" if name.startswith("durable") else "µs/call"
        print(f"{name:<48} {value:>6.1f} {unit}")

    parts = await breakdown(breakdown_reps)
    print_breakdown(parts, breakdown_reps)

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
        "cpu_breakdown": {
            "bare_us_per_message": round(parts["bare_us_per_message"], 2),
            "durable_memory_us_per_message": round(parts["durable_memory_us_per_message"], 2),
            "steps_us_per_message": {k: round(v, 2)
                                     for k, v in parts["steps_us_per_message"].items()},
            CPU_KEY: round(parts[CPU_KEY], 3),
            "ledger_run_us_per_message": round(parts["ledger_run_us_per_message"], 2),
            LEDGER_KEY: round(parts[LEDGER_KEY], 3),
        },
        "all_ms": {k: [round(x * 1e3, 3) for x in v] for k, v in times.items()},
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


async def _timed(run: Awaitable[tuple[float, int]], expected: int = MESSAGES) -> float:
    elapsed, entries = await run
    assert entries == expected, entries
    return elapsed


if __name__ == "__main__":
    asyncio.run(main())
