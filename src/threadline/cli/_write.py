"""Verbs that write: ``fork``, ``delete``, ``import``, ``copy``.

A session is opened the one way the library offers, ``durable.open``, so a
fork sees the same repaired transcript an agent would. Sources are opened
with ``create=False``; only a destination may be created.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from threadline import durable
from threadline.cli._bundle import is_bundle
from threadline.cli._command import Ctx, Verb
from threadline.cli._formats import IMPORTERS, PATH_IMPORTERS, Imported, detect
from threadline.cli._output import visible
from threadline.cli._read import add_json
from threadline.cli._render import count, resolve
from threadline.errors import ConfigError, CorruptLog, StoreError, ThreadlineError
from threadline.integrations.importers import move_inline
from threadline.session._tree import TreeIndex
from threadline.stores import CopyProgress, CopyResult, copy_sessions
from threadline.stores._blobs import SessionBlobs
from threadline.stores._contract import BlobStore
from threadline.stores._memory import MemoryStore
from threadline.stores.file._format import export_lines

__all__ = ["VERBS"]


# -- fork ---------------------------------------------------------------------------


def _conf_fork(p: argparse.ArgumentParser) -> None:
    p.add_argument("session")
    p.add_argument("--id", help="id of the new session (default: generated)")
    p.add_argument("--at", metavar="ENTRY", help="fork the path to this entry, not to the leaf")
    add_json(p)


async def _fork(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    await store.load_session(args.session)  # open() would create a missing session
    agent = await durable.open(None, store=store, session_id=args.session)
    if args.at:
        agent.branch(resolve(TreeIndex(agent.entries, session_id=args.session), args.at))
    child = await agent.fork(args.id)
    if args.json:
        ctx.out.json({"source": args.session, "session_id": child.session_id,
                      "entries": len(child.entries)})
    else:
        ctx.out.line(f"forked {args.session} -> {child.session_id} "
                     f"({count(len(child.entries), 'entry')})")


# -- delete -------------------------------------------------------------------------


def _conf_delete(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="+", metavar="SESSION")
    p.add_argument("--yes", action="store_true",
                   help="do not ask (required when stdin is not a terminal)")
    add_json(p)


async def _delete(ctx: Ctx, args: argparse.Namespace) -> int:
    store = ctx.open()
    ids: list[str] = list(dict.fromkeys(args.sessions))
    for sid in ids:  # all or nothing: a typo in the third id deletes none
        await store.load_session(sid)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("delete asks before it deletes; pass --yes when stdin is not "
                              "a terminal")
        ctx.err.line(f"delete {count(len(ids), 'session')} from {ctx.store_url}: "
                     f"{', '.join(ids)}? "
                     "[y/N] ")
        if (await asyncio.to_thread(input)).strip().lower() not in ("y", "yes"):
            ctx.err.line("nothing deleted")
            return 1
    for sid in ids:
        await store.delete_session(sid)
        if args.json:
            ctx.out.json({"deleted": sid})
        else:
            ctx.out.line(f"deleted {sid}")
    return 0


# -- import -------------------------------------------------------------------------


def _conf_import(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="files to read ('-' for stdin)")
    p.add_argument("--format", choices=sorted(IMPORTERS | PATH_IMPORTERS), default=None,
                   help="what the files are (default: told from each file): threadline, "
                        "what `threadline export` writes; pi, claude-code: their JSONL "
                        "transcripts; openai-agents-sqlite: an Agents SDK SQLiteSession "
                        "database. A file of another format is refused")
    add_json(p)


def _read_file(name: str, fmt: str | None) -> tuple[str, list[Imported]]:
    """The file's format and the sessions in it."""
    shown = "<stdin>" if name == "-" else name
    if fmt in PATH_IMPORTERS:
        if name == "-":
            raise ConfigError(f"--format {fmt} reads a database file, not stdin")
        return fmt, PATH_IMPORTERS[fmt](Path(name))
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
        else:
            if fmt is None and is_bundle(Path(name)):
                return "bundle", PATH_IMPORTERS["bundle"](Path(name))
            if fmt is None:
                with Path(name).open("rb") as f:
                    fmt = detect(f.read(1 << 16))
                if fmt in PATH_IMPORTERS:
                    return fmt, PATH_IMPORTERS[fmt](Path(name))
            data = Path(name).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {shown}: {exc.strerror or exc}") from exc
    fmt = fmt or detect(data)
    if fmt is None:
        raise CorruptLog("not a threadline export, pi session file, Claude Code transcript or "
                         "Agents SDK database; if it is one of them, say which with --format",
                         path=shown, line=1)
    return fmt, IMPORTERS[fmt](data, shown)


