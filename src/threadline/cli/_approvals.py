"""``threadline pending`` / ``approve`` / ``deny``, and how ledger records print.

``describe_record`` is what ``show`` and ``tree`` print for the effect
ledger's entries (``docs/tools-with-side-effects.md``).
"""

from __future__ import annotations

import argparse

import msgspec

from threadline.cli._app import Ctx, Verb
from threadline.cli._output import Span, visible
from threadline.durable._effects import describe_record as _line
from threadline.session._entries import CustomEntry, Entry

__all__ = ["VERBS", "describe_record"]

_STYLES = {
    "threadline.tool_plan": "dim",
    "threadline.tool_started": "bold yellow",
    "threadline.approval_requested": "bold magenta",
    "threadline.approval_decided": "bold cyan",
}


def describe_record(entry: Entry) -> list[Span] | None:
    """One styled span for a ledger entry, or None for any other entry."""
    line = _line(entry)
    if line is None:
        return None
    assert isinstance(entry, CustomEntry)
    return [(line, _STYLES.get(entry.kind, ""))]


def _conf_pending(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="*", help="session ids (default: all)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: JSON lines, full ids")


def _conf_decide(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("call", help="the tool call id (see threadline pending)")
    p.add_argument("--by", default="", help="who decides (kept in the log)")


def _conf_approve(p: argparse.ArgumentParser) -> None:
    _conf_decide(p)
    p.add_argument("--reason", default="", help="why (kept in the log)")


def _conf_deny(p: argparse.ArgumentParser) -> None:
    _conf_decide(p)
    p.add_argument("--reason", required=True, help="why; the model is told")


async def _pending(ctx: Ctx, args: argparse.Namespace) -> None:
    from threadline.durable._effects import pending_approvals

    store = ctx.open()
    found = await pending_approvals(store, list(args.sessions) or None)
    if args.json:
        for p in found:
            ctx.out.json({"session_id": p.session_id, "call_id": p.call_id,
                          "tool_name": p.tool_name, "arguments": p.arguments,
                          "reason": p.reason, "requested_at": p.requested_at})
        return
    if not found:
        ctx.out.line("no tool calls await approval")
        return
    ctx.out.line(("SESSION  CALL  TOOL  ARGUMENTS  REASON  REQUESTED", "bold"))
    for p in found:
        # Ids, arguments and reasons are data: printed escaped, never as markup.
        cells = (p.session_id, p.call_id, p.tool_name,
                 msgspec.json.encode(p.arguments).decode(), p.reason,
                 f"{p.requested_at:%Y-%m-%d %H:%M:%S}")
        ctx.out.line("  ".join(visible(cell) for cell in cells))


async def _decide(ctx: Ctx, args: argparse.Namespace) -> None:
    from threadline import durable

    store = ctx.open()
    agent = await durable.open(None, store=store, session_id=args.session, repair=False,
                               create=False)
    if args.command == "approve":
        entry = await agent.approve(args.call, reason=args.reason, by=args.by)
    else:
        entry = await agent.deny(args.call, args.reason, by=args.by)
    verdict = "approved" if args.command == "approve" else "denied"
    ctx.out.line(f"{verdict} call {visible(args.call)} in session {visible(args.session)} "
                 f"(entry {entry.id}); continue the run to act on it")


VERBS = [
    Verb("pending", "list tool calls awaiting approval", _conf_pending, _pending),
    Verb("approve", "approve a tool call awaiting approval", _conf_approve, _decide),
    Verb("deny", "deny a tool call awaiting approval", _conf_deny, _decide),
]
