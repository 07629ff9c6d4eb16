"""Verbs that only read: ``list``, ``show``, ``tree``, ``export``, ``check``.

They open the store with ``create=False``: naming a store that does not
exist is an error, never a new empty store (S28).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from threadline.cli._app import Ctx, Verb
from threadline.cli._formats import EXPORTERS
from threadline.cli._output import Out, json_bytes, paged, visible
from threadline.cli._render import Abbrev, describe, resolve, session_tree
from threadline.errors import CorruptLog, SessionNotFound, StoreError
from threadline.session._codec import decode_init, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._file import FileStore
from threadline.session._store import CatalogStore
from threadline.session._storekit import entry_type
from threadline.session._tree import TreeIndex

__all__ = ["VERBS"]


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: JSON, full ids, no wrapping")


# -- list -------------------------------------------------------------------------


def _conf_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_json(p)


async def _list(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    page = await store.list_sessions(limit=args.limit)
    rows: list[tuple[SessionRecord, int | None]] = []
    for record in page.sessions:
        try:
            rows.append((record, len(await ctx.load(store, record.id))))
        except CorruptLog:
            rows.append((record, None))
    if args.json:
        for record, count in rows:
            ctx.out.json({"id": record.id, "parent_id": record.parent_id,
                          "created_at": record.created_at, "entries": count,
                          "corrupt": count is None})
    else:
        table = [("SESSION", "PARENT", "CREATED", "ENTRIES")] + [
            (visible(r.id), visible(r.parent_id or ""), f"{r.created_at:%Y-%m-%d %H:%M:%S}",
             "corrupt (see threadline check)" if n is None else str(n)) for r, n in rows]
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        for n, row in enumerate(table):
            cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
            ctx.out.line((" ".join([*cells, row[3]]).rstrip(), "bold" if n == 0 else ""))
    for problem in page.problems:
        # One unreadable file never hides the rest (S18); it is named on stderr.
        ctx.notice(f"not a session: {problem}")
    if page.next_cursor:
        ctx.notice(f"more than {args.limit} sessions; use --limit")


# -- show ---------------------------------------------------------------------------


def _conf_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--at", metavar="ENTRY",
                   help="show the path to this entry (full id, or a unique prefix or the "
                        "short id shown) instead of to the leaf")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N entries of the path")
    p.add_argument("--no-pager", action="store_true", help="never page, even on a terminal")
    add_json(p)


def write_path(out: Out, tree: TreeIndex, path: list[Entry], *, skipped: int = 0) -> None:
    """The lines ``show`` prints for ``path`` (also how ``chat`` recalls a session)."""
    abbrev = Abbrev(e.id for e in tree)
    if skipped:
        out.line((f"… {skipped} earlier entries", "dim"))
    for entry in path:
        out.line((abbrev(entry.id) + "  ", "dim"), *describe(entry, width=200))


async def _show(ctx: Ctx, args: argparse.Namespace) -> None:
    tree = await ctx.tree(ctx.open(), args.session)
    path = tree.path(resolve(tree, args.at) if args.at else None)
    skipped = 0
    if args.tail is not None:
        skipped = max(0, len(path) - max(0, args.tail))
        path = path[skipped:]
    if args.json:
        data = b"".join(encode_entry(e) + b"\n" for e in path)
        ctx.out.raw(json_bytes(data))
        return
    with paged(ctx.out, enabled=not args.no_pager) as out:
        write_path(out, tree, path, skipped=skipped)


# -- tree ---------------------------------------------------------------------------


def _conf_tree(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--no-pager", action="store_true", help="never page, even on a terminal")
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
        out.console(wide=True).print(session_tree(tree, title=f"session {args.session}"))


# -- export -------------------------------------------------------------------------


def _conf_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--format", choices=sorted([*EXPORTERS, "html"]), default="jsonl",
                   help="jsonl (default): the session as stored, which `threadline import` "
                        "reads back; messages: the model context as JSON; markdown: the "
                        "active path for people; html: one self-contained page of the tree")


async def _export(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    tree = await ctx.tree(store, args.session)
    if args.format == "html":
        # The page links the session's forks, so it needs the store, not just the tree.
        from threadline.viewer._cli import export_html

        ctx.out.raw(await export_html(store, tree))
        return
    record = await store.load_session(args.session)
    ctx.out.raw(EXPORTERS[args.format](record, tree, ctx.out.is_terminal))


# -- check --------------------------------------------------------------------------


def _conf_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="*", help="session ids (default: all)")
    add_json(p)


async def _targets(store: CatalogStore, ids: list[str]) -> list[tuple[str, str | None]]:
    """(label, session id, or None with the label naming a file that is no session)."""
    if ids:
        return [(sid, sid) for sid in ids]
    if isinstance(store, FileStore):
        # Walk the files rather than the listing, so a bad file is named, not skipped.
        found: list[tuple[str, str | None]] = []
        for path in sorted(store.root.glob("*.jsonl")):
            if not path.name.startswith("."):
                found.append(_file_target(path))
        return found
    out: list[tuple[str, str | None]] = []
    cursor = None
    while True:
        page = await store.list_sessions(limit=500, cursor=cursor)
        out += [(r.id, r.id) for r in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            return out


def _file_target(path: Path) -> tuple[str, str | None]:
    try:
        with path.open("rb") as f:
            return path.name, decode_init(f.readline().rstrip(b"\n"), path=str(path)).id
    except CorruptLog as exc:
        return str(exc), None
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror}", None


async def _check_one(ctx: Ctx, store: CatalogStore, sid: str) -> tuple[list[str], int]:
    from threadline.durable._repair import orphaned_results

    entries = await ctx.load(store, sid)
    tree = TreeIndex(entries, session_id=sid)
    notes = [" ".join(str(d).split()) for d in getattr(entries, "diagnostics", [])]
    orphans = orphaned_results(tree.path())
    if orphans:
        notes.append(f"{len(orphans)} tool call(s) without a result on the active path "
                     "(repaired when an agent opens it)")
    missing = [e for e in tree if e.parent_id is not None and e.parent_id not in tree]
    if missing:
        notes.append(f"{len(missing)} entr(y/ies) whose parent is not in the log")
    if tree.duplicates:
        notes.append(f"{tree.duplicates} duplicate entry id(s)")
    return notes, len(tree)


async def _check(ctx: Ctx, args: argparse.Namespace) -> int:
    store = ctx.open()
    problems = 0
    for label, sid in await _targets(store, list(args.sessions)):
        notes: list[str] = []
        count = 0
        error: str | None = label if sid is None else None
        if sid is not None:
            try:
                notes, count = await _check_one(ctx, store, sid)
            except (CorruptLog, SessionNotFound) as exc:  # report it, check the rest
                error = str(exc)
            except StoreError as exc:
                error = str(exc)
        problems += bool(error or notes)
        if args.json:
            ctx.out.json({"session": sid, "ok": not (error or notes), "entries": count,
                          "problems": [error] if error else notes})
        elif error:
            ctx.out.line(("✗ ", "red"), f"{sid}: {error}" if sid else error)
        elif notes:
            ctx.out.line(("! ", "yellow"), f"{sid}: " + "; ".join(notes))
        else:
            ctx.out.line(("✓ ", "green"), f"{sid}: {count} entries")
    return 1 if problems else 0


VERBS = [
    Verb("list", "list sessions, newest first", _conf_list, _list),
    Verb("show", "print the active path of a session (or the path to --at ENTRY)",
         _conf_show, _show),
    Verb("tree", "draw the entry tree of a session", _conf_tree, _tree),
    Verb("export", "write a session to stdout", _conf_export, _export),
    Verb("check", "load sessions and report problems (exit 1 if any)", _conf_check, _check),
]