def _one_per_session(found: list[tuple[str, Imported]]) -> list[tuple[str, Imported]]:
    """Drop a session read twice (the same file named twice); refuse two versions of one."""
    seen: dict[str, tuple[str, Imported]] = {}
    for name, item in found:
        sid = item.record.id
        if sid not in seen:
            seen[sid] = (name, item)
        elif (seen[sid][1].record, export_lines(seen[sid][1].entries)) != (
                item.record, export_lines(item.entries)):
            raise ConfigError(f"{seen[sid][0]} and {name} hold different versions of session "
                              f"{sid!r}; import one of them (nothing was imported)")
    return list(seen.values())


@contextlib.contextmanager
def _bar(ctx: Ctx, what: str, show: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on a terminal's stderr: ``update(done, total, current)``."""
    if not (show and ctx.err.is_terminal):
        yield lambda done, total, current: None
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[current]}", markup=False))
    with Progress(*columns, console=ctx.err.console(), transient=True) as bar:
        task = bar.add_task(what, total=None, current="")
        yield lambda done, total, current: bar.update(task, completed=done, total=total,
                                                      current=visible(current))


class _Files:
    """What an import made of its files: the sessions read, each file's format,
    and the files left out with why."""

    def __init__(self) -> None:
        self.found: list[tuple[str, Imported]] = []
        self.formats: dict[str, str | None] = {}
        self.failed: dict[str, str] = {}

    def fail(self, name: str, exc: ThreadlineError) -> None:
        self.failed.setdefault(name, " ".join(str(exc).split()))


def _read_all(ctx: Ctx, args: argparse.Namespace) -> _Files:
    # Each file on its own: one that cannot be read is named and left out.
    files = _Files()
    with _bar(ctx, "reading files", len(args.files) > 1) as update:
        for done, name in enumerate(args.files, 1):
            files.formats[name] = args.format
            try:
                files.formats[name], items = _read_file(name, args.format)
            except ThreadlineError as exc:
                files.fail(name, exc)
            else:
                files.found += [(name, item) for item in items]
            update(done, len(args.files), name)
    files.found = _one_per_session(files.found)
    return files


async def _write_all(ctx: Ctx, files: _Files) -> dict[str, str]:
    """Each session's status: copied, resumed, skipped, or failed (its file named)."""
    statuses: dict[str, str] = {}
    if not files.found:
        return statuses
    dst = ctx.open(create=True)
    # Inline images go to blobs when the target keeps them: staged here, then
    # carried by copy_sessions ahead of the entries that reference them.
    to_blobs = isinstance(dst, BlobStore | SessionBlobs)
    staging = MemoryStore()
    for _, item in files.found:
        for message in item.notes:
            ctx.notice(message)
        entries = item.entries
        if to_blobs:
            entries, _ = await move_inline(staging, item.record.id, entries)
        for key, data in item.blobs.items():  # a bundle's, or an export's inline blobs
            await staging.put_blob(key, data)
        await staging.create_session(item.record)
        await staging.append_entries(item.record.id, entries)
    # copy_sessions brings the resume-or-refuse rule: a session already there
    # with the same entries is skipped, one that differs is a CopyConflict.
    # One batch per session, so an interrupted import never leaves a prefix
    # that looks like a whole transcript.
    with _bar(ctx, "importing sessions", len(files.found) > 1) as update:
        for done, (name, item) in enumerate(files.found, 1):
            sid = item.record.id
            try:
                result = await copy_sessions(staging, dst, ids=[sid],
                                             batch_size=max(len(item.entries), 1))
            except StoreError as exc:
                files.fail(name, exc)
                statuses[sid] = "failed"
            else:
                statuses[sid] = ("copied" if result.copied else
                                 "resumed" if result.resumed else "skipped")
            update(done, len(files.found), sid)
    return statuses


