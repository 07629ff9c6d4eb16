"""``threadline meta``: read or change a session's metadata.

A change is appended to the log like any other entry, so ``meta`` on a
session another process is writing to is safe: the last change appended wins.
"""

from __future__ import annotations

import argparse

from msgspec import UNSET

from threadline.cli._command import Ctx, Verb
from threadline.cli._output import visible
from threadline.cli._read import add_json, label_pair
from threadline.session._metadata import SessionMetadata
from threadline.stores._listing import load_metadata, set_metadata

__all__ = ["VERBS"]


def _conf_meta(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--title", help="set the title ('' clears it)")
    p.add_argument("--owner", help="set the owner, a user id ('' clears it)")
    p.add_argument("--tenant", help="set the tenant ('' clears it)")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                   type=label_pair, help="set a label (repeatable)")
    p.add_argument("--unlabel", action="append", default=[], metavar="NAME",
                   help="remove a label (repeatable)")
    add_json(p)


async def _meta(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    fields = {name: (UNSET if value is None else value or None)
              for name in ("title", "owner", "tenant") for value in [getattr(args, name)]}
    labels: dict[str, str | None] = {name: None for name in args.unlabel}
    labels.update(dict(args.label))
    if labels or any(v is not UNSET for v in fields.values()):
        await set_metadata(store, args.session, labels=labels, **fields)
    meta = await load_metadata(store, args.session)
    _show(ctx, args.session, meta, args.json)


def _show(ctx: Ctx, sid: str, meta: SessionMetadata, as_json: bool) -> None:
    if as_json:
        ctx.out.json({"id": sid, "title": meta.title, "owner": meta.owner,
                      "tenant": meta.tenant, "labels": meta.labels})
        return
    rows: list[tuple[str, ...]] = [("session", visible(sid)), ("title", visible(meta.title or "")),
            ("owner", visible(meta.owner or "")), ("tenant", visible(meta.tenant or ""))]
    rows += [(f"label {visible(k)}", visible(v)) for k, v in sorted(meta.labels.items())]
    ctx.out.table(rows)


VERBS = [
    Verb("meta", "show or change a session's title, owner, tenant and labels", _conf_meta,
         _meta),
]
