"""Which PostgresStore queries stay on one shard if the tables were distributed
by ``session_id`` (Citus-style), and that every query stays on one shard when
they are distributed by ``tenant``; checked on the real planner with EXPLAIN.

A query stays on one shard when every scan of ``sessions`` and ``entries`` in
its plan is restricted to one ``session_id`` value by an index condition (or,
for the INSERTs, writes rows whose ``session_id`` is one parameter). The
listing queries read every session by design and are the one exception;
docs/scaling.md lists each query with its verdict.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from threadline.session import SessionRecord
from threadline.stores import PostgresStore
from threadline.stores._listing import Filters
from threadline.stores.postgres._catalog import list_query

ONE_SESSION = ("load", "session", "delete_session", "delete_entries", "stored_batch",
               "watch_start", "watch_read", "append", "append1", "append2")
ALL_SESSIONS = ("list_first", "list_after")

PARAMS: dict[str, Any] = {
    "load": ("", "s"), "session": ("", "s"), "delete_session": ("", "s"),
    "delete_entries": ("", "s"), "stored_batch": ("", "s", [b"\0a", b"\0b"]),
    "watch_start": {"t": "", "sid": "s", "after": b"\0a"},
    "watch_read": ("", "s", 0),
    "append": (1, None, "", "s", 1, [0], [b"\0a"], [None], [None], [b"{}"]),
    "append1": (None, "", "s", 0, b"\0a", None, None, b"{}"),
    "append2": (None, "", "s", 0, b"\0a", None, None, b"{}", 0, b"\0b", b"\0a", 1, b"{}"),
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
        if name in ALL_SESSIONS:  # built per call, for its order, filters and cursor
            after = None if name == "list_first" else (datetime(2024, 1, 1, tzinfo=UTC), "s")
            query, params = list_query("", 10, after, Filters(None, None, None), "created")
            query = query.replace("{s}", store._schema_sql)
        else:
            query, params = store._q[name], PARAMS[name]
    scans = _scans(_explain(pg_url, query, params))
    conds = [" ".join(s.get(k, "") for k in ("Index Cond", "Recheck Cond")) for s in scans]
    keyed = [s for s, cond in zip(scans, conds, strict=True) if "session_id = " in cond]
    # S72: every scan, listing included, is limited to one tenant by its index, so
    # tables distributed by tenant answer every query from one shard.
    assert all("tenant = " in cond for cond in conds), f"{name}: a scan of all tenants: {scans}"
    if name in ONE_SESSION:
        assert scans, f"{name}: no scan of sessions or entries in the plan"
        assert keyed == scans, f"{name}: a scan not limited to one session_id: {scans}"
    else:
        assert scans and not keyed, f"{name}: expected a scan over all sessions: {scans}"
