"""Which PostgresStore queries stay on one shard if the tables were distributed
by ``session_id`` (Citus-style); checked on the real planner with EXPLAIN.

A query stays on one shard when every scan of ``sessions`` and ``entries`` in
its plan is restricted to one ``session_id`` value by an index condition (or,
for the INSERTs, writes rows whose ``session_id`` is one parameter). The
listing queries read every session by design and are the one exception;
docs/scaling.md lists each query with its verdict.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from threadline.session import PostgresStore, SessionRecord

ONE_SESSION = ("load", "session", "delete_session", "delete_entries", "stored_batch",
               "watch_start", "watch_read", "append", "append1", "append2")
ALL_SESSIONS = ("list_first", "list_after")

PARAMS: dict[str, Any] = {
    "load": ("s",), "session": ("s",), "delete_session": ("s",), "delete_entries": ("s",),
    "stored_batch": ("s", [b"\0a", b"\0b"]), "watch_start": {"sid": "s", "after": b"\0a"},
    "watch_read": ("s", 0), "list_first": (10,),
    "list_after": ("2024-01-01T00:00:00Z", "s", 10),
    "append": (1, "s", 1, [0], [b"\0a"], [None], [None], [b"{}"]),
    "append1": ("s", 0, b"\0a", None, None, b"{}"),
    "append2": ("s", 0, b"\0a", None, None, b"{}", 0, b"\0b", b"\0a", 1, b"{}"),
}


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if (plan.get("Relation Name") in ("sessions", "entries")
                       and "Scan" in plan["Node Type"]) else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _explain(url: str, query: str, params: Any) -> dict[str, Any]:
    with psycopg.connect(url) as conn:  # a transaction, rolled back: EXPLAIN ANALYZE writes
        conn.execute("SET LOCAL enable_seqscan = off")  # the plan of a big table, not a tiny one
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {query}".encode(), params).fetchone()
        conn.rollback()
    assert row is not None
    data = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(data[0]["Plan"])


@pytest.mark.parametrize("name", ONE_SESSION + ALL_SESSIONS)
async def test_queries_are_keyed_by_session_id_except_listing(
    pg_url: str, pg_schema: str, name: str
) -> None:
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        query = store._q[name]
    scans = _scans(_explain(pg_url, query, PARAMS[name]))
    keyed = [s for s in scans
             if "session_id = " in " ".join(s.get(k, "") for k in ("Index Cond", "Recheck Cond"))]
    if name in ONE_SESSION:
        assert scans, f"{name}: no scan of sessions or entries in the plan"
        assert keyed == scans, f"{name}: a scan not limited to one session_id: {scans}"
    else:
        assert scans and not keyed, f"{name}: expected a scan over all sessions: {scans}"
