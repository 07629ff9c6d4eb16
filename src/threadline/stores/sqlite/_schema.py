"""The SQLite store's schema: an append-only list of migrations and how they run.

A database records the versions it has in ``schema_migrations``. Every
migration runs in one write transaction (``BEGIN IMMEDIATE``), so a second
process opening the same old file waits, then finds the versions recorded
and does nothing. A released version is never edited; a change is a new
version (SQL, or a function run in the migration's transaction).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from threadline.errors import CorruptLog
from threadline.session._codec import decode_entry
from threadline.stores._rows import compact, id_key
from threadline.stores.sqlite._catalog import MIGRATION as CATALOG
from threadline.stores.sqlite._search import create_index

__all__ = ["MIGRATIONS", "migrate"]



def _compact_rows(conn: sqlite3.Connection) -> None:
    """Version 2: version 1's rows moved into compact rows (``stores/_rows.py``).

    Runs inside the migration's write transaction, so a second process opening
    the same old file waits, then finds version 2 recorded and does nothing.
    """
    for stmt in _V2.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    keys = dict(conn.execute("SELECT id, key FROM sessions_v2"))
    # Entries whose session is gone (none should be) are not carried over.
    old = conn.execute("SELECT e.session_id, e.seq, e.id, e.parent_id, e.data FROM entries e "
                       "JOIN sessions s ON s.id = e.session_id ORDER BY e.session_id, e.seq")
    while batch := old.fetchmany(1000):
        conn.executemany("INSERT INTO entries_v2 (session, kind, id, parent, ts, data) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         [(keys[sid], *_old_row(entry_id, parent, data))
                          for sid, _, entry_id, parent, data in batch])
    for stmt in _V2_SWAP.split(";"):
        if stmt.strip():
            conn.execute(stmt)


def _old_row(entry_id: str, parent_id: str | None, data: Any) -> tuple[Any, ...]:
    """(kind, id, parent, ts, data) for a version 1 row; one that does not decode stays whole."""
    try:
        return compact(decode_entry(data), bytes(data))[:5]
    except CorruptLog:  # kept as it was, to be reported when loaded
        return (0, id_key(entry_id), None if parent_id is None else id_key(parent_id), None,
                data)


_V2 = """
    CREATE TABLE sessions_v2 (
        key INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after a delete
        id TEXT NOT NULL UNIQUE,
        parent_id TEXT,
        created_at INTEGER NOT NULL  -- microseconds since the Unix epoch, UTC
    );
    INSERT INTO sessions_v2 (id, parent_id, created_at)
        SELECT id, parent_id, created_at FROM sessions ORDER BY created_at, id;
    CREATE TABLE entries_v2 (
        -- The append order, across sessions: a rowid table appended at its
        -- end fills its pages (a WITHOUT ROWID table's leaves are ~80% full).
        seq INTEGER PRIMARY KEY,
        session INTEGER NOT NULL,    -- sessions.key
        kind INTEGER NOT NULL,       -- stores/_rows.py KINDS, 0: data is the whole line
        id BLOB NOT NULL,            -- stores/_rows.py id_key
        parent BLOB,
        ts INTEGER,                  -- microseconds since the Unix epoch (NULL when kind 0)
        data BLOB NOT NULL
    );
    CREATE UNIQUE INDEX entries_id ON entries_v2 (session, id);
    CREATE INDEX entries_order ON entries_v2 (session)  -- (session, seq): seq is the rowid
"""

_V2_SWAP = """
    DROP TABLE entries;
    DROP TABLE sessions;
    ALTER TABLE sessions_v2 RENAME TO sessions;
    ALTER TABLE entries_v2 RENAME TO entries;
    CREATE INDEX sessions_newest ON sessions (created_at DESC, id DESC)
"""

MIGRATIONS: tuple[tuple[int, str | Callable[[sqlite3.Connection], None]], ...] = (
    (
        1,
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            parent_id TEXT,
            created_at INTEGER NOT NULL  -- microseconds since the Unix epoch, UTC
        ) WITHOUT ROWID;
        CREATE INDEX sessions_newest ON sessions (created_at DESC, id DESC);
        CREATE TABLE entries (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,        -- 1, 2, ... per session: the append order
            id TEXT NOT NULL,
            parent_id TEXT,
            type TEXT NOT NULL,
            data BLOB NOT NULL,          -- the codec's exact bytes
            PRIMARY KEY (session_id, seq),
            UNIQUE (session_id, id)
        ) WITHOUT ROWID;
        """,
    ),
    (2, _compact_rows),
    (3, CATALOG),  # stores/sqlite/_catalog.py: metadata and last activity (S62)
    (4, create_index),  # stores/sqlite/_search.py: the FTS5 index (S64)
    (
        5,
        # Blobs beside the log (S57): a rowid table, since a row of megabytes
        # belongs in overflow pages, not in the leaves of a WITHOUT ROWID tree.
        """
        CREATE TABLE blobs (
            key TEXT NOT NULL UNIQUE,    -- the blob-key rule: [0-9a-z]{1,128}
            size INTEGER NOT NULL,
            touched_at INTEGER NOT NULL, -- microseconds since the Unix epoch, UTC
            data BLOB NOT NULL
        );
        """,
    ),
)


def migrate(conn: sqlite3.Connection, retry: Callable[[Callable[[], Any]], Any],
            write: Callable[[sqlite3.Connection, Callable[[], None]], None]) -> None:
    """Bring the database up to the last version (``retry`` waits out other writers).

    A current database costs one read.
    """
    def current() -> int:
        try:
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            return 0
        return int(row[0] or 0)

    if retry(current) >= MIGRATIONS[-1][0]:
        return

    def apply() -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                     "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        for version, script in MIGRATIONS:
            if version > current():
                if callable(script):
                    script(conn)
                else:
                    for stmt in script.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?)",
                             (version, datetime.now(UTC).isoformat()))

    write(conn, apply)
