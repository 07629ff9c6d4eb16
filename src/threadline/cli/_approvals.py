"""``threadline pending`` / ``approve`` / ``deny``, and how ledger records print.

Registered by ``threadline.cli`` with ``add_parsers`` and ``COMMANDS``;
``describe_record`` is what ``show`` and ``tree`` print for the effect
ledger's entries (``docs/tools-with-side-effects.md``).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from threadline.durable._effects import describe_record as _line
from threadline.session._entries import CustomEntry, Entry

__all__ = ["COMMANDS", "add_parsers", "describe_record"]

_STYLES = {
    "threadline.tool_plan": "dim",
    "threadline.tool_started": "bold yellow",
    "threadline.approval_requested": "bold magenta",
    "threadline.approval_decided": "bold cyan",
}


def describe_record(entry: Entry) -> Text | None:
    """One styled line for a ledger entry, or None for any other entry."""
    line = _line(entry)
    if line is None:
        return None
    assert isinstance(entry, CustomEntry)
    return Text(line, style=_STYLES.get(entry.kind, ""))


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("pending", help="list tool calls awaiting approval")
    p.add_argument("sessions", nargs="*", help="session ids (default: all)")
    a = sub.add_parser("approve", help="approve a tool call awaiting approval")
    a.add_argument("session")
    a.add_argument("call", help="the tool call id (see threadline pending)")
    a.add_argument("--by", default="", help="who decides (kept in the log)")
    a.add_argument("--reason", default="", help="why (kept in the log)")
    d = sub.add_parser("deny", help="deny a tool call awaiting approval")
    d.add_argument("session")
    d.add_argument("call", help="the tool call id (see threadline pending)")
    d.add_argument("--reason", required=True, help="why; the model is told")
    d.add_argument("--by", default="", help="who decides (kept in the log)")


async def _pending(store: Any, args: argparse.Namespace, console: Console) -> None:
    from threadline.durable._effects import pending_approvals

    found = await pending_approvals(store, list(args.sessions) or None)
    if not found:
        console.print("no tool calls await approval")
        return
    table = Table("session", "call", "tool", "arguments", "reason", "requested")
    for p in found:
        # Text cells: ids, arguments and reasons are data, never rich markup.
        table.add_row(*(Text(cell) for cell in (
            p.session_id, p.call_id, p.tool_name, msgspec.json.encode(p.arguments).decode(),
            p.reason, f"{p.requested_at:%Y-%m-%d %H:%M:%S}")))
    console.print(table)


async def _decide(store: Any, args: argparse.Namespace, console: Console) -> None:
    from threadline import durable

    await store.load_entries(args.session)  # an unknown session is an error, not a new one
    agent = await durable.open(None, store=store, session_id=args.session, repair=False)
    if args.command == "approve":
        entry = await agent.approve(args.call, reason=args.reason, by=args.by)
    else:
        entry = await agent.deny(args.call, args.reason, by=args.by)
    verdict = "approved" if args.command == "approve" else "denied"
    console.print(f"{verdict} call {args.call} in session {args.session} "
                  f"(entry {entry.id}); continue the run to act on it", markup=False)


COMMANDS: dict[str, Callable[[Any, argparse.Namespace, Console], Awaitable[None]]] = {
    "pending": _pending, "approve": _decide, "deny": _decide,
}
