"""The PostgreSQL store's catalog: metadata and last activity on each session row.

``sessions`` carries ``last_activity`` (microseconds since the epoch, as
``entries.ts``), ``title``, ``owner``, ``meta_tenant`` (the metadata's
``tenant``; the column ``tenant`` is the store's own, row-level security's)
and ``labels`` (``jsonb`` with a GIN index). The append statement raises ``last_activity`` in the
``UPDATE`` it already makes to number the entries, so activity costs no
statement of its own; an append holding metadata changes also runs
``UPDATE_METADATA`` in its transaction, under the same row lock, so the
changes land in append order. Listing reads one index range.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec import UNSET

from threadline.session._entries import SessionRecord
from threadline.session._metadata import MetadataChange, SessionMetadata
from threadline.stores._contract import ListOrder, SessionInfo
from threadline.stores._listing import Filters
from threadline.stores._rules import from_micros, to_micros

__all__ = ["COLUMNS", "MIGRATION", "UPDATE_METADATA", "info", "list_query", "metadata_args"]

MIGRATION = """
ALTER TABLE {s}.sessions ADD COLUMN last_activity bigint;
ALTER TABLE {s}.sessions ADD COLUMN title text;
ALTER TABLE {s}.sessions ADD COLUMN owner text COLLATE "C";
ALTER TABLE {s}.sessions ADD COLUMN meta_tenant text COLLATE "C";
ALTER TABLE {s}.sessions ADD COLUMN labels jsonb NOT NULL DEFAULT '{{}}';
UPDATE {s}.sessions s SET last_activity = GREATEST((extract(epoch FROM s.created_at) * 1000000)::bigint, (SELECT max(e.ts) FROM {s}.entries e WHERE e.session_id = s.session_id));
ALTER TABLE {s}.sessions ALTER COLUMN last_activity SET NOT NULL;
CREATE INDEX sessions_activity ON {s}.sessions (last_activity DESC, session_id DESC);
CREATE INDEX sessions_owner_activity ON {s}.sessions (owner, last_activity DESC, session_id DESC);
CREATE INDEX sessions_tenant_activity ON {s}.sessions (meta_tenant, last_activity DESC, session_id DESC);
CREATE INDEX sessions_labels ON {s}.sessions USING gin (labels jsonb_path_ops);
"""  # noqa: E501
"""Schema version 5. Metadata entries did not exist before it, so only the
activity needs filling in."""

COLUMNS = ("s.session_id, s.parent_id, s.created_at, s.last_activity, s.title, s.owner, "
           "s.meta_tenant, s.labels::text")

UPDATE_METADATA = (
    "UPDATE {s}.sessions SET title = CASE WHEN %s THEN %s ELSE title END, "
    "owner = CASE WHEN %s THEN %s ELSE owner END, "
    "meta_tenant = CASE WHEN %s THEN %s ELSE meta_tenant END, "
    "labels = (labels || %s::jsonb) - %s::text[] WHERE tenant = %s AND session_id = %s")

_labels = msgspec.json.Decoder(dict[str, str])


def metadata_args(tenant: str, sid: str, change: MetadataChange) -> list[Any]:
    """The parameters of ``UPDATE_METADATA`` for ``change`` (``tenant``: the store's)."""
    args: list[Any] = []
    for name in ("title", "owner", "tenant"):
        value = getattr(change, name)
        args += (value is not UNSET, None if value is UNSET else value)
    kept = {k: v for k, v in change.labels.items() if v is not None}
    gone = [k for k, v in change.labels.items() if v is None]
    return [*args, msgspec.json.encode(kept).decode(), gone, tenant, sid]


def info(row: Sequence[Any]) -> SessionInfo:
    """A ``SessionInfo`` from a row of ``COLUMNS``."""
    created: datetime = row[2].astimezone(UTC)
    record = SessionRecord(id=row[0], parent_id=row[1], created_at=created)
    meta = SessionMetadata(title=row[4], owner=row[5], tenant=row[6],
                           labels=_labels.decode(row[7]) if row[7] else {})
    activity = from_micros(row[3]) if row[3] is not None else created
    return SessionInfo(record=record, metadata=meta,
                       last_activity=max(activity, created))


def list_query(tenant: str, limit: int, after: tuple[datetime, str] | None, filters: Filters,
               order: ListOrder) -> tuple[str, list[Any]]:
    """The listing's statement (``{s}`` the schema) and parameters: up to ``limit + 1``
    rows of the store's ``tenant``, newest first."""
    col = "s.last_activity" if order == "activity" else "s.created_at"
    where: list[str] = ["s.tenant = %s"]
    args: list[Any] = [tenant]
    if filters.owner is not None:
        where.append("s.owner = %s")
        args.append(filters.owner)
    if filters.tenant is not None:
        where.append("s.meta_tenant = %s")
        args.append(filters.tenant)
    if filters.labels:
        where.append("s.labels @> %s::jsonb")
        args.append(msgspec.json.encode(filters.labels).decode())
    if after is not None:
        where.append(f"({col}, s.session_id) < (%s, %s)")
        args += (to_micros(after[0]) if order == "activity" else after[0], after[1])
    sql = (f"SELECT {COLUMNS} FROM {{s}}.sessions s WHERE " + " AND ".join(where)
           + f" ORDER BY {col} DESC, s.session_id DESC LIMIT %s")
    return sql, [*args, limit + 1]
