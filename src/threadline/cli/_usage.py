"""``threadline usage``: token totals and cost from the stored usage."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from threadline.cli._command import Ctx, Verb
from threadline.cli._output import visible
from threadline.durable._usage import (
    SCOPES,
    PriceTable,
    UsageItem,
    UsageReport,
    cost_of,
    group_key,
    price_for,
    read_prices,
    scoped,
)
from threadline.errors import ConfigError
from threadline.stores._contract import CatalogStore

__all__ = ["VERBS", "read_price_file"]

_GROUPS = ("model", "day", "session", "source")


def _conf(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="one session (default: every session of the store)")
    p.add_argument("--by", choices=_GROUPS, help="one row per model, UTC day, session or source")
    p.add_argument("--scope", choices=SCOPES, default="session",
                   help="with SESSION: path, branch, session (default) or with_forks")
    p.add_argument("--prices", metavar="FILE",
                   help="a JSON price table for a cost column (default: $THREADLINE_PRICES); "
                        "see docs/usage.md")
    p.add_argument("--json", action="store_true", help="one JSON object")


async def _items(ctx: Ctx, store: CatalogStore, args: argparse.Namespace
                 ) -> tuple[list[UsageItem], list[str]]:
    if args.session is not None:
        from threadline.durable._usage import usage

        # Through ctx.load for one session, so its notices (a torn tail) are said.
        if args.scope == "with_forks":
            report: UsageReport = await usage(store, args.session, scope="with_forks")
            return list(report.items), list(report.sessions)
        entries = await ctx.load(store, args.session)
        return scoped(args.scope, args.session, entries), [args.session]
    if args.scope != "session":
        raise ConfigError(f"--scope {args.scope} needs a SESSION")
    items: list[UsageItem] = []
    sessions: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(limit=500, cursor=cursor)
        for record in page.sessions:
            sessions.append(record.id)
            items.extend(scoped("session", record.id, await ctx.load(store, record.id)))
        for problem in page.problems:
            ctx.notice(f"not a session, not counted: {problem}")
        cursor = page.next_cursor
        if cursor is None:
            return items, sessions


def read_price_file(args: argparse.Namespace) -> PriceTable | None:
    """The table ``--prices`` (or ``$THREADLINE_PRICES``) names, if any."""
    path = args.prices or os.environ.get("THREADLINE_PRICES")
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"price table {path!r}: {exc.strerror or exc}") from exc
    try:
        return read_prices(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


_FIELDS = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


def _group(items: list[UsageItem], by: str | None, prices: PriceTable | None
           ) -> tuple[dict[str, dict[str, Any]], set[str]]:
    rows: dict[str, dict[str, Any]] = {}
    unpriced: set[str] = set()
    for item in items:
        key = "total" if by is None else group_key(item, by)
        row = rows.setdefault(key, _empty())
        row["calls"] += 1
        for name in _FIELDS:
            row[name] += getattr(item.usage, name)
        row["total_tokens"] += item.usage.total_tokens
        if prices is not None:
            price = price_for(prices, item.provider, item.model)
            if price is None:
                unpriced.add(item.model_key)
            else:
                row["cost"] += cost_of(item.usage, price)
    return rows, unpriced


def _empty() -> dict[str, Any]:
    return {"calls": 0, **dict.fromkeys(_FIELDS, 0), "total_tokens": 0, "cost": 0.0}


async def _usage(ctx: Ctx, args: argparse.Namespace) -> None:
    prices = read_price_file(args)
    store = ctx.open()
    items, sessions = await _items(ctx, store, args)
    rows, unpriced = _group(items, args.by, prices)
    total, _ = _group(items, None, prices)
    whole = total.get("total", _empty())
    if prices is None:
        for row in (*rows.values(), whole):
            row.pop("cost")
    if args.json:
        ctx.out.json({
            "session": args.session, "scope": args.scope, "by": args.by,
            "sessions": len(sessions),
            "groups": [{"key": k, **v} for k, v in sorted(rows.items())] if args.by else [],
            "total": whole, "unpriced": sorted(unpriced),
        })
    else:
        head = ((args.by or "").upper(), "CALLS", "INPUT", "CACHE READ", "CACHE WRITE",
                "OUTPUT", "TOTAL") + (("COST",) if prices is not None else ())
        body = [(visible(k), *_cells(v, prices)) for k, v in sorted(rows.items())] if args.by \
            else []
        ctx.out.table([head[1:] if not args.by else head, *body,
                       *([("TOTAL", *_cells(whole, prices))] if args.by
                         else [tuple(_cells(whole, prices))])])
    for name in sorted(unpriced):
        ctx.notice(f"no price for {visible(name)}: its calls are not in the cost")


def _cells(row: dict[str, Any], prices: PriceTable | None) -> list[str]:
    cells = [str(row["calls"]), *(f"{row[n]:,}" for n in _FIELDS), f"{row['total_tokens']:,}"]
    if prices is not None:
        cells.append(f"{row['cost']:.4f}")
    return cells


VERBS = [
    Verb("usage", "token totals (and cost, with a price table) from the stored usage",
         _conf, _usage),
]
