"""The ``threadline`` command: demo, and tools to inspect and move sessions.

Every command that reads sessions takes ``--store URL`` (a folder, ``file:``,
``sqlite:``, ``postgresql://`` or ``memory:``; default ``$THREADLINE_STORE``
or ``./threadline-demo``). Errors print one line naming what and where and
exit with status 1 (2 for bad usage); no traceback for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from threadline.errors import CorruptLog, ThreadlineError

__all__ = ["main"]

DEFAULT_STORE = "./threadline-demo"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="threadline",
        description="Durable LLM-agent conversations: inspect, move and demo sessions.",
    )
    p.add_argument("--store", default=os.environ.get("THREADLINE_STORE", DEFAULT_STORE),
                   help="store URL or folder (default: $THREADLINE_STORE or %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="crash, repair, branch and fork a session, offline")
    d.add_argument("--dir", default=DEFAULT_STORE, help="folder for the demo's file store")

    ls = sub.add_parser("list", help="list sessions, newest first")
    ls.add_argument("--limit", type=int, default=50)

    for name, text in (("show", "print the active path of a session"),
                       ("tree", "draw the entry tree of a session")):
        c = sub.add_parser(name, help=text)
        c.add_argument("session")

    e = sub.add_parser("export", help="write a session to stdout")
    e.add_argument("session")
    e.add_argument("--format", choices=("jsonl", "messages"), default="jsonl",
                   help="jsonl: every entry as stored; messages: the model context as JSON")

    f = sub.add_parser("fork", help="copy a session's active path into a new session")
    f.add_argument("session")
    f.add_argument("--id", help="id of the new session (default: generated)")

    c = sub.add_parser("check", help="load sessions and report problems (exit 1 if any)")
    c.add_argument("sessions", nargs="*", help="session ids (default: all)")

    cp = sub.add_parser("copy", help="copy sessions between stores (resumable)")
    cp.add_argument("source")
    cp.add_argument("destination")
    cp.add_argument("ids", nargs="*", help="session ids (default: all)")

    ch = sub.add_parser("chat", help="chat in a session with a real model")
    ch.add_argument("session", nargs="?", help="session id (default: a new one)")
    ch.add_argument("--model", default=os.environ.get("THREADLINE_MODEL", "openai:gpt-4.1-mini"),
                    help="provider:model (default: $THREADLINE_MODEL or %(default)s)")
    ch.add_argument("--system", default=None, help="system prompt")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        args.dir = os.path.abspath(args.dir)
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    try:
        asyncio.run(_dispatch(args, console))
    except ThreadlineError as exc:
        err.print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader went away (``threadline export ... | head``): not an error.
        # Point stdout at /dev/null so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None


async def _dispatch(args: argparse.Namespace, console: Console) -> None:
    if args.command == "demo":
        from threadline.cli._demo import run_demo

        await run_demo(Path(args.dir), console)
        return
    if args.command == "copy":
        await _copy(args, console)
        return

    from threadline.stores import open_store

    store = open_store(args.store)
    try:
        handler = {
            "list": _list, "show": _show, "tree": _tree, "export": _export, "fork": _fork,
            "check": _check, "chat": _chat,
        }[args.command]
        await handler(store, args, console)
    finally:
        await store.close()


async def _list(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline.session._store import ManagedStore

    assert isinstance(store, ManagedStore)
    page = await store.list_sessions(limit=args.limit)
    table = Table("session", "parent", "created", "entries")
    for record in page.sessions:
        try:
            count = str(len(await store.load_entries(record.id)))
        except CorruptLog:
            count = "corrupt (see threadline check)"
        table.add_row(record.id, record.parent_id or "", f"{record.created_at:%Y-%m-%d %H:%M:%S}",
                      count)
    console.print(table)
    if page.next_cursor:
        console.print(f"(more than {args.limit}; use --limit)")


async def _open_tree(store: object, session_id: str) -> object:
    from threadline.session._store import Store
    from threadline.session._tree import TreeIndex

    assert isinstance(store, Store)
    return TreeIndex(await store.load_entries(session_id), session_id=session_id)


async def _show(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline.cli._render import describe, short
    from threadline.session._tree import TreeIndex

    tree = await _open_tree(store, args.session)
    assert isinstance(tree, TreeIndex)
    for entry in tree.path():
        console.print(f"{short(entry.id)}  ", describe(entry, width=200))


async def _tree(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline.cli._render import session_tree
    from threadline.session._tree import TreeIndex

    tree = await _open_tree(store, args.session)
    assert isinstance(tree, TreeIndex)
    console.print(session_tree(tree, title=f"session {args.session}"))


async def _export(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline.session._codec import export_lines
    from threadline.session._context import build_context
    from threadline.session._tree import TreeIndex

    tree = await _open_tree(store, args.session)
    assert isinstance(tree, TreeIndex)
    out = sys.stdout.buffer
    if args.format == "jsonl":
        out.write(export_lines(tree.entries))
    else:
        out.write(msgspec.json.format(msgspec.json.encode(build_context(tree.path()))) + b"\n")
    out.flush()


async def _fork(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline import durable
    from threadline.session._store import Store

    assert isinstance(store, Store)
    # Loading first: open() would create a session that does not exist.
    entries = await store.load_entries(args.session)
    agent = durable.DurableAgent(None, store=store, session_id=args.session, entries=entries)
    child = await agent.fork(args.id)
    console.print(f"forked {args.session} -> {child.session_id} "
                  f"({len(child.entries)} entries)")


async def _check(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline.durable._repair import orphaned_results
    from threadline.errors import CorruptLog, SessionNotFound
    from threadline.session._store import ManagedStore
    from threadline.session._tree import TreeIndex

    assert isinstance(store, ManagedStore)
    ids: list[str] = list(args.sessions)
    if not ids:
        cursor = None
        while True:
            page = await store.list_sessions(limit=500, cursor=cursor)
            ids += [r.id for r in page.sessions]
            cursor = page.next_cursor
            if cursor is None:
                break
    problems = 0
    for sid in ids:
        try:
            entries = await store.load_entries(sid)
        except (CorruptLog, SessionNotFound) as exc:  # report it, check the rest
            problems += 1
            console.print(f"[red]✗[/] {sid}: {exc}")
            continue
        tree = TreeIndex(entries, session_id=sid)
        notes = list(getattr(entries, "diagnostics", []))
        orphans = orphaned_results(tree.path())
        if orphans:
            notes.append(f"{len(orphans)} tool call(s) without a result on the active path "
                         "(repaired when an agent opens it)")
        missing = [e for e in tree if e.parent_id is not None and e.parent_id not in tree]
        if missing:
            notes.append(f"{len(missing)} entr(y/ies) whose parent is not in the log")
        if tree.duplicates:
            notes.append(f"{tree.duplicates} duplicate entry id(s)")
        if notes:
            problems += 1
            console.print(f"[yellow]![/] {sid}: " + "; ".join(notes))
        else:
            console.print(f"[green]✓[/] {sid}: {len(tree)} entries")
    if problems:
        raise SystemExit(1)


async def _copy(args: argparse.Namespace, console: Console) -> None:
    from threadline.stores import copy_sessions, open_store

    src = open_store(args.source)
    dst = open_store(args.destination)
    try:
        result = await copy_sessions(
            src, dst, ids=list(args.ids) or None,
            progress=lambda p: console.print(f"  {p}", style="dim"),
        )
        console.print(f"copied: {result}")
    finally:
        await src.close()
        await dst.close()


async def _chat(store: object, args: argparse.Namespace, console: Console) -> None:
    from threadline import durable
    from threadline.agent._events import MessageUpdate
    from threadline.ai._model import TextDelta
    from threadline.ai._registry import get_model
    from threadline.session._store import Store

    assert isinstance(store, Store)
    lm = get_model(args.model)
    agent = await durable.open(durable.model(lm, system=args.system), store=store,
                               session_id=args.session)
    console.print(f"session {agent.session_id} ({len(agent.entries)} entries). "
                  "Empty line or Ctrl-D to quit.")
    while True:
        try:
            line = await asyncio.to_thread(input, "you> ")
        except EOFError:
            break
        if not line.strip():
            break
        async with agent.run(line) as run:
            async for event in run:
                if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                    console.print(event.event.delta, end="")
        console.print()
