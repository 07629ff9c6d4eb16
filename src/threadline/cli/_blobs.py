"""Verbs for attachments: ``blob get|list|gc`` and ``migrate-blobs``.

``blob get`` writes one blob's bytes (checked against their hash) to a file
or to a redirected stdout, never to a terminal. ``migrate-blobs`` cannot
move images out of a log in place: logs are append-only and nothing in them
is rewritten. It copies sessions into another store instead, each inline
image stored there as a blob and its entry holding the reference, with the
entry's id, parent and timestamp unchanged; the source stays as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from threadline.ai._messages import BlobPart
from threadline.cli._command import Ctx, Verb, whole_number
from threadline.cli._read import add_json
from threadline.cli._render import count, size_text
from threadline.errors import BlobNotFound, ConfigError, CorruptLog
from threadline.integrations.importers._blobs import move_inline
from threadline.stores import copy_sessions
from threadline.stores._blobs import (
    SessionBlobs,
    blob_parts,
    blob_store,
    collect_garbage,
    open_blob,
)
from threadline.stores._contract import CatalogStore
from threadline.stores._memory import MemoryStore

__all__ = ["VERBS"]


def _conf_blob(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["get", "list", "gc"],
                   help="get: write one blob's bytes; list: the stored blobs; gc: delete "
                        "the blobs no entry references")
    p.add_argument("hash", nargs="?", help="get: the SHA-256 (or a unique prefix, as "
                                           "`show` prints it)")
    p.add_argument("--session", metavar="SESSION",
                   help="get: the session referencing the blob (needed for an encrypted store)")
    p.add_argument("-o", "--output", metavar="FILE", help="get: write to FILE, not stdout")
    p.add_argument("--grace", type=whole_number(0), default=3600, metavar="SECONDS",
                   help="gc: spare blobs touched this recently (default 3600); an append "
                        "must follow its attach within this time")
    add_json(p)


async def _blob(ctx: Ctx, args: argparse.Namespace) -> None:
    store = ctx.open()
    if args.action == "list":
        infos = sorted(await blob_store(store, "blob list").list_blobs(), key=lambda i: i.key)
        if args.json:
            for i in infos:
                ctx.out.json({"key": i.key, "size": i.size, "touched_at": i.touched_at})
            return
        for i in infos:
            ctx.out.line(i.key, (f"  {size_text(i.size):>10}  ", "cyan"),
                         (i.touched_at.isoformat(timespec="seconds"), "dim"))
        ctx.out.line((f"{count(len(infos), 'blob')}, "
                      f"{size_text(sum(i.size for i in infos))}", "dim"))
        return
    if args.action == "gc":
        report = await collect_garbage(store, grace=timedelta(seconds=args.grace))
        if args.json:
            ctx.out.json(report)
        else:
            ctx.out.line(f"read {count(report.sessions, 'session')}: kept "
                         f"{report.referenced} referenced and {report.young} recent, deleted "
                         f"{count(len(report.deleted), 'blob')} ({size_text(report.freed)})")
        return
    if not args.hash:
        raise ConfigError("blob get needs the blob's hash (`threadline show` prints it)")
    data = await _read(ctx, store, args.hash.strip().lower(), args.session)
    if args.output:
        await asyncio.to_thread(Path(args.output).write_bytes, data)
    elif ctx.out.is_terminal:
        raise ConfigError("blob get writes bytes: redirect them (> FILE) or give -o FILE")
    else:
        ctx.out.raw(data)


async def _read(ctx: Ctx, store: CatalogStore, prefix: str, session: str | None) -> bytes:
    if session is not None:
        parts = {p.sha256: p for p in blob_parts(await ctx.load(store, session))
                 if p.sha256.startswith(prefix)}
        part = _one(parts, prefix, f"session {session!r}")
        return await open_blob(store, session, part)
    if isinstance(store, SessionBlobs):
        raise ConfigError("this store keeps blobs per subject (encrypted): give --session "
                          "SESSION, a session that references the blob")
    blobs = blob_store(store, "blob get")
    key = prefix
    if len(prefix) != 64:
        keys = {i.key: i.key for i in await blobs.list_blobs() if i.key.startswith(prefix)}
        key = _one(keys, prefix, "the store")
    data = await blobs.get_blob(key)
    if hashlib.sha256(data).hexdigest() != key:
        raise CorruptLog(f"the bytes stored under blob {key} do not have that SHA-256",
                         path=f"blob {key}")
    return data


_T = TypeVar("_T", str, BlobPart)


def _one(found: dict[str, _T], prefix: str, where: str) -> _T:
    if not prefix or len(found) != 1:
        if not found:
            raise BlobNotFound(prefix, where)
        raise ConfigError(f"blob {prefix!r} is ambiguous in {where}: it matches "
                          f"{len(found)} blobs; give more characters")
    return next(iter(found.values()))


# -- migrate-blobs ------------------------------------------------------------------


def _conf_migrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="*", help="session ids (default: all)")
    p.add_argument("--to", required=True, metavar="STORE",
                   help="the store to copy into (a log is append-only, so images cannot "
                        "move out of it in place); entry ids stay the same")
    add_json(p)


async def _migrate(ctx: Ctx, args: argparse.Namespace) -> None:
    src = ctx.open(plaintext=True)
    ids = list(args.sessions)
    if not ids:
        cursor: str | None = None
        while True:
            page = await src.list_sessions(limit=500, cursor=cursor)
            ids += [r.id for r in page.sessions]
            if (cursor := page.next_cursor) is None:
                break
    dst = ctx.open(args.to, create=True)
    ctx.interrupt_hint = "migration stopped; run the same command again to resume"
    moved_total = 0
    for sid in ids:
        record = await src.load_session(sid)
        staging = MemoryStore()
        entries, moved = await move_inline(staging, sid, await ctx.load(src, sid))
        await staging.create_session(record)
        await staging.append_entries(sid, entries)
        # copy_sessions brings the blobs and the resume-or-refuse rule; one
        # batch, so an interrupted run never leaves a prefix that passes for whole.
        result = await copy_sessions(staging, dst, ids=[sid], batch_size=max(len(entries), 1))
        status = "copied" if result.copied else "resumed" if result.resumed else "skipped"
        moved_total += moved
        if args.json:
            ctx.out.json({"session": sid, "status": status, "entries": len(entries),
                          "images_moved": moved})
        else:
            ctx.out.line(f"{sid}: {status}, {count(moved, 'image')} moved to blobs")
    if not args.json:
        ctx.out.line(("migrated ", "bold"), f"{count(len(ids), 'session')} to {args.to}; "
                     f"{count(moved_total, 'image')} moved out of the log")


VERBS = [
    Verb("blob", "attachments: write one out (get), list them, or delete unreferenced ones (gc)",
         _conf_blob, _blob),
    Verb("migrate-blobs", "copy sessions into another store with their inline images moved "
                          "to blobs (entry ids unchanged)", _conf_migrate, _migrate),
]
