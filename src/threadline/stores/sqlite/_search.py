"""The SQLite store's full-text index: an FTS5 table kept in the append's transaction.

``search`` holds one row per entry that has indexed text
(``stores/_search.py``), its rowid the entry's ``seq``. The append inserts
the rows in the same write transaction as the entries, and the delete
removes them in the delete's, so no reader ever sees an entry without its
row or a row without its entry. The tokenizer is ``unicode61`` keeping
diacritics (as PostgreSQL's ``simple`` configuration does).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from threadline.errors import CorruptLog
from threadline.stores._contract import SearchHit
from threadline.stores._rows import decode_compact, id_text
from threadline.stores._search import Query, indexed_text, path_keys

__all__ = ["create_index", "forget", "index", "scope", "search"]

_CREATE = ("CREATE VIRTUAL TABLE search USING fts5("
           "body, tokenize = 'unicode61 remove_diacritics 0')")


def create_index(conn: sqlite3.Connection) -> None:
    """Version 4: the ``search`` table, filled from the entries already stored.

    Runs in the migration's write transaction. A row that does not decode is
    left out of the index (a load reports it).
    """
    conn.execute(_CREATE)
    rows = conn.execute("SELECT seq, kind, id, parent, ts, data FROM entries ORDER BY seq")
    while batch := rows.fetchmany(1000):
        out: list[tuple[int, str]] = []
        for row in batch:
            try:
                entries = decode_compact([row], "", "migration")
            except CorruptLog:
                continue
            text = indexed_text(entries[0]) if entries else None
            if text is not None:
                out.append((row[0], text))
        conn.executemany("INSERT INTO search (rowid, body) VALUES (?, ?)", out)


def index(conn: sqlite3.Connection, texts: Sequence[str | None]) -> None:
    """Index the entries just inserted as the last ``len(texts)`` rows (same transaction).

    Inside the write transaction the new rows took consecutive rowids ending
    at ``last_insert_rowid()``.
    """
    if all(t is None for t in texts):
        return
    last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    first = last - len(texts) + 1
    conn.executemany("INSERT INTO search (rowid, body) VALUES (?, ?)",
                     [(first + i, t) for i, t in enumerate(texts) if t is not None])


def forget(conn: sqlite3.Connection, session_key: int) -> None:
    """Remove the index rows of the session ``session_key`` (before its entries go)."""
    conn.execute("DELETE FROM search WHERE rowid IN "
                 "(SELECT seq FROM entries WHERE session = ?)", (session_key,))


def search(conn: sqlite3.Connection, q: Query) -> list[SearchHit]:
    """The best ``q.limit`` hits for ``q.terms``, each term quoted so FTS5 syntax never applies.

    One read transaction, so the hits and the paths they are checked against
    agree. With ``active_path`` hits off their session's active path are skipped.
    """
    conn.execute("BEGIN")
    try:
        return _search(conn, q)
    finally:
        conn.execute("COMMIT")


def _search(conn: sqlite3.Connection, q: Query) -> list[SearchHit]:
    match = " ".join('"' + t.replace('"', '""') + '"' for t in q.terms)
    where, args = scope(q.owner, q.tenant)
    active_path, limit = q.active_path, q.limit
    rows = conn.execute(
        "SELECT s.id, e.id, snippet(search, 0, '', '', '…', 16), -bm25(search), s.key "
        "FROM search JOIN entries e ON e.seq = search.rowid "
        "JOIN sessions s ON s.key = e.session "
        f"WHERE search MATCH ? {where} ORDER BY bm25(search), e.seq"
        + ("" if active_path else " LIMIT ?"),
        (match, *args) if active_path else (match, *args, limit))
    hits: list[SearchHit] = []
    paths: dict[int, set[bytes]] = {}
    while len(hits) < limit and (batch := rows.fetchmany(max(limit, 100))):
        for sid, stored_key, snip, rank, skey in batch:
            key = bytes(stored_key)
            if active_path:
                path = paths.get(skey)
                if path is None:
                    path = paths[skey] = _active_path(conn, skey)
                if key not in path:
                    continue
            hits.append(SearchHit(session_id=sid, entry_id=id_text(key), snippet=snip,
                                  rank=float(rank)))
            if len(hits) == limit:
                break
    return hits


def scope(owner: str | None, tenant: str | None) -> tuple[str, list[Any]]:
    """The condition on the session row ``s`` for ``owner`` and ``tenant``, and its arguments."""
    where, args = "", []
    for column, value in (("owner", owner), ("tenant", tenant)):
        if value is not None:
            where += f" AND s.{column} = ?"
            args.append(value)
    return where, args


def _active_path(conn: sqlite3.Connection, session_key: int) -> set[bytes]:
    """The id keys on the path from the session's last entry to its root."""
    parents = {bytes(i): None if p is None else bytes(p) for i, p in conn.execute(
        "SELECT id, parent FROM entries WHERE session = ? ORDER BY seq", (session_key,))}
    return path_keys(parents)
