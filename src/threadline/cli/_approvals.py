"""``threadline pending`` / ``approve`` / ``deny``, and how ledger records print.

``describe_record`` is what ``show`` and ``tree`` print for the effect
ledger's entries (``docs/tools-with-side-effects.md``). ``continue``, which
acts on a decision, is with the verbs that run a model (``_chat``).
"""

from __future__ import annotations

import argparse

import msgspec

from threadline.cli._command import Ctx, Verb
from threadline.cli._output import Span, visible
from threadline.durable._effects import describe_record as _line
from threadline.errors import ApprovalError
from threadline.session._entries import CustomEntry, Entry

__all__ = ["VERBS", "continue_hint", "describe_record"]

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


async def _pending(ctx: Ctx, args: argparse.Namespace) -> int:
    from threadline.durable._effects import pending_approvals

    store = ctx.open()
    found = await pending_approvals(store, list(args.sessions) or None)
    if args.json:
        for p in found:
            ctx.out.json({"session_id": p.session_id, "call_id": p.call_id,
                          "tool_name": p.tool_name, "arguments": p.arguments,
                          "reason": p.reason, "requested_at": p.requested_at})
    elif not found:
        ctx.out.line("no tool calls await approval")
    else:
        # Ids, arguments and reasons are data: escaped first, so the columns
        # are measured on what is printed.
        ctx.out.table([("SESSION", "CALL", "TOOL", "ARGUMENTS", "REASON", "REQUESTED")] + [
            tuple(visible(cell) for cell in (
                p.session_id, p.call_id, p.tool_name, msgspec.json.encode(p.arguments).decode(),
                p.reason, f"{p.requested_at:%Y-%m-%d %H:%M:%S}")) for p in found])
    for problem in found.problems:
        # One session that cannot be read never hides the others' approvals.
        ctx.notice(f"could not look for approvals: {' '.join(str(problem).split())}")
    return 1 if found.problems else 0


def continue_hint(session: str) -> str:
    return f"threadline continue {session} --factory MODULE:NAME"


async def _decide(ctx: Ctx, args: argparse.Namespace) -> None:
    from threadline import durable

    store = ctx.open()
    agent = await durable.open(None, store=store, session_id=args.session, repair=False,
                               create=False)
    try:
        if args.command == "approve":
            entry = await agent.approve(args.call, reason=args.reason, by=args.by)
        else:
            entry = await agent.deny(args.call, args.reason, by=args.by)
    except ApprovalError as exc:
        raise type(exc)(f"{exc}; `threadline pending` lists the calls that await a "
                        "decision") from exc
    verdict = "approved" if args.command == "approve" else "denied"
    ctx.out.line(f"{verdict} call {visible(args.call)} in session {visible(args.session)} "
                 f"(entry {entry.id}); to act on it: {continue_hint(args.session)}")


VERBS = [
    Verb("pending", "list tool calls awaiting approval", _conf_pending, _pending),
    Verb("approve", "approve a tool call awaiting approval", _conf_approve, _decide),
    Verb("deny", "deny a tool call awaiting approval", _conf_deny, _decide),
]
