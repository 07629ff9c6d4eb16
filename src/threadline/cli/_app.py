"""The command line: global options, the verb registry, and how errors end a run.

A verb is a name, a help line, a function adding its arguments and an async
function running it; each group of verbs lives in its own module and lists
its ``VERBS``. Adding a verb is a new entry in ``_verbs()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from threadline import __version__
from threadline.cli._output import Out, stderr, visible
from threadline.errors import ThreadlineError
from threadline.session._entries import Entry
from threadline.session._store import CatalogStore
from threadline.session._tree import TreeIndex

__all__ = ["DEFAULT_STORE", "Ctx", "Verb", "main"]

DEFAULT_STORE = "./threadline-demo"


@dataclass
class Ctx:
    """What a verb gets: its arguments, the two output streams, and store opening."""

    args: argparse.Namespace
    out: Out
    err: Out
    interrupt_hint: str | None = None
    """Said on Ctrl-C (for example, how to resume)."""
    _stores: list[CatalogStore] = field(default_factory=list)

    @property
    def store_url(self) -> str:
        url: str | None = getattr(self.args, "store", None)
        return url or os.environ.get("THREADLINE_STORE") or DEFAULT_STORE

    def open(self, url: str | None = None, *, create: bool = False) -> CatalogStore:
        """The store ``url`` names (default ``--store``); a reader passes ``create=False``."""
        from threadline.stores import open_store

        store = open_store(self.store_url if url is None else url, create=create)
        self._stores.append(store)
        return store

    def notice(self, text: str) -> None:
        self.err.line(("notice: ", "yellow"), text)

    async def load(self, store: CatalogStore, session_id: str) -> list[Entry]:
        """A session's log; what the store recovered from becomes a one-line notice."""
        with warnings.catch_warnings():
            # The file store also warns about a torn tail; its diagnostics say it once.
            warnings.simplefilter("ignore", RuntimeWarning)
            log = await store.load_entries(session_id)
        for diagnostic in getattr(log, "diagnostics", ()):
            self.notice(" ".join(str(diagnostic).split()))
        return log

    async def tree(self, store: CatalogStore, session_id: str) -> TreeIndex:
        return TreeIndex(await self.load(store, session_id), session_id=session_id)

    async def close(self) -> None:
        for store in self._stores:
            with contextlib.suppress(ThreadlineError):
                await store.close()


class Verb(NamedTuple):
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Ctx, argparse.Namespace], Awaitable[int | None]]


def _verbs() -> list[Verb]:
    from threadline.cli import _approvals, _chat, _demo, _read, _serve, _write

    return [*_demo.VERBS, *_read.VERBS, *_write.VERBS, *_chat.VERBS, *_approvals.VERBS,
            *_serve.VERBS]


class _Parser(argparse.ArgumentParser):
    """Usage errors quote what was typed; they are escaped like everything else (S28)."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(visible(message, keep_lines=True))


def _parser(verbs: Sequence[Verb]) -> argparse.ArgumentParser:
    store_help = ("store URL or folder (default: $THREADLINE_STORE or "
                  f"{DEFAULT_STORE}); accepted before or after the command")
    p = _Parser(
        prog="threadline",
        description="Durable LLM-agent conversations: inspect, move and demo sessions.",
    )
    p.add_argument("--version", action="version", version=f"threadline {__version__}")
    p.add_argument("--store", default=None, help=store_help)
    # The same option on every verb; SUPPRESS keeps an absent one from hiding
    # a --store given before the verb.
    shared = _Parser(add_help=False)
    shared.add_argument("--store", default=argparse.SUPPRESS, help=store_help)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in verbs:
        verb.configure(sub.add_parser(verb.name, help=verb.help, description=verb.help,
                                      parents=[shared]))
    return p


def main(argv: Sequence[str] | None = None) -> None:
    verbs = _verbs()
    args = _parser(verbs).parse_args(argv)
    run = next(v.run for v in verbs if v.name == args.command)
    ctx = Ctx(args, Out.for_stream(sys.stdout), stderr())

    async def go() -> int | None:
        try:
            return await run(ctx, args)
        finally:
            await ctx.close()

    def notice(message: Warning | str, *_: object, **__: object) -> None:
        ctx.notice(" ".join(str(message).split()))

    try:
        with warnings.catch_warnings():
            # A warning from a store (a torn tail met by durable.open) is one
            # line like any notice, not Python's two lines with source code.
            warnings.showwarning = notice
            code = asyncio.run(go())
    except ThreadlineError as exc:
        ctx.err.line(("error: ", "bold red"), " ".join(str(exc).split()))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        ctx.err.line(("interrupted", "bold red"),
                     f": {ctx.interrupt_hint}" if ctx.interrupt_hint else "")
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader went away (``threadline export ... | head``): not an error.
        # Point stdout at /dev/null so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None
    if code:
        raise SystemExit(code)
