"""``threadline search``: full-text search across sessions."""

from __future__ import annotations

import argparse

from threadline.cli._command import Ctx, Verb, whole_number
from threadline.cli._output import Span, visible
from threadline.errors import ConfigError
from threadline.stores._contract import SearchableStore, SearchHit, Store
from threadline.stores._search import marked, query_terms

__all__ = ["VERBS"]


def _conf(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", nargs="+", metavar="QUERY",
                   help="words an entry must all hold (any case; no operators)")
    p.add_argument("--owner", help="only sessions of this owner")
    p.add_argument("--tenant", help="only sessions of this tenant")
    p.add_argument("--active", action="store_true",
                   help="only entries on each session's active path")
    p.add_argument("--limit", type=whole_number(1), default=20,
                   help="at most this many hits (default 20, at most 1000)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per hit: session_id, entry_id, snippet, rank")


def _searchable(ctx: Ctx, store: Store) -> SearchableStore:
    from threadline.privacy import EncryptedStore

    if isinstance(store, EncryptedStore) and store.keys.provider is not None:
        # With the key, sealed sessions are searched by opening them (S65).
        store = EncryptedStore(store.inner, store.keys, searching="decrypt",
                               locked=store.locked)
    if not isinstance(store, SearchableStore):
        raise ConfigError(f"the store at {visible(ctx.store_url)} cannot search "
                          f"({type(store).__name__} has no search)")
    return store


async def _search(ctx: Ctx, args: argparse.Namespace) -> int:
    query = " ".join(args.query)
    terms = query_terms(query)
    store = _searchable(ctx, ctx.open())
    hits: list[SearchHit] = await store.search(query, owner=args.owner, tenant=args.tenant,
                                               active_path=args.active, limit=args.limit)
    for hit in hits:
        if args.json:
            ctx.out.json(hit)
            continue
        ctx.out.line((visible(hit.session_id), "cyan"), "  ", (hit.entry_id, "dim"),
                     f"  {hit.rank:.3g}")
        spans: list[Span] = ["    "]
        spans += [(text, "bold") if hit_word else text
                  for text, hit_word in marked(hit.snippet, terms)]
        ctx.out.line(*spans)
    if not hits and not args.json:
        ctx.notice("no entry holds every word of the query")
    return 0 if hits else 1


VERBS = [
    Verb("search", "find entries across sessions holding every word of QUERY", _conf, _search),
]
