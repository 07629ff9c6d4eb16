"""Agent-loop overhead: what ``AgentLoop`` adds per streamed event and per tool call.

Each scenario runs the loop with ``ScriptedModel`` (offline, no delays) and,
in the same process and run, two references:

- model: consuming the scripted model's streams directly, for the same
  requests: the cost of producing the events, which the loop cannot avoid;
- bare: a plain async generator that yields the very same agent events (and,
  for tool scenarios, awaits the same tool function once per call): the floor
  of delivering those events to a consumer.

overhead = loop - model - bare, reported per agent event and per tool call
(the per-tool figure also carries the per-event cost of that call's events).
Timings are the best of several repetitions (the machine may be shared; the
minimum is the least disturbed figure).

    .venv/bin/python bench/loop.py            # full
    .venv/bin/python bench/loop.py --quick    # smaller, for a smoke run

Writes bench/results/loop.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from threadline.agent import AgentEvent, AgentLoop, MessageEnd
from threadline.ai import AssistantMessage, Request, ToolResult, UserMessage, tool
from threadline.testing import Call, ScriptedModel, Text, Turn

RESULTS = Path(__file__).resolve().parent / "results" / "loop.json"


@tool
async def echo(value: int) -> ToolResult:
    """Return the value."""
    return ToolResult.text(str(value))


@dataclass
class Scenario:
    name: str
    script: Callable[[], list[Turn]]
    parallel: bool = True


def scenarios(scale: int) -> list[Scenario]:
    chunks = 2_000 * scale

    def stream() -> list[Turn]:
        return [Turn(Text(*(["tok "] * chunks)))]

    def tools() -> list[Turn]:
        turns = [
            Turn(*(Call("echo", {"value": t * 10 + k}) for k in range(10)))
            for t in range(20 * scale)
        ]
        return [*turns, Turn.text("done")]

    return [
        Scenario("text stream", stream),
        Scenario("tools, parallel", tools),
        Scenario("tools, sequential", tools, parallel=False),
    ]


async def run_loop(s: Scenario) -> tuple[int, list[AgentEvent], list[Request]]:
    model = ScriptedModel(s.script())
    loop = AgentLoop(model, [echo], parallel_tools=s.parallel, max_turns=None)
    events: list[AgentEvent] = []
    append = events.append
    start = time.perf_counter_ns()
    async for ev in loop.run([], [UserMessage.of("go")]):
        append(ev)
    elapsed = time.perf_counter_ns() - start
    return elapsed, events, model.requests


async def run_model(s: Scenario, requests: Sequence[Request]) -> int:
    model = ScriptedModel(s.script())
    sink: list[Any] = []
    append = sink.append
    start = time.perf_counter_ns()
    for request in requests:
        async for ev in model.stream(request):
            append(ev)
    return time.perf_counter_ns() - start


async def _bare(events: Sequence[AgentEvent], tool_args: Sequence[int]) -> AsyncIterator[Any]:
    for value in tool_args:  # the tool work the loop does, without the loop
        await echo.fn(value=value)
    for ev in events:
        yield ev


async def run_bare(events: Sequence[AgentEvent], tool_args: Sequence[int]) -> int:
    sink: list[Any] = []
    append = sink.append
    start = time.perf_counter_ns()
    async for ev in _bare(events, tool_args):
        append(ev)
    return time.perf_counter_ns() - start


async def measure(s: Scenario, reps: int) -> dict[str, Any]:
    loops, models, bares = [], [], []
    events: list[AgentEvent] = []
    for _ in range(reps):
        gc.collect()
        elapsed, events, requests = await run_loop(s)
        loops.append(elapsed)
        tool_args = [
            c.arguments["value"] for e in events
            if isinstance(e, MessageEnd) and isinstance(e.message, AssistantMessage)
            for c in e.message.tool_calls
        ]
        gc.collect()
        models.append(await run_model(s, requests))
        gc.collect()
        bares.append(await run_bare(events, tool_args))
    loop_ns, model_ns, bare_ns = (min(x) for x in (loops, models, bares))
    calls = sum(1 for e in events if e.type == "tool_execution_end")
    overhead = loop_ns - model_ns - bare_ns
    return {
        "scenario": s.name,
        "events": len(events),
        "tool_calls": calls,
        "loop_ms": loop_ns / 1e6,
        "model_ms": model_ns / 1e6,
        "bare_ms": bare_ns / 1e6,
        "overhead_us_per_event": overhead / len(events) / 1e3,
        "overhead_us_per_tool_call": overhead / calls / 1e3 if calls else None,
        "loop_over_model_plus_bare": loop_ns / (model_ns + bare_ns),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scale, reps = (1, 3) if args.quick else (2, 11)
    rows = [await measure(s, reps) for s in scenarios(scale)]
    header = (f"{'scenario':<20}{'events':>8}{'calls':>7}{'loop ms':>10}{'model ms':>10}"
              f"{'bare ms':>10}{'µs/event':>10}{'µs/call':>9}{'ratio':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        per_call = r["overhead_us_per_tool_call"]
        print(f"{r['scenario']:<20}{r['events']:>8}{r['tool_calls']:>7}{r['loop_ms']:>10.2f}"
              f"{r['model_ms']:>10.2f}{r['bare_ms']:>10.2f}{r['overhead_us_per_event']:>10.2f}"
              f"{(f'{per_call:.1f}' if per_call is not None else '-'):>9}"
              f"{r['loop_over_model_plus_bare']:>7.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "quick": args.quick,
        "repetitions": reps,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())
