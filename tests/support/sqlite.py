"""Reaching into a SQLite store's file from outside it: a raw connection and raw rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from threadline.session import new_id
from threadline.stores._rows import id_key


def insert_raw_row(conn: sqlite3.Connection, session_id: str, data: bytes,
                   entry_id: str | None = None) -> None:
    """Store ``data`` as a whole line (row kind 0), as if another program wrote it."""
    conn.execute("INSERT INTO entries (session, kind, id, data) SELECT key, 0, ?, ? "
                 "FROM sessions WHERE id = ?", (id_key(entry_id or new_id()), data, session_id))


def raw_connection(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)
