"""Retention: ``prune`` over 10,000 sessions against a bare delete of the same files or rows.

Two policies, each on stores filled alike (sessions of 10 realistic
entries, created 60 days ago):

- idle expiry (``idle=30d``): every session goes. The floor deletes the same
  sessions with nothing around it: the file store's files unlinked in a
  loop (one folder sync at the end), SQLite's and PostgreSQL's rows deleted
  in one transaction;
- old side branches (``branches=30d``): each session also holds an old
  branch of 4 entries. The floor deletes the same rows by id in one
  transaction; a file loses lines only by a rewrite, so the file store's
  floor reads each file and renames a copy over it, with no lock, parsing
  or sync.

What the ratio pays for: listing every session, reading each one under its
lock to decide again (so writers can go on appending), and one durable step
per session (a rename and folder sync, or a commit) instead of one for all.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench._harness import Run, ms
from bench._targets import (
    FileStore,
    MessageEntry,
    PostgresStore,
    RetentionPolicy,
    SessionRecord,
    SQLiteStore,
    Store,
    prune,
)
from bench._workloads import realistic

NEEDS = ()
MINUTES = 4

OLD = datetime.now(UTC) - timedelta(days=60)
IDLE = RetentionPolicy(idle_sessions=timedelta(days=30))
BRANCHES = RetentionPolicy(side_branches=timedelta(days=30))


def _sessions(n: int, branch: bool) -> list[tuple[str, list[list[MessageEntry]]]]:
    """Per session: its id and the batches to append (the path, then an old branch)."""
    chain = realistic(10, seed=5)
    out = []
    for k in range(n):
        path: list[MessageEntry] = []
        parent: str | None = None
        for e in chain:
            entry = MessageEntry(parent_id=parent, message=e.message, timestamp=OLD)
            path.append(entry)
            parent = entry.id
        batches = [path[:-1]]
        if branch:
            side: list[MessageEntry] = []
            parent = path[4].id
            for e in chain[:4]:
                entry = MessageEntry(parent_id=parent, message=e.message, timestamp=OLD)
                side.append(entry)
                parent = entry.id
            batches.append(side)
        # The last appended entry is new: the session is live, its branch old.
        last = path[-1]
        batches.append([MessageEntry(parent_id=last.parent_id, message=last.message)
                        if branch else last])
        out.append((f"session-{k:05d}", batches))
    return out


async def _fill(store: Store, sessions: list[tuple[str, list[list[MessageEntry]]]]) -> None:
    for sid, batches in sessions:
        await store.create_session(SessionRecord(id=sid, created_at=OLD))
        for batch in batches:
            await store.append_entries(sid, batch)
    close = getattr(store, "close", None)
    if close is not None:
        await close()


def _timed(work: Any) -> float:
    t0 = time.perf_counter()
    asyncio.run(work)
    return time.perf_counter() - t0


async def _prune(store: Store, policy: RetentionPolicy, expect: int, *, sessions: bool) -> None:
    report = await prune(store, policy)
    got = len(report.sessions_deleted) if sessions else report.entries_removed
    assert got == expect, (got, expect)
    await store.close()  # type: ignore[attr-defined]


def file_store(run: Run, n: int) -> None:
    sessions = _sessions(n, branch=False)
    base = run.tmp / "file-base"
    asyncio.run(_fill(FileStore(base, durability="flush"), sessions))
    shutil.copytree(base, run.tmp / "file-prune")
    shutil.copytree(base, run.tmp / "file-bare")
    took = _timed(_prune(FileStore(run.tmp / "file-prune"), IDLE, n, sessions=True))

    def bare() -> None:
        root = run.tmp / "file-bare"
        for p in root.glob("*.jsonl"):
            os.unlink(p)
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    t0 = time.perf_counter()
    bare()
    floor = time.perf_counter() - t0
    run.row(f"file store: prune idle=30d, {n:,} sessions deleted", took, "s",
            versus="unlinking the same files, one folder sync", versus_value=floor,
            detail=f"{ms(took) / n:.3f} ms a session")
    branchy = _sessions(n, branch=True)
    root = run.tmp / "file-branches"
    asyncio.run(_fill(FileStore(root, durability="flush"), branchy))
    shutil.copytree(root, run.tmp / "file-branches-bare")
    took = _timed(_prune(FileStore(root), BRANCHES, 4 * n, sessions=False))
    t0 = time.perf_counter()
    for p in (run.tmp / "file-branches-bare").glob("*.jsonl"):
        tmp = p.with_suffix(".tmp")
        tmp.write_bytes(p.read_bytes())
        os.replace(tmp, p)
    floor = time.perf_counter() - t0
    run.row(f"file store: prune branches=30d, {n:,} sessions rewritten", took, "s",
            versus="reading each file and renaming a copy over it, no lock, parse or sync",
            versus_value=floor,
            detail=f"{ms(took) / n:.3f} ms a session: read under the lock, decide, write, "
                   f"fsync, rename, folder sync (a file loses lines only by a rewrite)")


def sqlite_store(run: Run, n: int) -> None:
    for policy, branch in ((IDLE, False), (BRANCHES, True)):
        sessions = _sessions(n, branch)
        label = "idle" if not branch else "branches"
        base = run.tmp / f"sqlite-{label}.db"
        asyncio.run(_fill(SQLiteStore(base, synchronous="NORMAL"), sessions))
        with sqlite3.connect(base) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copy(base, run.tmp / f"sqlite-{label}-bare.db")
        expect = n if not branch else 4 * n
        took = _timed(_prune(SQLiteStore(base), policy, expect, sessions=not branch))
        conn = sqlite3.connect(run.tmp / f"sqlite-{label}-bare.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if branch:
            ids = [_key(e.id) for _, batches in sessions for e in batches[1]]
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        if branch:
            conn.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in ids])
        else:
            for sid, _ in sessions:
                (key,) = conn.execute("DELETE FROM sessions WHERE id = ? RETURNING key",
                                      (sid,)).fetchone()
                conn.execute("DELETE FROM entries WHERE session = ?", (key,))
        conn.execute("COMMIT")
        floor = time.perf_counter() - t0
        conn.close()
        what = f"{n:,} sessions deleted" if not branch else f"{4 * n:,} branch entries dropped"
        run.row(f"SQLite: prune {policy}, {what}", took, "s",
                versus="the same rows deleted in one transaction", versus_value=floor,
                detail=f"{ms(took) / n:.3f} ms a session")


def postgres_store(run: Run, n: int) -> None:
    import psycopg

    for policy, branch in ((IDLE, False), (BRANCHES, True)):
        sessions = _sessions(n, branch)
        label = "idle" if not branch else "branches"
        schemas = (f"bench_retention_{label}", f"bench_retention_{label}_bare")
        with psycopg.connect(run.pg_url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for schema in schemas:
            asyncio.run(_fill(PostgresStore(run.pg_url, schema=schema), sessions))
        expect = n if not branch else 4 * n
        took = _timed(_prune(PostgresStore(run.pg_url, schema=schemas[0]), policy, expect,
                             sessions=not branch))
        with psycopg.connect(run.pg_url) as conn:
            t0 = time.perf_counter()
            with conn.transaction():
                s = schemas[1]
                if branch:
                    ids = [_key(e.id) for _, batches in sessions for e in batches[1]]
                    conn.execute(f'DELETE FROM "{s}".entries WHERE entry_id = ANY(%s)', (ids,))
                else:
                    sids = [sid for sid, _ in sessions]
                    conn.execute(f'DELETE FROM "{s}".sessions WHERE session_id = ANY(%s)',
                                 (sids,))
                    conn.execute(f'DELETE FROM "{s}".entries WHERE session_id = ANY(%s)',
                                 (sids,))
            floor = time.perf_counter() - t0
        with psycopg.connect(run.pg_url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        what = f"{n:,} sessions deleted" if not branch else f"{4 * n:,} branch entries dropped"
        run.row(f"PostgreSQL: prune {policy}, {what}", took, "s",
                versus="the same rows deleted in one transaction", versus_value=floor,
                detail=f"{ms(took) / n:.3f} ms a session")


def _key(entry_id: str) -> bytes:
    # How the SQL stores key an entry id (a canonical UUID as its 16 bytes).
    return bytes.fromhex(entry_id.replace("-", ""))


def main(run: Run) -> None:
    n = run.pick(10_000, 200)
    run.say("file store")
    file_store(run, n)
    run.say("SQLite")
    sqlite_store(run, n)
    if run.postgres():
        run.say("PostgreSQL")
        postgres_store(run, n)


