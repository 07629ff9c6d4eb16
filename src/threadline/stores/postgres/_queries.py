"""The PostgreSQL store's statement texts, with ``{s}`` standing for its schema.

``QUERIES`` names every statement the store sends, among them an append for
each small batch size as a VALUES list (``append_values``); ``append_args``
picks the append for a batch and lays out its parameters. ``_store.py`` formats the
schema in and prepares them (``_wire.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from threadline.stores._rows import Row
from threadline.stores.postgres import _catalog
from threadline.stores.postgres._watch import NOTIFY
from threadline.stores.postgres._wire import VALUES_MAX

__all__ = ["QUERIES", "SET_TENANT", "append_args"]

_APPEND_INSERT = ("INSERT INTO {s}.entries (seq, ts, kind, tenant, session_id, entry_id, "
                  "parent_id, data) SELECT s.base + e.ord, e.ts, e.kind, s.tenant, "
                  "s.session_id, e.entry_id, e.parent_id, e.data FROM s, ")
# Every statement names its tenant (the store's, ``''`` for the default
# tenant) before the session id, as the keys do; row-level security then
# holds it to the transaction's ``threadline.tenant`` as well (``_schema.py``).
SET_TENANT = "SELECT set_config('threadline.tenant', %s, true)"


def append_values(n: int) -> str:
    """The append statement for ``n`` entries (``n <= VALUES_MAX``) as a VALUES list."""
    row = "(%s::smallint, %s::bytea, %s::bytea, %s::bigint, %s::bytea, {})"
    return (f"WITH s AS (UPDATE {{s}}.sessions SET next_seq = next_seq + {n}, "
            "last_activity = GREATEST(last_activity, %s::bigint) "
            f"WHERE tenant = %s AND session_id = %s "
            f"RETURNING tenant, session_id, next_seq - {n} AS base) "
            + _APPEND_INSERT + "(VALUES " + ", ".join(row.format(i) for i in range(1, n + 1))
            + ") AS e(kind, entry_id, parent_id, ts, data, ord)")


QUERIES = {
    "create": "INSERT INTO {s}.sessions (tenant, session_id, parent_id, created_at, "
              "last_activity) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant, session_id) "
              "DO NOTHING",
    # One statement: the UPDATE's row lock orders appenders to one session and
    # its RETURNING numbers the new entries; it raises the session's last
    # activity too (_catalog.py). Arrays in binary (``%b``): as text,
    # every bytea would be hex-escaped by the driver and parsed by the server.
    "append": "WITH s AS (UPDATE {s}.sessions SET next_seq = next_seq + %s, "
              "last_activity = GREATEST(last_activity, %s::bigint) "
              "WHERE tenant = %s AND session_id = %s "
              "RETURNING tenant, session_id, next_seq - %s AS base) "
              + _APPEND_INSERT + "unnest(%b::smallint[], %b::bytea[], %b::bytea[], "
              "%b::bigint[], %b::bytea[]) WITH ORDINALITY AS e(kind, entry_id, parent_id, ts, "
              "data, ord)",
    "load": "SELECT e.seq, e.kind, e.entry_id, e.parent_id, e.ts, e.data "
            "FROM {s}.sessions s LEFT JOIN {s}.entries e "
            "ON e.tenant = s.tenant AND e.session_id = s.session_id "
            "WHERE s.tenant = %s AND s.session_id = %s ORDER BY e.seq",
    "session": "SELECT session_id, parent_id, created_at FROM {s}.sessions "
               "WHERE tenant = %s AND session_id = %s",
    "metadata": _catalog.UPDATE_METADATA,
    # Delete the record first: its row lock waits out a running append, and the
    # second statement's fresh snapshot then sees every entry that append wrote.
    "delete_session": "DELETE FROM {s}.sessions WHERE tenant = %s AND session_id = %s",
    "delete_entries": "DELETE FROM {s}.entries WHERE tenant = %s AND session_id = %s",
    "watch_start": "SELECT (SELECT 1 FROM {s}.sessions WHERE tenant = %(t)s "
                   "AND session_id = %(sid)s), (SELECT seq FROM {s}.entries "
                   "WHERE tenant = %(t)s AND session_id = %(sid)s AND entry_id = %(after)s)",
    "watch_read": "SELECT seq, kind, entry_id, parent_id, ts, data FROM {s}.entries "
                  "WHERE tenant = %s AND session_id = %s AND seq > %s ORDER BY seq LIMIT 1000",
    "notify": NOTIFY,
    "stored_batch": "SELECT seq, kind, entry_id, parent_id, ts, data FROM {s}.entries "
                    "WHERE tenant = %s AND session_id = %s AND entry_id = ANY(%s::bytea[])",
    # The last entry is numbered next_seq (an append of n takes base+1 .. base+n).
    "lock_session": "SELECT next_seq FROM {s}.sessions WHERE tenant = %s AND session_id = %s "
                    "FOR UPDATE",
    "entry_at": "SELECT entry_id FROM {s}.entries WHERE tenant = %s AND session_id = %s "
                "AND seq = %s",
    "parent_of": "SELECT parent_id FROM {s}.entries WHERE tenant = %s AND session_id = %s "
                 "AND entry_id = %s",
    # The entry's own row first (so an empty result means it is not there), then those
    # after it. Its position comes from a subquery: as a join, a planner without
    # statistics yet took every entry of the session as the outer side.
    "after": "SELECT e.seq, e.kind, e.entry_id, e.parent_id, e.ts, e.data "
             "FROM {s}.entries e WHERE e.tenant = %(t)s AND e.session_id = %(sid)s "
             "AND e.seq >= (SELECT a.seq FROM {s}.entries a WHERE a.tenant = %(t)s "
             "AND a.session_id = %(sid)s AND a.entry_id = %(after)s) ORDER BY e.seq",
    "prune_lock": "SELECT session_id, parent_id, created_at FROM {s}.sessions "
                  "WHERE tenant = %s AND session_id = %s FOR UPDATE",
    "prune_load": "SELECT seq, kind, entry_id, parent_id, ts, data FROM {s}.entries "
                  "WHERE tenant = %s AND session_id = %s ORDER BY seq",
    "prune_delete": "DELETE FROM {s}.entries WHERE tenant = %s AND session_id = %s "
                    "AND entry_id = ANY(%s::bytea[])",
    # Blobs (S57), a tenant's own: touched by the server's clock, so every client shares one.
    "blob_touch": "UPDATE {s}.blobs SET touched_at = clock_timestamp() "
                  "WHERE tenant = %s AND key = %s",
    "blob_put": "INSERT INTO {s}.blobs (tenant, key, size, touched_at, data) "
                "VALUES (%s, %s, %s, clock_timestamp(), %b) "
                "ON CONFLICT (tenant, key) DO UPDATE SET touched_at = EXCLUDED.touched_at",
    "blob_get": "SELECT data FROM {s}.blobs WHERE tenant = %s AND key = %s",
    "blob_has": "SELECT key FROM {s}.blobs WHERE tenant = %s AND key = ANY(%s::text[])",
    "blob_touch_many": "UPDATE {s}.blobs SET touched_at = clock_timestamp() "
                       "WHERE tenant = %s AND key = ANY(%s::text[]) RETURNING key",
    "blob_list": "SELECT key, size, touched_at FROM {s}.blobs WHERE tenant = %s",
    # The age check and the delete in one statement: a concurrent touch holds
    # the row, and the delete then checks the touched time it wrote.
    "blob_delete": "DELETE FROM {s}.blobs WHERE tenant = %s AND key = ANY(%s::text[]) "
                   "AND touched_at < %s RETURNING key",
}
# A batch of up to VALUES_MAX entries has an append of its own with scalar
# parameters, which the wire (``_wire.py``) encodes itself.
QUERIES.update({f"append{n}": append_values(n) for n in range(1, VALUES_MAX + 1)})


def append_args(tenant: str, sid: str, rows: Sequence[Row],
                newest: int | None) -> tuple[str, list[Any]]:
    """The name of the append statement for ``rows`` (``append<n>``, from
    ``append_values``, up to ``VALUES_MAX`` rows, else ``append``), and its
    parameters (``newest``: the latest entry time, microseconds)."""
    if len(rows) <= VALUES_MAX:
        return f"append{len(rows)}", [newest, tenant, sid, *itertools.chain.from_iterable(rows)]
    n = len(rows)
    return "append", [n, newest, tenant, sid, n, *map(list, zip(*rows, strict=True))]
