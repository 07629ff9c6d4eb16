"""Verbs that only read: ``list``, ``show``, ``tree``, ``export``, ``check``.

They open the store with ``create=False``: naming a store that does not
exist is an error, never a new empty store.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from threadline.cli._command import Ctx, Verb, whole_number
from threadline.cli._formats import EXPORTERS, blob_line
from threadline.cli._output import Out, json_bytes, paged, visible
from threadline.cli._render import Abbrev, count, describe, hidden_note, resolve, tree_lines
from threadline.errors import ConfigError, CorruptLog, StoreError
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry
from threadline.session._tree import TreeIndex
from threadline.stores._blobs import SessionBlobs, blob_parts, open_blob
from threadline.stores._contract import BlobStore, CatalogStore
from threadline.stores._rules import entry_type
from threadline.viewer._common import shown_by_default

__all__ = ["VERBS"]


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: JSON, full ids, no wrapping")


# -- list -------------------------------------------------------------------------


def _conf_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=whole_number(1), default=50,
                   help="at most this many (default 50)")
    p.add_argument("--owner", help="only the sessions of this owner (user id)")
    p.add_argument("--tenant", help="only the sessions of this tenant")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                   type=label_pair, help="only sessions with this label (repeatable)")
    p.add_argument("--sort", choices=("created", "activity"), default="created",
                   help="newest created first (default) or newest activity first")
    p.add_argument("--entries", action="store_true",
                   help="also count each session's entries (loads every listed session)")
    add_json(p)


async def _list(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    page = await store.list_sessions(limit=args.limit, owner=args.owner, tenant=args.tenant,
                                     labels=dict(args.label), order=args.sort)
    # The listing is the catalog alone; counting entries means loading every
    # log, which only --entries asks for.
    counts: dict[str, int | None] = {}
    if args.entries:
        for record in page.sessions:
            try:
                counts[record.id] = len(await ctx.load(store, record.id))
            except CorruptLog:
                counts[record.id] = None
    if args.json:
        for info in page.infos:
            record, meta = info.record, info.metadata
            row: dict[str, object] = {"id": record.id, "parent_id": record.parent_id,
                   "created_at": record.created_at, "last_activity": info.last_activity,
                   "title": meta.title, "owner": meta.owner, "tenant": meta.tenant,
                   "labels": meta.labels}
            if args.entries:
                row |= {"entries": counts[record.id], "corrupt": counts[record.id] is None}
            ctx.out.json(row)
    else:
        # The title last: the one column of free text, of any length.
        head = ("SESSION", "PARENT", "CREATED", "ACTIVE") + (
            ("ENTRIES",) if args.entries else ()) + ("OWNER", "TITLE")
        rows = [head] + [
            (visible(i.id), visible(i.record.parent_id or ""),
             f"{i.record.created_at:%Y-%m-%d %H:%M:%S}", f"{i.last_activity:%Y-%m-%d %H:%M:%S}")
            + ((_count_cell(counts[i.id]),) if args.entries else ())
            + (visible(i.metadata.owner or ""), visible(_cut(i.title or "")))
            for i in page.infos]
        ctx.out.table(rows)
    for problem in page.problems:
        # One unreadable file never hides the rest (S18); it is named on stderr.
        ctx.notice(f"not a session: {problem}")
    if page.next_cursor:
        ctx.notice(f"more than {count(args.limit, 'session')}; use --limit")


def _cut(title: str, width: int = 40) -> str:
    return title if len(title) <= width else title[: width - 1] + "…"


def label_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as a pair (an argparse type)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _count_cell(n: int | None) -> str:
    return "corrupt (see threadline check)" if n is None else str(n)


# -- show ---------------------------------------------------------------------------


def _conf_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--at", metavar="ENTRY",
                   help="show the path to this entry (full id, or a unique prefix or the "
                        "short id shown) instead of to the leaf")
    p.add_argument("--tail", type=whole_number(0), metavar="N",
                   help="only the last N entries of the path")
    add_view_options(p)
    add_json(p)


def add_view_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--custom", action="store_true",
                   help="also show custom entries (an application's records, the raw and "
                        "extra data of an import)")
    p.add_argument("--no-pager", action="store_true", help="never page, even on a terminal")


def without_custom(path: list[Entry], custom: bool) -> tuple[list[Entry], int]:
    """``path`` as a view shows it (custom entries left out unless ``custom``),
    and how many it left out."""
    if custom:
        return path, 0
    kept = [e for e in path if shown_by_default(e)]
    return kept, len(path) - len(kept)


def write_path(out: Out, tree: TreeIndex, path: list[Entry], *, skipped: int = 0,
               hidden: int = 0) -> None:
    """The lines ``show`` prints for ``path`` (also how ``chat`` recalls a session)."""
    abbrev = Abbrev(e.id for e in tree)
    if skipped:
        out.line((f"… {count(skipped, 'earlier entry')}", "dim"))
    # Whole lines on a pipe; cut to a screen's width on a terminal.
    width = 200 if out.is_terminal else None
    for entry in path:
        out.line((abbrev(entry.id) + "  ", "dim"), *describe(entry, width=width))
    if hidden:
        out.line(*hidden_note(hidden))


def _last(path: list[Entry], n: int | None) -> tuple[list[Entry], int]:
    """The last ``n`` entries of ``path`` (all for None), and how many came before."""
    skipped = 0 if n is None else max(0, len(path) - n)
    return path[skipped:], skipped


async def _show(ctx: Ctx, args: argparse.Namespace) -> None:
    tree = await ctx.tree(ctx.open(), args.session)
    path = tree.path(resolve(tree, args.at) if args.at else None)
    if args.json:
        tail, _ = _last(path, args.tail)
        ctx.out.raw(json_bytes(b"".join(encode_entry(e) + b"\n" for e in tail)))
        return
    shown, hidden = without_custom(path, args.custom)
    shown, skipped = _last(shown, args.tail)
    with paged(ctx.out, enabled=not args.no_pager) as out:
        write_path(out, tree, shown, skipped=skipped, hidden=hidden)


# -- tree ---------------------------------------------------------------------------


def _conf_tree(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    add_view_options(p)
    add_json(p)


async def _tree(ctx: Ctx, args: argparse.Namespace) -> None:
    tree = await ctx.tree(ctx.open(), args.session)
    if args.json:
        active = {e.id for e in tree.path()}
        ctx.out.json({"session": args.session, "leaf_id": tree.leaf_id, "entries": [
            {"id": e.id, "parent_id": e.parent_id, "type": entry_type(e), "on_path": e.id in active}
            for e in tree]})
        return
    with paged(ctx.out, enabled=not args.no_pager) as out:
        out.line((f"session {args.session}", "bold"))
        for line in tree_lines(tree, custom=args.custom,
                               width=70 if out.is_terminal else None):
            out.line(*line)


# -- export -------------------------------------------------------------------------


def _conf_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="*", metavar="SESSION",
                   help="the session (with --bundle: any number, default all)")
    p.add_argument("--bundle", metavar="DIR|FILE.tar",
                   help="write the sessions and the blobs they reference to a new folder, "
                        "or one tar file, which `threadline import` reads back byte for byte")
    p.add_argument("--no-blobs", action="store_true",
                   help="jsonl: leave out the lines carrying the referenced blobs' bytes")
    p.add_argument("--format", choices=sorted([*EXPORTERS, "html"]), default="jsonl",
                   help="jsonl (default): the session as stored, which `threadline import` "
                        "reads back; messages: the model context as JSON; markdown: the "
                        "active path for people; html: one self-contained page of the tree")
    html = p.add_argument_group("html", "the page is one page of the viewer: the one holding "
                                        "the leaf, of at most 500 stored entries")
    which = html.add_mutually_exclusive_group()
    which.add_argument("--page", type=whole_number(1), metavar="N",
                       help="write page N of the session instead (1 is the oldest)")
    which.add_argument("--all", action="store_true", help="write every entry on one page")
    html.add_argument("--custom", action="store_true",
                      help="also draw custom entries (an application's records, the raw and "
                           "extra data of an import)")


async def _export(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    if args.bundle:
        from threadline.cli._bundle import write_bundle

        sessions, blobs = await write_bundle(store, list(args.sessions), Path(args.bundle))
        ctx.err.line(f"wrote {count(sessions, 'session')} and {count(blobs, 'blob')} to "
                     f"{args.bundle}")
        return
    if len(args.sessions) != 1:
        raise ConfigError("export writes one session to stdout (give one id), or any number "
                          "with --bundle DIR|FILE.tar")
    args.session = args.sessions[0]
    tree = await ctx.tree(store, args.session)
    if args.format == "html":
        # The page names the session's forks, so it needs the store, not just the tree.
        from threadline.viewer._cli import export_html

        data, layout, drawn = await export_html(store, tree, page=args.page, whole=args.all,
                                                custom=args.custom)
        ctx.out.raw(data)
        if layout.pages > 1:
            ctx.notice(f"page {drawn} of {layout.pages} ({count(layout.entries, 'entry')} in "
                       f"pages of {layout.per_page}); --page N writes another, --all "
                       "writes every entry")
        return
    record = await store.load_session(args.session)
    ctx.out.raw(EXPORTERS[args.format](record, tree, ctx.out.is_terminal))
    if args.format == "jsonl" and not args.no_blobs:
        # The bytes of the blobs the entries reference follow them, so the
        # one file holds everything `import` needs.
        for part in blob_parts(tree.entries):
            ctx.out.raw(blob_line(part, await open_blob(store, args.session, part)))


# -- check --------------------------------------------------------------------------


def _conf_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="*", help="session ids (default: all)")
    add_json(p)


async def _targets(store: CatalogStore, ids: list[str]) -> list[tuple[str | None, str]]:
    """What to check: (session id, its label), or (None, what the store found in
    place of a session). The folder is read only through the store's listing,
    so what is not a session (a link, a FIFO, another file) is named, never opened."""
    if ids:
        return [(sid, sid) for sid in ids]
    out: list[tuple[str | None, str]] = []
    cursor = None
    while True:
        page = await store.list_sessions(limit=500, cursor=cursor)
        out += [(None, " ".join(str(p).split())) for p in page.problems]
        out += [(r.id, r.id) for r in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            return out


async def _check_one(store: CatalogStore, sid: str) -> tuple[list[str], int]:
    from threadline.durable._repair import orphaned_results

    with warnings.catch_warnings():
        # What the store recovered from is in the log's diagnostics: said once, below.
        warnings.simplefilter("ignore", RuntimeWarning)
        entries = await store.load_entries(sid)
    tree = TreeIndex(entries, session_id=sid)
    notes = [" ".join(str(d).split()) for d in getattr(entries, "diagnostics", [])]
    orphans = orphaned_results(tree.path())
    if orphans:
        notes.append(f"{count(len(orphans), 'tool call')} without a result on the active path "
                     "(repaired when an agent opens it)")
    missing = [e for e in tree if e.parent_id is not None and e.parent_id not in tree]
    if missing:
        notes.append(f"{count(len(missing), 'entry', 'entries')} whose parent is not in the "
                     "log")
    if tree.duplicates:
        notes.append(f"{count(tree.duplicates, 'duplicate entry id')}")
    gone = await _missing_blobs(store, sid, entries)
    if gone:
        notes.append(f"{count(len(gone), 'referenced blob')} not stored ({', '.join(gone[:3])}"
                     + (", ..." if len(gone) > 3 else "") + "): a model call that needs one "
                     "fails with BlobNotFound")
    return notes, len(tree)


async def _missing_blobs(store: CatalogStore, sid: str, entries: list[Entry]) -> list[str]:
    """The short hashes of the blobs the entries reference that the store lacks."""
    parts = blob_parts(entries)
    if not parts:
        return []
    if not isinstance(store, BlobStore):
        return [p.sha256[:12] for p in parts]
    if isinstance(store, SessionBlobs):  # keyed per subject: any key version will do
        keys = await store.session_blob_keys(sid, parts)
    else:
        keys = {p.sha256: [p.sha256] for p in parts}
    have = await store.has_blobs(sorted({k for ks in keys.values() for k in ks}))
    return [p.sha256[:12] for p in parts if not have.intersection(keys.get(p.sha256, ()))]


async def _check(ctx: Ctx, args: argparse.Namespace) -> int:
    store = ctx.open()
    problems = 0
    for sid, label in await _targets(store, list(args.sessions)):
        notes: list[str] = []
        entries = 0
        error: str | None = label if sid is None else None
        if sid is not None:
            try:
                notes, entries = await _check_one(store, sid)
            except StoreError as exc:  # report it, check the rest
                error = " ".join(str(exc).split())
        problems += bool(error or notes)
        if args.json:
            ctx.out.json({"session": sid, "ok": not (error or notes), "entries": entries,
                          "problems": [error] if error else notes})
        elif error:
            ctx.out.line(("✗ ", "red"), f"{sid}: {error}" if sid else error)
        elif notes:
            ctx.out.line(("! ", "yellow"), f"{sid}: " + "; ".join(notes))
        else:
            ctx.out.line(("✓ ", "green"), f"{sid}: {count(entries, 'entry')}")
    return 1 if problems else 0


VERBS = [
    Verb("list", "list sessions, newest first", _conf_list, _list),
    Verb("show", "print the active path of a session (or the path to --at ENTRY)",
         _conf_show, _show),
    Verb("tree", "draw the entry tree of a session", _conf_tree, _tree),
    Verb("export", "write a session to stdout", _conf_export, _export),
    Verb("check", "load sessions and report problems (exit 1 if any)", _conf_check, _check),
]
