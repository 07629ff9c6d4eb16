"""What ``AgentLoop`` adds per streamed event and per tool call, over producing the events.

Each scenario runs the loop on ``ScriptedModel`` (offline, no delays) and, in
turns with it, two references whose sum is the floor:

- model: consuming the scripted model's streams for the same requests (the
  cost of producing the events, which the loop cannot avoid);
- bare: a plain async generator yielding the very same agent events, and
  awaiting the same tool function once per call.

The overhead (loop - model - bare) is reported per event and per tool call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from bench._harness import Run, alternate, median, us
from bench._targets import (
    AgentEvent,
    AgentLoop,
    AssistantMessage,
    Call,
    MessageEnd,
    ScriptedModel,
    Text,
    ToolResult,
    Turn,
    UserMessage,
    tool,
)

NEEDS = ()
MINUTES = 0.5


@tool
async def echo(value: int) -> ToolResult:
    """Return the value."""
    return ToolResult.text(str(value))


def scenarios(scale: int) -> dict[str, tuple[Callable[[], list[Turn]], bool]]:
    def stream() -> list[Turn]:
        return [Turn(Text(*(["tok "] * (2_000 * scale))))]

    def tools() -> list[Turn]:
        turns = [Turn(*(Call("echo", {"value": t * 10 + k}) for k in range(10)))
                 for t in range(20 * scale)]
        return [*turns, Turn.text("done")]

    return {"a streamed text": (stream, True), "tool calls, parallel": (tools, True),
            "tool calls, sequential": (tools, False)}


async def _bare(events: Sequence[AgentEvent], args: Sequence[int]) -> AsyncIterator[Any]:
    for value in args:
        await echo.fn(value=value)
    for ev in events:
        yield ev


async def measure(run: Run, name: str, script: Callable[[], list[Turn]], parallel: bool,
                  turns: int) -> None:
    def loop() -> AgentLoop:
        return AgentLoop(ScriptedModel(script()), [echo], parallel_tools=parallel,
                         max_turns=None)

    scripted = ScriptedModel(script())
    first = AgentLoop(scripted, [echo], parallel_tools=parallel, max_turns=None)
    events = [ev async for ev in first.run([], [UserMessage.of("go")])]
    requests = scripted.requests
    args = [c.arguments["value"] for e in events
            if isinstance(e, MessageEnd) and isinstance(e.message, AssistantMessage)
            for c in e.message.tool_calls]
    calls = len(args)

    async def with_loop() -> None:
        async for _ in loop().run([], [UserMessage.of("go")]):
            pass

    async def model_only() -> None:
        model = ScriptedModel(script())
        for request in requests:
            async for _ in model.stream(request):
                pass

    async def bare() -> None:
        async for _ in _bare(events, args):
            pass

    got = await alternate({"loop": with_loop, "model": model_only, "bare": bare}, turns,
                          collect=True)
    overhead = [lp - m - b for lp, m, b in zip(got.wall["loop"], got.wall["model"],
                                               got.wall["bare"], strict=True)]
    floor = [m + b for m, b in zip(got.wall["model"], got.wall["bare"], strict=True)]
    versus = "the model's streams + a bare generator of the same events"
    per, count = ("tool call", calls) if calls else ("event", len(events))
    run.row(f"agent loop, {name}: time added per {per}", us(median(overhead)) / count, "µs",
            versus=versus, versus_value=us(median(floor)) / count,
            ratio=median([lp / f for lp, f in zip(got.wall["loop"], floor, strict=True)]),
            detail=f"{len(events)} events, {calls} tool calls; the ratio is the whole "
                   f"run's over the floor's, median of {turns} turns")


def main(run: Run) -> None:
    scale, turns = run.pick((2, 11), (1, 2))
    for name, (script, parallel) in scenarios(scale).items():
        asyncio.run(measure(run, name, script, parallel, turns))
