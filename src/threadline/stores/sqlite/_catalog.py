"""The SQLite store's catalog: metadata and last activity kept on each session row.

``sessions`` carries ``last_activity`` (microseconds), ``title``, ``owner``,
``tenant`` and ``labels`` (a JSON object), and ``session_labels`` holds one
row per label for filtering. Every append updates them in its own
transaction (``catalogue``), so a listing agrees with the logs at every
commit. Listing reads one index range: newest first by activity or creation,
within one owner or tenant when asked.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET

from threadline.session._entries import SessionRecord
from threadline.session._metadata import SessionMetadata
from threadline.stores._contract import ListOrder, SessionInfo
from threadline.stores._listing import Filters, Touch, applied_labels
from threadline.stores._rules import from_micros, to_micros

__all__ = ["MIGRATION", "catalogue", "forget", "info", "list_query"]

MIGRATION = """
    ALTER TABLE sessions ADD COLUMN last_activity INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN title TEXT;
    ALTER TABLE sessions ADD COLUMN owner TEXT;
    ALTER TABLE sessions ADD COLUMN tenant TEXT;
    ALTER TABLE sessions ADD COLUMN labels TEXT;
    UPDATE sessions SET last_activity = max(created_at, coalesce(
        (SELECT max(ts) FROM entries WHERE session = sessions.key), created_at));
    CREATE TABLE session_labels (
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        session INTEGER NOT NULL,  -- sessions.key
        PRIMARY KEY (name, value, session)
    ) WITHOUT ROWID;
    CREATE INDEX session_labels_of ON session_labels (session);
    CREATE INDEX sessions_activity ON sessions (last_activity DESC, id DESC);
    CREATE INDEX sessions_owner_activity ON sessions (owner, last_activity DESC, id DESC);
    CREATE INDEX sessions_owner_created ON sessions (owner, created_at DESC, id DESC);
    CREATE INDEX sessions_tenant_activity ON sessions (tenant, last_activity DESC, id DESC)
"""
"""Schema version 3. Metadata entries did not exist before it, so only the
activity needs filling in."""

COLUMNS = "id, parent_id, created_at, last_activity, title, owner, tenant, labels"

_labels = msgspec.json.Decoder(dict[str, str])


def info(row: Sequence[Any]) -> SessionInfo:
    """A ``SessionInfo`` from a row of ``COLUMNS``."""
    record = SessionRecord(id=row[0], parent_id=row[1], created_at=from_micros(row[2]))
    meta = SessionMetadata(title=row[4], owner=row[5], tenant=row[6],
                           labels={} if row[7] is None else _labels.decode(row[7]))
    return SessionInfo(record=record, metadata=meta,
                       last_activity=from_micros(max(row[2], row[3])))


def catalogue(conn: sqlite3.Connection, sid: str, touch: Touch) -> None:
    """Fold one append into the session's row (inside the append's transaction)."""
    newest, change = touch
    if newest is not None:
        conn.execute("UPDATE sessions SET last_activity = max(last_activity, ?) WHERE id = ?",
                     (newest, sid))
    if change is None:
        return
    sets: list[str] = []
    args: list[Any] = []
    for name in ("title", "owner", "tenant"):
        value = getattr(change, name)
        if value is not UNSET:
            sets.append(f"{name} = ?")
            args.append(value)
    if change.labels:
        row = conn.execute("SELECT key, labels FROM sessions WHERE id = ?", (sid,)).fetchone()
        if row is None:
            return
        key, old = row
        labels = applied_labels({} if old is None else _labels.decode(old), change)
        sets.append("labels = ?")
        args.append(msgspec.json.encode(labels).decode())
        for name in change.labels:
            conn.execute("DELETE FROM session_labels WHERE session = ? AND name = ?",
                         (key, name))
            if name in labels:
                conn.execute("INSERT INTO session_labels (name, value, session) "
                             "VALUES (?, ?, ?)", (name, labels[name], key))
    if sets:
        conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*args, sid))


def forget(conn: sqlite3.Connection, key: int) -> None:
    """Drop a deleted session's label rows."""
    conn.execute("DELETE FROM session_labels WHERE session = ?", (key,))


def list_query(limit: int, after: tuple[datetime, str] | None, filters: Filters,
               order: ListOrder) -> tuple[str, list[Any]]:
    """The listing's statement and parameters: up to ``limit + 1`` rows, newest first."""
    col = "s.last_activity" if order == "activity" else "s.created_at"
    where: list[str] = []
    args: list[Any] = []
    if filters.owner is not None:
        where.append("s.owner = ?")
        args.append(filters.owner)
    if filters.tenant is not None:
        where.append("s.tenant = ?")
        args.append(filters.tenant)
    for name, value in filters.labels.items():
        where.append("EXISTS (SELECT 1 FROM session_labels l WHERE l.name = ? "
                     "AND l.value = ? AND l.session = s.key)")
        args += (name, value)
    if after is not None:
        where.append(f"({col}, s.id) < (?, ?)")
        args += (to_micros(after[0]), after[1])
    sql = (f"SELECT {', '.join('s.' + c for c in COLUMNS.split(', '))} FROM sessions s"
           + (" WHERE " + " AND ".join(where) if where else "")
           + f" ORDER BY {col} DESC, s.id DESC LIMIT ?")
    return sql, [*args, limit + 1]
