"""A durable agent's run against the bare agent loop, on the memory and the file store.

One scripted run of 200 messages (a user message, 99 turns of an assistant
message with one tool call and its result, a final answer), in turns:

- bare: ``AgentLoop`` alone, nothing stored (the floor);
- memory: ``durable.open`` on a ``MemoryStore``; CPU time of the run against
  the bare loop's (``time.thread_time``: other jobs on a shared machine
  disturb it far less than wall time). Goal: at most 1.3x;
- file, fsync: a ``FileStore`` with its default durability, every append
  paired with one ``os.write`` + ``os.fdatasync`` of the same bytes to
  another file, right before or after it (alternating), so the floor (bare
  loop + those syncs) sees the disk as the run does; the pairing's own time
  is taken out of the run's. Goal: at most 1.3x;
- file, flush: the same store writing without fsync, against the bare loop;
- tracked tool calls: the same run with the tool declared
  ``side_effects=True`` on the fsync store, each call's durable "started"
  record timed against a write + fdatasync of its line, paired.

Ratios are medians of the ratios taken within each turn.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench._floors import FsyncFile, bare_loop
from bench._harness import Measured, Run, alternate, at_most, measured, paired, us
from bench._targets import (
    AgentLoop,
    Call,
    CustomEntry,
    Entry,
    FileStore,
    MemoryStore,
    ScriptedModel,
    SessionRecord,
    Store,
    Text,
    ToolResult,
    Turn,
    UserMessage,
    durable,
    encode_entry,
    tool,
)

NEEDS = ()
MINUTES = 1
MESSAGES = 200
CALLS = (MESSAGES - 2) // 2
INPUT = UserMessage.of("Do the 99 steps, please.")


@tool
async def lookup(step: int) -> ToolResult:
    """Look something up."""
    return ToolResult.text(f"result of step {step}: " + "x" * 120)


@tool(side_effects=True)
async def charge(step: int) -> ToolResult:
    """Charge something (declared as having side effects, so its calls are tracked)."""
    return ToolResult.text(f"result of step {step}: " + "x" * 120)


def make_loop(name: str = "lookup") -> AgentLoop:
    turns = [Turn(Text(f"Step {i}: ", "I will look this up."), Call(name, {"step": i}))
             for i in range(CALLS)]
    turns.append(Turn.text("All ", "steps ", "done."))
    return AgentLoop(ScriptedModel(turns), [charge if name == "charge" else lookup],
                     max_turns=None)


def _is_started(entries: Sequence[Entry]) -> bool:
    return len(entries) == 1 and isinstance(entries[0], CustomEntry) \
        and entries[0].kind == "threadline.tool_started"


class Paired:
    """A store that times chosen appends against a write + fdatasync of their line.

    ``spent`` is the time the pairing itself adds to a run (the floor writes
    and the encoding of their lines), to be taken out of the run's time.
    """

    def __init__(self, inner: FileStore, floor: Path,
                 pick: Callable[[Sequence[Entry]], bool] = lambda _: True) -> None:
        self.inner, self.pick = inner, pick
        self.floor = FsyncFile(floor)
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
        t0 = time.perf_counter()
        line = b"".join(encode_entry(e) + b"\n" for e in entries)
        self.spent += time.perf_counter() - t0
        floor_first = len(self.pairs) % 2 == 0
        if floor_first:
            floor_s = self._floor(line)
        t0 = time.perf_counter()
        await self.inner.append_entries(session_id, entries)
        append_s = time.perf_counter() - t0
        if not floor_first:
            floor_s = self._floor(line)
        self.pairs.append((append_s, floor_s))

    def _floor(self, line: bytes) -> float:
        t0 = time.perf_counter()
        self.floor.write(line)
        took = time.perf_counter() - t0
        self.spent += took
        return took

    async def close(self) -> None:
        self.floor.close()
        await self.inner.close()


async def _durable(store: Store | Paired, loop: str = "lookup") -> Measured:
    agent = await durable.open(lambda: make_loop(loop), store=store)  # type: ignore[arg-type]
    got = await measured(agent.run(INPUT).collect())
    assert len(agent.entries) >= MESSAGES, len(agent.entries)
    return got


def main(run: Run) -> None:
    turns = run.pick(15, 2)
    root = run.tmp
    floors: list[float] = []   # the paired run's syncs, per turn
    appends: list[float] = []  # its store appends, per turn
    started: list[tuple[float, float]] = []
    counter = iter(range(10**6))

    async def paired_run() -> Measured:
        store = Paired(FileStore(root / f"paired-{next(counter)}"), root / "paired-floor")
        got = await _durable(store)
        await store.close()
        floors.append(sum(f for _, f in store.pairs))
        appends.append(sum(a for a, _ in store.pairs))
        return Measured(got.wall - store.spent, got.cpu)

    async def tracked() -> Measured:
        store = Paired(FileStore(root / f"tracked-{next(counter)}"), root / "started-floor",
                       pick=_is_started)
        got = await _durable(store, "charge")
        await store.close()
        assert len(store.pairs) == CALLS, len(store.pairs)
        started.extend(store.pairs)
        return got

    async def go() -> dict[str, list[float]]:
        got = await alternate({
            "bare": lambda: measured(bare_loop(make_loop(), [INPUT])),
            "memory": lambda: _durable(MemoryStore()),
            "flush": lambda: _durable(FileStore(root / f"flush-{next(counter)}",
                                                durability="flush")),
            "fsync": paired_run,
            "tracked": tracked,
        }, turns, collect=True)
        return got.wall | {f"{k} cpu": v for k, v in got.cpu.items()}

    t = asyncio.run(go())
    del floors[0], appends[0], started[:CALLS]  # the warm-up turn's
    bare = t["bare"]
    per_message = f"per message, {MESSAGES} messages"
    run.row(f"durable run on the memory store, CPU {per_message}",
            us(statistics.median(t["memory cpu"])) / MESSAGES, "µs",
            versus="the bare agent loop, same script, CPU",
            versus_value=us(statistics.median(t["bare cpu"])) / MESSAGES,
            ratio=paired(t["memory cpu"], t["bare cpu"]), goal=at_most(1.3),
            detail=f"median of {turns} paired turns")
    floor_plus = [b + f for b, f in zip(bare, floors, strict=True)]
    run.row(f"durable run on the fsync file store, wall {per_message}",
            us(statistics.median(t["fsync"])) / MESSAGES, "µs",
            versus="bare loop + a write + fdatasync of each message at the same moment",
            versus_value=us(statistics.median(floor_plus)) / MESSAGES,
            ratio=paired(t["fsync"], floor_plus), goal=at_most(1.3),
            detail=f"median of {turns} paired turns; the store's appends alone "
                   f"{paired(appends, floors):.2f}× their syncs")
    run.row(f"durable run on the flush file store (no fsync), wall {per_message}",
            us(statistics.median(t["flush"])) / MESSAGES, "µs",
            versus="the bare agent loop, wall", versus_value=us(statistics.median(bare))
            / MESSAGES, ratio=paired(t["flush"], bare), detail=f"median of {turns} paired turns")
    run.row("started record of a tracked tool call (fsync file store)",
            us(statistics.median(a for a, _ in started)), "µs",
            versus="a write + fdatasync of its line, paired",
            versus_value=us(statistics.median(f for _, f in started)),
            ratio=statistics.median(a / f for a, f in started),
            detail=f"{len(started)} calls; median of the pairs' ratios")
