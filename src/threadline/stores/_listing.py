"""Listing by metadata and activity, and setting metadata from outside an agent.

What every store shares: checking the filters and the order, matching a
session's metadata, keyset pages in either order, and ``set_metadata``,
which appends a change after the log's last entry. A store module adds only
how it finds the candidates (an index, a derived catalog).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from msgspec import UNSET, UnsetType

from threadline.errors import ConfigError
from threadline.session._entries import CustomEntry, Entry, SessionRecord
from threadline.session._metadata import (
    METADATA_KIND,
    MetadataChange,
    SessionMetadata,
    fold_metadata,
    merge_changes,
    metadata_change,
    newest_timestamp,
)
from threadline.stores._contract import (
    LinearStore,
    ListOrder,
    SessionInfo,
    SessionPage,
    Store,
    chain_after,
    decode_cursor,
    encode_cursor,
)
from threadline.stores._rules import check_limit, check_session_id, to_micros

__all__ = [
    "Filters",
    "Touch",
    "activity_of",
    "applied_labels",
    "check_listing",
    "load_metadata",
    "page_fetched_infos",
    "page_infos",
    "set_metadata",
    "touch_of",
]


class Filters:
    """The checked ``owner``, ``tenant`` and ``labels`` of one listing."""

    __slots__ = ("labels", "owner", "tenant")

    def __init__(self, owner: str | None, tenant: str | None,
                 labels: Mapping[str, str] | None) -> None:
        for what, value in (("owner", owner), ("tenant", tenant)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"list_sessions {what} must be a string or None, got "
                                  f"{type(value).__name__}")
        if labels is not None and not isinstance(labels, Mapping):
            raise ConfigError(f"list_sessions labels must be a mapping of name to value, got "
                              f"{type(labels).__name__}")
        self.owner, self.tenant = owner, tenant
        self.labels = dict(labels or {})
        for name, value in self.labels.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigError(f"list_sessions labels map names to values, both strings; "
                                  f"got {name!r}: {value!r}")

    @property
    def none(self) -> bool:
        return self.owner is None and self.tenant is None and not self.labels

    def match(self, meta: SessionMetadata) -> bool:
        return ((self.owner is None or meta.owner == self.owner)
                and (self.tenant is None or meta.tenant == self.tenant)
                and all(meta.labels.get(k) == v for k, v in self.labels.items()))


def check_listing(
    limit: int, cursor: str | None, order: ListOrder, *, owner: str | None,
    tenant: str | None, labels: Mapping[str, str] | None,
) -> tuple[tuple[datetime, str] | None, Filters]:
    """Check every argument of ``list_sessions`` (``ConfigError``): the cursor's position
    and the filters."""
    check_limit(limit)
    if order not in ("created", "activity"):
        raise ConfigError(f"list_sessions order must be 'created' or 'activity', got {order!r}")
    after = None if cursor is None else decode_cursor(cursor, order)
    return after, Filters(owner, tenant, labels)


def activity_of(record: SessionRecord, newest: datetime | None) -> datetime:
    """A session's last activity: its newest entry time, never before its creation."""
    created = record.created_at
    return created if newest is None or to_micros(newest) <= to_micros(created) else newest


def _key(info: SessionInfo, order: ListOrder) -> tuple[int, str]:
    at = info.last_activity if order == "activity" else info.record.created_at
    return to_micros(at), info.record.id


def _page(infos: list[SessionInfo], more: bool, order: ListOrder) -> SessionPage:
    cursor = None
    if more:
        last = infos[-1]
        cursor = encode_cursor(last.record,
                               last.last_activity if order == "activity" else None)
    return SessionPage(sessions=[i.record for i in infos], next_cursor=cursor, infos=infos)


def page_infos(infos: Iterable[SessionInfo], *, limit: int,
               after: tuple[datetime, str] | None, filters: Filters,
               order: ListOrder) -> SessionPage:
    """One page of ``infos`` (any order), newest first in ``order``, filtered."""
    chosen = [i for i in infos if filters.match(i.metadata)] if not filters.none else list(infos)
    keyed = sorted(((_key(i, order), i) for i in chosen), key=lambda p: p[0])
    keys = [k for k, _ in keyed]
    end = len(keyed) if after is None else bisect.bisect_left(
        keys, (to_micros(after[0]), after[1]))
    start = max(0, end - limit)
    page = [i for _, i in reversed(keyed[start:end])]
    return _page(page, start > 0, order)


def page_fetched_infos(infos: Sequence[SessionInfo], limit: int,
                       order: ListOrder) -> SessionPage:
    """A page from up to ``limit + 1`` infos fetched newest first (one extra says "more")."""
    return _page(list(infos[:limit]), len(infos) > limit, order)


async def load_metadata(store: Store, session_id: str) -> SessionMetadata:
    """A session's metadata now: the fold of every change in its log."""
    return fold_metadata(await store.load_entries(check_session_id(session_id)))


async def set_metadata(
    store: Store, session_id: str, *, title: str | UnsetType | None = UNSET,
    owner: str | UnsetType | None = UNSET, tenant: str | UnsetType | None = UNSET,
    labels: Mapping[str, str | None] | None = None,
) -> Entry:
    """Append one metadata change to a session, after the last entry of its log.

    Fields left out keep their value; ``None`` clears one (a label set to
    ``None`` is removed). On a ``LinearStore`` the change is chained after
    whatever entry is last when it is written; on another store after the
    last entry this call loaded. Returns the entry as stored. A live
    ``DurableAgent`` on the session has ``set_metadata`` of its own, which
    appends at its leaf.
    """
    sid = check_session_id(session_id)
    change = metadata_change(title=title, owner=owner, tenant=tenant, labels=labels)
    entry: Entry = CustomEntry(kind=METADATA_KIND, data=change)
    if isinstance(store, LinearStore):
        return (await store.append_linear(sid, [entry]))[0]
    entries = await store.load_entries(sid)
    entry = chain_after([entry], entries[-1].id if entries else None)[0]
    await store.append_entries(sid, [entry])
    return entry


Touch = tuple[int | None, MetadataChange | None]
"""What one append changes in a session's catalog row: the newest entry time
(microseconds), and its metadata changes merged into one."""


def touch_of(entries: Sequence[Entry]) -> Touch:
    newest = newest_timestamp(entries)
    return (None if newest is None else to_micros(newest)), merge_changes(entries)


def applied_labels(labels: Mapping[str, str], change: MetadataChange) -> dict[str, str]:
    """``labels`` after ``change``."""
    out = dict(labels)
    for name, value in change.labels.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out
