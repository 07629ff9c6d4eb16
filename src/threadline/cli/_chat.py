"""``chat`` and ``branch``: talk to a real model in a session.

In the CLI a branch is where a chat continues: ``chat SESSION --at ENTRY``
(or ``branch SESSION ENTRY``, the same thing) sends the next message after
ENTRY, and what is appended grows a new branch from there; a reopen then
continues from it, as from any last entry. Nothing is written until that
first message is, so a chat left without a word leaves no trace (the
library's ``branch_to`` would record the move itself, as a marker entry).

A model failure is stored as an assistant message with ``stop_reason="error"``;
chat prints its reason on stderr, and a run fed from a pipe stops there with
exit status 1, so a script can tell.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from threadline import durable
from threadline.agent._events import MessageUpdate
from threadline.ai._messages import AssistantMessage
from threadline.ai._model import TextDelta
from threadline.ai._registry import get_model
from threadline.cli._app import Ctx, Verb
from threadline.cli._output import visible
from threadline.cli._read import write_path
from threadline.cli._render import resolve
from threadline.durable._events import StoredMessageEnd
from threadline.session._entries import MessageEntry
from threadline.session._tree import TreeIndex

__all__ = ["VERBS"]

_RECALL = 20  # entries of an earlier conversation shown when resuming


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=os.environ.get("THREADLINE_MODEL", "openai:gpt-4.1-mini"),
                   help="provider:model (default: $THREADLINE_MODEL or %(default)s)")
    p.add_argument("--system", default=None, help="system prompt")


def _conf_chat(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="session id (default: a new one)")
    p.add_argument("--at", metavar="ENTRY",
                   help="continue from this entry instead of the leaf: a new branch")
    _model_options(p)


def _conf_branch(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("at", metavar="ENTRY", help="the entry to continue from")
    _model_options(p)


async def _chat(ctx: Ctx, args: argparse.Namespace) -> int:
    lm = get_model(args.model)  # a bad model spec fails before anything is created
    store = ctx.open(create=True)
    if args.at and args.session:
        await store.load_session(args.session)  # a branch of nothing is a typo
    agent = await durable.open(durable.model(lm, system=args.system), store=store,
                               session_id=args.session)
    tree = TreeIndex(agent.entries, session_id=agent.session_id)
    if args.at:
        agent.branch(resolve(tree, args.at))
    path = agent.path()
    interactive = sys.stdin.isatty()
    if path:
        ctx.out.line(("resuming ", "bold"), f"session {agent.session_id} "
                     f"({len(agent.entries)} entries; the path so far):")
        write_path(ctx.out, tree, path[-_RECALL:], skipped=max(0, len(path) - _RECALL))
    else:
        ctx.out.line(("new session ", "bold"), agent.session_id)
    if interactive:
        ctx.out.line(("Empty line or Ctrl-D to quit.", "dim"))
    while True:
        try:
            line = await asyncio.to_thread(input, "you> " if interactive else "")
        except EOFError:
            break
        if not line.strip():
            break
        failure = await _turn(ctx, agent, line)
        if failure is not None:
            ctx.err.line(("error: ", "bold red"), f"the model failed: {failure}")
            if not interactive:
                return 1
    return 0


async def _turn(ctx: Ctx, agent: durable.DurableAgent, line: str) -> str | None:
    """Run one user message; the model's error message if it failed."""
    failure: str | None = None
    async with agent.run(line) as run:
        async for event in run:
            if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                ctx.out.stream.write(visible(event.event.delta, keep_lines=True))
                ctx.out.stream.flush()
            elif isinstance(event, StoredMessageEnd):
                for entry in event.entries:
                    if (isinstance(entry, MessageEntry)
                            and isinstance(entry.message, AssistantMessage)
                            and entry.message.stop_reason == "error"):
                        failure = " ".join((entry.message.error_message or "no reason").split())
    ctx.out.stream.write("\n")
    return failure


VERBS = [
    Verb("chat", "chat in a session with a real model", _conf_chat, _chat),
    Verb("branch", "continue a session from an earlier entry (same as chat --at)",
         _conf_branch, _chat),
]
