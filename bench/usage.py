"""What a budget costs a run, and what adding up a session's usage costs against loading it.

- budget: one scripted run of 200 messages (99 tool turns and an answer, as
  ``bench/durable.py``) on a SQLite store, with a ``Budget`` that never
  stops it against the same run without one; each of the 100 model calls
  first reads the session on from the last entry seen (``load_entries_after``)
  and adds up what is new. Wall time, paired turns. Goal: at most 1.2x;
- usage: ``durable.usage(store, id)`` of a 20,000-entry SQLite session
  against ``store.load_entries`` of it, the read it cannot avoid. Goal: at
  most 1.3x.
"""

from __future__ import annotations

import asyncio
import statistics

from bench._harness import Run, alternate, at_most, measured, paired, us
from bench._targets import (
    AgentLoop,
    AssistantMessage,
    Call,
    MessageEntry,
    ScriptedModel,
    SessionRecord,
    SQLiteStore,
    Text,
    ToolResult,
    Turn,
    Usage,
    UserMessage,
    durable,
    tool,
)

NEEDS = ()
MINUTES = 1
CALLS = 99
BIG = 20_000


@tool
async def lookup(step: int) -> ToolResult:
    """Look something up."""
    return ToolResult.text(f"result of step {step}")


def make_loop() -> AgentLoop:
    used = Usage(input_tokens=100, output_tokens=10)
    turns = [Turn(Text(f"Step {i}."), Call("lookup", {"step": i}), usage=used)
             for i in range(CALLS)]
    turns.append(Turn.text("Done.", usage=used))
    return AgentLoop(ScriptedModel(turns), [lookup], max_turns=None)


def main(run: Run) -> None:
    turns = run.pick(11, 2)
    counter = iter(range(10**6))
    big = SQLiteStore(run.tmp / "big.db")

    async def fill() -> None:
        await big.create_session(SessionRecord(id="big"))
        parent = None
        batch = []
        for i in range(BIG):
            message = (UserMessage.of(f"question {i}") if i % 2 == 0 else AssistantMessage(
                content=(), model="m", provider="p",
                usage=Usage(input_tokens=i, output_tokens=1)))
            entry = MessageEntry(parent_id=parent, message=message)
            parent = entry.id
            batch.append(entry)
            if len(batch) == 500:
                await big.append_entries("big", batch)
                batch = []

    async def with_budget(budget: durable.Budget | None) -> object:
        store = SQLiteStore(run.tmp / f"run-{next(counter)}.db")
        agent = await durable.open(make_loop, store=store, budget=budget)
        got = await measured(agent.run("Do the steps.").collect())
        await store.close()
        return got

    async def go() -> dict[str, list[float]]:
        await fill()
        got = await alternate({
            "plain": lambda: with_budget(None),
            "budget": lambda: with_budget(durable.Budget(max_tokens=10**12)),
            "load": lambda: measured(big.load_entries("big")),
            "usage": lambda: measured(durable.usage(big, "big")),
        }, turns, collect=True)
        await big.close()
        return got.wall

    t = asyncio.run(go())
    run.row("durable run with a budget, SQLite, wall per model call, 100 calls",
            us(statistics.median(t["budget"])) / (CALLS + 1), "µs",
            versus="the same run without a budget",
            versus_value=us(statistics.median(t["plain"])) / (CALLS + 1),
            ratio=paired(t["budget"], t["plain"]), goal=at_most(1.2),
            detail=f"median of {turns} paired turns; each call first reads the session "
                   "on from the last entry seen")
    run.row(f"durable.usage of a {BIG:,}-entry SQLite session",
            us(statistics.median(t["usage"])) / 1000, "ms",
            versus="load_entries of it", versus_value=us(statistics.median(t["load"])) / 1000,
            ratio=paired(t["usage"], t["load"]), goal=at_most(1.3),
            detail=f"median of {turns} paired turns")
