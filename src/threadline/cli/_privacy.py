"""Privacy verbs: ``erase``, ``keys`` (generate, rotate, encrypt) and ``prune``.

The keyring and the key-encryption key come from the global ``--keyring``
and ``--key-file`` (or the environment); see docs/privacy.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from threadline.cli._command import Ctx, Verb
from threadline.cli._read import add_json
from threadline.errors import ConfigError

if TYPE_CHECKING:
    from threadline.privacy import PruneReport

__all__ = ["VERBS"]


def _confirm(ctx: Ctx, args: argparse.Namespace, question: str, verb: str = "erase") -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError(f"{verb} asks before it {verb}s; pass --yes when stdin is not a "
                          f"terminal")
    ctx.err.line(f"{question} [y/N] ")
    return input().strip().lower() in ("y", "yes")


# -- erase ------------------------------------------------------------------------


def _conf_erase(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--subject", help="destroy this subject's data keys: its content, in "
                                        "every session, fork, copy and backup, reads as erased")
    what.add_argument("--session", help="delete this session from the store")
    p.add_argument("--with-forks", action="store_true",
                   help="with --session: also every session forked from it, at any depth")
    p.add_argument("--yes", action="store_true",
                   help="do not ask (required when stdin is not a terminal)")
    add_json(p)


async def _erase(ctx: Ctx, args: argparse.Namespace) -> int:
    if args.subject is not None:
        return await _erase_subject(ctx, args)
    from threadline.privacy import delete_with_forks

    store = ctx.open()
    ids = [args.session]
    if args.with_forks:
        question = f"delete session {args.session} and every session forked from it"
    else:
        await store.load_session(args.session)
        question = f"delete session {args.session}"
    if not await asyncio.to_thread(_confirm, ctx, args, f"{question} from {ctx.store_url}?"):
        ctx.err.line("nothing deleted")
        return 1
    if args.with_forks:
        ids = await delete_with_forks(store, args.session)
    else:
        await store.delete_session(args.session)
    for sid in ids:
        if args.json:
            ctx.out.json({"deleted": sid})
        else:
            ctx.out.line(f"deleted {sid}")
    if not args.json:
        ctx.notice("deleting removes what the store holds now; its backups, and the database's "
                   "free pages until they are reused, may still hold it (docs/privacy.md)")
    return 0


async def _erase_subject(ctx: Ctx, args: argparse.Namespace) -> int:
    keyring = ctx.keyring()
    if keyring is None:
        raise ConfigError("erase --subject needs the store's keyring: --keyring FOLDER (or "
                          "$THREADLINE_KEYRING), and its key-encryption key")
    key_id = await keyring.key_id(args.subject)
    sessions = await keyring.sessions_of(key_id)
    question = (f"destroy every data key of subject {args.subject!r} ({len(sessions)} "
                f"session(s) in the keyring)? This cannot be undone")
    if not await asyncio.to_thread(_confirm, ctx, args, question):
        ctx.err.line("nothing erased")
        return 1
    erased = await keyring.erase_subject(args.subject)
    if args.json:
        ctx.out.json({"subject": args.subject, "key_id": erased.key_id,
                      "versions": erased.versions, "sessions": sessions})
        return 0
    if not erased.versions:
        ctx.out.line(f"subject {args.subject}: no data key to destroy (never used, or erased "
                     f"before)")
        return 0
    ctx.out.line(f"erased subject {args.subject}: {erased.versions} data key version(s) "
                 f"destroyed; its entries in {len(sessions)} session(s) now read as [erased]")
    ctx.notice("a copy of the keyring taken before now could still open them; keep none "
               "(docs/privacy.md)")
    return 0


# -- keys -------------------------------------------------------------------------


def _conf_keys(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    gen = sub.add_parser("generate", help="write a new key-encryption key to a file (mode 600)")
    gen.add_argument("file", type=Path)
    rotate = sub.add_parser("rotate", help="rewrap every data key under a new key-encryption "
                                           "key (the current one is --key-file)")
    rotate.add_argument("--new-key-file", required=True, type=Path)
    add_json(rotate)
    enc = sub.add_parser("encrypt", help="rewrite sessions stored before encryption, sealed "
                                         "(stop every writer first)")
    enc.add_argument("sessions", nargs="*", help="session ids (default: all)")
    add_json(enc)


async def _keys(ctx: Ctx, args: argparse.Namespace) -> int:
    if args.keys_command == "generate":
        return _generate(ctx, args.file)
    if args.keys_command == "rotate":
        return await _rotate(ctx, args)
    return await _encrypt(ctx, args)


def _generate(ctx: Ctx, path: Path) -> int:
    from threadline.privacy import LocalKeyProvider

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise ConfigError(f"{path} exists; a key file is never overwritten") from exc
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(LocalKeyProvider.generate() + "\n")
        f.flush()
        os.fsync(f.fileno())
    ctx.out.line(f"wrote a new key-encryption key to {path} (readable by you only); keep it "
                 f"apart from the store and the keyring")
    return 0


async def _rotate(ctx: Ctx, args: argparse.Namespace) -> int:
    from threadline.privacy import Keyring, LocalKeyProvider

    old = ctx.key_provider()
    if old is None:
        raise ConfigError("keys rotate needs the current key-encryption key: --key-file "
                          "(or $THREADLINE_KEY_FILE or $THREADLINE_KEY)")
    current = ctx.keyring()
    if current is None:
        raise ConfigError("keys rotate needs the keyring: --keyring FOLDER (or "
                          "$THREADLINE_KEYRING)")
    new = LocalKeyProvider.from_file(args.new_key_file)
    done = await Keyring(current.path, new, previous=[old], create=False).rewrap()
    if args.json:
        ctx.out.json({"files": done.files, "rewrapped": done.versions,
                      "unchanged": done.unchanged, "key_id": new.key_id})
    else:
        ctx.out.line(f"rewrapped {done.versions} key(s) in {done.files} file(s) under "
                     f"{new.key_id} ({done.unchanged} were already); no store was touched. "
                     f"Use --key-file {args.new_key_file} from now on")
    return 0


async def _encrypt(ctx: Ctx, args: argparse.Namespace) -> int:
    from threadline.privacy import EncryptedStore, migrate_session
    from threadline.privacy._migrate import staged_for

    store = ctx.open(plaintext=True)
    if not isinstance(store, EncryptedStore):
        raise ConfigError("keys encrypt needs the keyring to seal with: --keyring FOLDER and "
                          "--key-file")
    ids = list(args.sessions)
    if not ids:
        cursor = None
        while True:
            page = await store.list_sessions(limit=500, cursor=cursor)
            ids += [r.id for r in page.sessions]
            cursor = page.next_cursor
            if cursor is None:
                break
        # A run killed part way left a staging session, maybe in place of its
        # session: finish that session instead.
        staged = [await staged_for(store.inner, sid) for sid in ids]
        ids = list(dict.fromkeys(s or sid for s, sid in zip(staged, ids, strict=True)))
    for sid in ids:
        count = await migrate_session(store, sid)
        if args.json:
            ctx.out.json({"session_id": sid, "rewritten": bool(count), "entries": count})
        elif count:
            ctx.out.line(f"sealed {sid}: rewrote its {count} entries")
        else:
            ctx.out.line(f"{sid}: sealed already")
    return 0


# -- prune ------------------------------------------------------------------------


def _conf_prune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True,
                   help="the retention rules, comma-separated: idle=D (delete sessions idle "
                        "longer), branches=D (drop side branches older), fold (drop what the "
                        "latest compaction folded), fork-parents=keep|release; D is 90d, 12h, "
                        "2w, ...")
    p.add_argument("--dry-run", action="store_true",
                   help="show what the policy would remove, and remove nothing")
    p.add_argument("--batch", type=int, default=1000, metavar="N",
                   help="at most N entries removed per transaction (SQL stores; default 1000)")
    p.add_argument("--yes", action="store_true",
                   help="do not ask (required when stdin is not a terminal)")
    add_json(p)


def _show_report(ctx: Ctx, report: PruneReport, *, would: bool) -> None:
    if ctx.args.json:
        ctx.out.json({"dry_run": report.dry_run, "policy": report.policy,
                      "sessions_seen": report.sessions_seen,
                      "sessions_deleted": report.sessions_deleted,
                      "fork_parents_kept": report.fork_parents_kept,
                      "branch_entries": report.branch_entries,
                      "folded_entries": report.folded_entries,
                      "entries_removed": report.entries_removed, "problems": report.problems})
        return
    delete, drop = ("would delete", "would drop") if would else ("deleted", "dropped")
    for sid in report.sessions_deleted:
        ctx.out.line(f"{delete} session {sid} (idle)")
    for sid, n in sorted(report.branch_entries.items()):
        ctx.out.line(f"{drop} {n} entries of old side branches from {sid}")
    for sid, n in sorted(report.folded_entries.items()):
        ctx.out.line(f"{drop} {n} entries of {sid} that its latest compaction folded")
    for sid in report.fork_parents_kept:
        ctx.out.line(f"keep idle session {sid}: a session was forked from it")
    for problem in report.problems:
        ctx.err.line(f"cannot prune {problem}")
    done = "would remove" if would else "removed"
    ctx.out.line(f"{report.sessions_seen} session(s) read: {done} {len(report.sessions_deleted)} "
                 f"session(s) and {report.entries_removed} entries (policy {report.policy})")


async def _prune(ctx: Ctx, args: argparse.Namespace) -> int:
    from threadline.privacy import RetentionPolicy, prune

    policy = RetentionPolicy.parse(args.policy)
    if args.batch < 1:
        raise ConfigError(f"--batch is at least 1, got {args.batch}")
    store = ctx.open()
    preview = await prune(store, policy, dry_run=True, batch=args.batch)
    if args.dry_run or not (preview.sessions_deleted or preview.entries_removed):
        _show_report(ctx, preview, would=True)
        return 1 if preview.problems else 0
    if not args.json:
        _show_report(ctx, preview, would=True)
    question = f"remove this from {ctx.store_url}? It cannot be undone"
    if not await asyncio.to_thread(_confirm, ctx, args, question, "prune"):
        ctx.err.line("nothing removed")
        return 1
    report = await prune(store, policy, batch=args.batch)
    _show_report(ctx, report, would=False)
    if not args.json:
        ctx.notice("pruning removes what the store holds now; its backups, and the database's "
                   "free pages until they are reused, may still hold it (docs/privacy.md)")
    return 1 if report.problems else 0


VERBS = [
    Verb("erase", "erase a subject by destroying its keys, or delete a session (--with-forks)",
         _conf_erase, _erase),
    Verb("keys", "key-encryption keys and sealing: generate, rotate, encrypt", _conf_keys,
         _keys),
    Verb("prune", "apply a retention policy: expire idle sessions, drop old branches, fold "
                  "compacted history (--dry-run shows what would go)", _conf_prune, _prune),
]
