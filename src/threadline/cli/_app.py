"""The command line: global options, the verb registry, and how errors end a run.

Each group of verbs lives in its own module and lists its ``VERBS``
(``_command.Verb``); adding a verb is a new entry in ``_verbs()``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from threadline import __version__
from threadline.cli import (
    _approvals,
    _blobs,
    _chat,
    _demo,
    _meta,
    _privacy,
    _read,
    _search,
    _serve,
    _usage,
    _write,
)
from threadline.cli._command import DEFAULT_STORE, Ctx, Verb
from threadline.cli._output import Out, stderr, visible
from threadline.errors import ThreadlineError

__all__ = ["main"]


def _verbs() -> list[Verb]:
    return [*_demo.VERBS, *_read.VERBS, *_write.VERBS, *_chat.VERBS, *_approvals.VERBS,
            *_serve.VERBS, *_privacy.VERBS, *_blobs.VERBS, *_usage.VERBS, *_search.VERBS,
            *_meta.VERBS]


class _Parser(argparse.ArgumentParser):
    """Usage errors quote what was typed; they are escaped like everything else."""

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
    keyring_help = ("folder of the keyring of an encrypted store (default: "
                    "$THREADLINE_KEYRING); see docs/privacy.md")
    key_help = ("file holding the key-encryption key (default: $THREADLINE_KEY_FILE, or the key "
                "itself in $THREADLINE_KEY); without one encrypted content shows as locked")
    p.add_argument("--store", default=None, help=store_help)
    p.add_argument("--keyring", default=None, metavar="FOLDER", help=keyring_help)
    p.add_argument("--key-file", default=None, metavar="FILE", help=key_help)
    redact_help = ("show and export with e-mail addresses, card numbers and phone numbers "
                   "replaced by [redacted:RULE] (the store is not changed)")
    p.add_argument("--redact", action="store_true", default=False, help=redact_help)
    # The same options on every verb; SUPPRESS keeps an absent one from hiding
    # one given before the verb.
    shared = _Parser(add_help=False)
    shared.add_argument("--store", default=argparse.SUPPRESS, help=store_help)
    shared.add_argument("--keyring", default=argparse.SUPPRESS, metavar="FOLDER",
                        help=keyring_help)
    shared.add_argument("--key-file", default=argparse.SUPPRESS, metavar="FILE", help=key_help)
    shared.add_argument("--redact", action="store_true", default=argparse.SUPPRESS,
                        help=redact_help)
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
