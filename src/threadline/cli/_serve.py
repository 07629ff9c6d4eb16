"""The ``serve`` verb: the read-only web viewer over the ``--store``.

The viewer needs the ``viewer`` extra; it is imported only when the verb
runs, so every other verb works without it.
"""

from __future__ import annotations

import argparse

from threadline.cli._command import Ctx, Verb
from threadline.cli._usage import read_price_file

__all__ = ["VERBS"]


def _conf(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    p.add_argument("--port", type=int, default=8765,
                   help="port, 0 for any free one (%(default)s)")
    p.add_argument("--prices", metavar="FILE",
                   help="a JSON price table for the usage tables' cost column "
                        "(default: $THREADLINE_PRICES); see docs/usage.md")


async def _run(ctx: Ctx, args: argparse.Namespace) -> None:
    from threadline import viewer
    from threadline.viewer._common import is_loopback

    prices = read_price_file(args)
    store = ctx.open()
    if not is_loopback(args.host):
        ctx.err.line((f"warning: serving on {args.host}, reachable from other machines; "
                      "transcripts are readable by anyone who can connect", "yellow"))

    def ready(url: str) -> None:
        ctx.out.line(f"threadline viewer on {url} (read-only; Ctrl-C to stop)")

    await viewer.serve(store, host=args.host, port=args.port, ready=ready, prices=prices)


VERBS = [Verb("serve", "browse the store in a local, read-only web viewer", _conf, _run)]
