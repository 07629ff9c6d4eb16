#!/usr/bin/env python3
"""A threadline conversation as DBOS workflow steps, on PostgreSQL.

Needs ``pip install 'threadline[dbos,postgres]'`` and a PostgreSQL server
(``--pg URL``, default ``postgresql://postgres@127.0.0.1:5432/test``). The
transcript goes to the schema ``threadline_example`` of that database
(``--schema``) and DBOS keeps its system tables beside it, in
``threadline_example_dbos``.
The model is a scripted stand-in, so it runs offline.

It answers a refund request over 100: the workflow waits for approval, the
example approves it with ``decide``, and the refund runs once. Kill the
process while it runs and start it again: DBOS recovers the workflow, and
the steps that already stored their entries store nothing twice.
"""

from __future__ import annotations

import argparse
import asyncio

from dbos import DBOS, SetWorkflowID

from threadline.ai import AssistantMessage, ToolContext, ToolResultMessage, UserMessage, tool
from threadline.integrations.dbos import AWAITING_APPROVAL, DBOSConversation, decide
from threadline.session import CustomEntry, MessageEntry, TreeIndex
from threadline.stores import PostgresStore
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


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--schema", default="threadline_example")
    ap.add_argument("--session", default="ticket-9")
    args = ap.parse_args()
    DBOS(config={"name": "threadline-example", "system_database_url": args.pg,
                 "dbos_system_schema": f"{args.schema}_dbos", "log_level": "WARNING"})
    store = PostgresStore(args.pg, schema=args.schema)
    conversation = DBOSConversation(store, ScriptedModel([scripted] * 10), [refund],
                                    system="You are a support agent.")
    DBOS.launch()  # recovers the workflows a killed run of this example left pending

    workflow_id = f"{args.session}-refund"
    with SetWorkflowID(workflow_id):  # starting it again returns the same workflow
        handle = await DBOS.start_workflow_async(conversation.exchange, args.session, None,
                                                 "refund B-2 250")
    held = await DBOS.get_event_async(workflow_id, AWAITING_APPROVAL, timeout_seconds=30)
    print("awaiting approval:", held)
    if held:
        await decide(workflow_id, held[0], approved=True, by="sam")
    leaf = await handle.get_result()

    tree = TreeIndex(await store.load_entries(args.session), session_id=args.session)
    tree.set_leaf(leaf)
    for entry in tree.path():
        if isinstance(entry, MessageEntry):
            message = entry.message
            calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
            print(f"  {type(message).__name__}: {message.text or [c.name for c in calls]}")
        elif isinstance(entry, CustomEntry):
            print(f"  {entry.kind}")
    await store.close()
    DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main())
