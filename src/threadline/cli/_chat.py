"""``chat`` and ``branch``: talk to a real model in a session; ``continue``: finish
a run an approval or a crash left open, with the application's own factory
(its model and tools), named as ``package.module:name``.

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
import importlib
import inspect
import os
import sys
from typing import Any

from threadline import durable
from threadline.agent._events import AgentEnd, MessageUpdate
from threadline.ai._messages import AssistantMessage
from threadline.ai._model import TextDelta
from threadline.ai._registry import get_model
from threadline.cli._approvals import continue_hint
from threadline.cli._command import Ctx, Verb
from threadline.cli._output import visible
from threadline.cli._read import without_custom, write_path
from threadline.cli._render import count, describe, resolve
from threadline.durable._events import StoredMessageEnd
from threadline.errors import ConfigError
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
                     f"({count(len(agent.entries), 'entry')}; the path so far):")
        shown, hidden = without_custom(path, False)
        write_path(ctx.out, tree, shown[-_RECALL:], skipped=max(0, len(shown) - _RECALL),
                   hidden=hidden)
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


def _conf_continue(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--factory", required=True, metavar="MODULE:NAME",
                   help="the application's agent loop, as package.module:name: a durable "
                        "factory such as durable.model(model, tools), or a function that "
                        "returns one (the current folder is on the import path)")


def _load_factory(spec: str) -> Any:
    """The factory ``spec`` names; a function returning one is called first."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"--factory {spec!r}: expected package.module:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the application's own folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--factory {spec!r}: cannot import {module_name!r}: {exc}") from exc
    target = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--factory {spec!r}: {module_name} has no {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"--factory {spec!r} is a {type(target).__name__}, not a factory")
    return target


async def _continue(ctx: Ctx, args: argparse.Namespace) -> int:
    target = _load_factory(args.factory)
    made = target()
    if inspect.isawaitable(made):
        made = await made
    # A factory builds a loop (it has ``run``); anything else callable it gave is the factory.
    factory = target if hasattr(made, "run") else made
    if not callable(factory):
        raise ConfigError(f"--factory {args.factory!r} gave a {type(made).__name__}, "
                          "neither a loop nor a factory")
    store = ctx.open()
    agent = await durable.open(factory, store=store, session_id=args.session, create=False)
    ctx.interrupt_hint = f"stopped; run `{continue_hint(args.session)}` again to go on"
    stored = 0
    failed = False
    async with agent.continue_run() as run:
        async for event in run:
            if isinstance(event, StoredMessageEnd):
                for entry in event.entries:
                    stored += 1
                    ctx.out.line(*describe(entry, width=200 if ctx.out.is_terminal else None))
            elif isinstance(event, AgentEnd) and event.error is not None:
                failed = True
                ctx.err.line(("error: ", "bold red"), "the run failed: "
                             + " ".join(str(event.error).split()))
    if not stored and not failed:
        ctx.out.line(f"nothing to continue in session {args.session}: no tool calls are open "
                     "at its leaf")
    return 1 if failed else 0


VERBS = [
    Verb("chat", "chat in a session with a real model", _conf_chat, _chat),
    Verb("branch", "continue a session from an earlier entry (same as chat --at)",
         _conf_branch, _chat),
    Verb("continue", "finish a run that an approval or a crash left open, with the "
         "application's factory", _conf_continue, _continue),
]