async def _import(ctx: Ctx, args: argparse.Namespace) -> int:
    files = _read_all(ctx, args)
    statuses = await _write_all(ctx, files)
    for name, item in files.found:
        sid = item.record.id
        if statuses[sid] == "failed":
            continue
        if args.json:
            ctx.out.json({"session_id": sid, "file": name, "format": files.formats[name],
                          "entries": len(item.entries),
                          "mapped": len(item.entries) - item.kept_raw,
                          "kept_raw": item.kept_raw, "extra_fields": item.extra_fields,
                          "status": statuses[sid]})
        else:
            verb = "already present, unchanged" if statuses[sid] == "skipped" else "imported"
            raw = f", {item.kept_raw} kept raw" if item.kept_raw else ""
            ctx.out.line(f"{verb}: {sid} ({count(len(item.entries), 'entry')}{raw}) from "
                         f"{name}")
    for name, why in files.failed.items():
        if args.json:
            ctx.out.json({"file": name, "format": files.formats[name], "status": "failed",
                          "error": why})
        ctx.err.line(("error: ", "bold red"), f"{why}; not imported")
    if files.failed:
        good = len(args.files) - len(files.failed)
        ctx.err.line(("error: ", "bold red"),
                     f"{good} of {count(len(args.files), 'file')} imported; not imported: "
                     + ", ".join(files.failed))
    return 1 if files.failed else 0


# -- copy ---------------------------------------------------------------------------


def _conf_copy(p: argparse.ArgumentParser) -> None:
    p.add_argument("source")
    p.add_argument("destination")
    p.add_argument("ids", nargs="*", help="session ids (default: all)")
    p.add_argument("--json", action="store_true",
                   help="one JSON line per session, then one for the totals")


_RESUME = ("run the same command again to resume (complete sessions are skipped, a partly "
           "copied one gets the rest)")


def _summary(result: CopyResult, args: argparse.Namespace) -> str:
    total = result.copied + result.resumed + result.skipped
    return (f"{count(total, 'session')} from {args.source} to {args.destination}: "
            f"{result.copied} copied, {result.resumed} resumed, {result.skipped} already "
            f"complete; {count(result.entries, 'entry')} written")


async def _copy(ctx: Ctx, args: argparse.Namespace) -> None:
    # With a keyring, a source written before encryption is read as it is and
    # its copy is sealed: the way to encrypt a store into a new one.
    src = ctx.open(args.source, plaintext=True)
    await src.list_sessions(limit=1)  # a missing source fails before the destination is made
    dst = ctx.open(args.destination, create=True)
    ctx.interrupt_hint = f"copy stopped; {_RESUME}"

    def note(p: CopyProgress) -> None:
        ctx.interrupt_hint = f"copy stopped after {p.done} of {p.total} sessions; {_RESUME}"

    ids = list(args.ids) or None
    if args.json:
        def report(p: CopyProgress) -> None:
            note(p)
            ctx.out.json(p)

        result = await copy_sessions(src, dst, ids=ids, progress=report)
        ctx.out.json(result)
        return
    with _bar(ctx, "copying sessions", True) as update:
        def show(p: CopyProgress) -> None:
            note(p)
            update(p.done, p.total, p.session_id)

        result = await copy_sessions(src, dst, ids=ids, progress=show)
    ctx.out.line(("copied ", "bold"), _summary(result, args))


VERBS = [
    Verb("fork", "copy a session's active path into a new session", _conf_fork, _fork),
    Verb("delete", "delete sessions", _conf_delete, _delete),
    Verb("import", "read sessions from files (what `export` writes, or pi, Claude Code and "
                   "Agents SDK transcripts) into the store",
         _conf_import, _import),
    Verb("copy", "copy sessions between stores (resumable)", _conf_copy, _copy),
]
