"""Copying sessions between any two stores.

Ids, lineage and append order are kept; entries arrive byte-identical because
every store keeps the codec's bytes. The blobs the entries reference go
first, so the destination never acknowledges a reference to bytes it lacks
; a blob the destination has already is not sent again. A copy is safe to
run again after an interruption: it resumes where the destination stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Literal

import msgspec

from threadline.errors import ConfigError, CopyConflict, SessionNotFound
from threadline.session._codec import encode_entry
from threadline.session._entries import SessionRecord
from threadline.stores._blobs import copy_blobs
from threadline.stores._contract import Store

__all__ = ["CopyProgress", "CopyResult", "copy_sessions"]


class CopyProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Reported after each session. ``done`` counts sessions finished so far."""

    session_id: str
    done: int
    total: int
    status: Literal["copied", "resumed", "skipped"]
    """copied: new in the destination; resumed: the destination held a prefix
    and got the missing tail; skipped: already complete."""
    entries: int
    """Entries appended to the destination for this session."""
    blobs: int = 0
    """Blobs put into the destination for this session (those it lacked)."""


class CopyResult(msgspec.Struct, frozen=True, kw_only=True):
    copied: int = 0
    resumed: int = 0
    skipped: int = 0
    entries: int = 0
    blobs: int = 0


async def copy_sessions(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    *,
    batch_size: int = 500,
) -> CopyResult:
    """Copy sessions (all of ``src``'s when ``ids`` is None) into ``dst``.

    Records keep their id, parent and creation time; entries keep their bytes
    and append order. Resumable: a session already complete in ``dst`` is
    skipped, one holding a strict prefix of the source log gets the missing
    tail, and one that differs raises ``CopyConflict`` (nothing is
    overwritten). Entries go in batches of ``batch_size`` so an interrupted
    copy leaves a prefix that the next run completes.
    """
    load_session = getattr(src, "load_session", None)
    if load_session is None:
        raise ConfigError(f"copy_sessions needs a source with load_session to keep lineage; "
                          f"{type(src).__name__} has none")
    if batch_size < 1:
        raise ConfigError(f"copy_sessions batch_size must be at least 1, got {batch_size}")
    if ids is None:
        session_ids = await _all_ids(src)
    else:
        session_ids = list(dict.fromkeys(ids))
    counts = {"copied": 0, "resumed": 0, "skipped": 0, "entries": 0, "blobs": 0}
    for done, sid in enumerate(session_ids, 1):
        record: SessionRecord = await load_session(sid)
        status, appended, blobs = await _copy_one(src, dst, record, batch_size)
        counts[status] += 1
        counts["entries"] += appended
        counts["blobs"] += blobs
        if progress is not None:
            progress(CopyProgress(session_id=sid, done=done, total=len(session_ids),
                                  status=status, entries=appended, blobs=blobs))
    return CopyResult(**counts)


async def _all_ids(src: Store) -> list[str]:
    list_sessions = getattr(src, "list_sessions", None)
    if list_sessions is None:
        raise ConfigError(f"copy_sessions without ids needs a source with list_sessions; "
                          f"{type(src).__name__} has none")
    found: list[str] = []
    cursor = None
    while True:
        page = await list_sessions(limit=500, cursor=cursor)
        found += [r.id for r in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            # Oldest first, so parents tend to arrive before their forks.
            return found[::-1]


async def _copy_one(src: Store, dst: Store, record: SessionRecord, batch_size: int
                    ) -> tuple[Literal["copied", "resumed", "skipped"], int, int]:
    sid = record.id
    entries = await src.load_entries(sid)
    # Every source entry is checked (InvalidEntry naming the session) before
    # the destination gets the session, so a bad one leaves nothing behind.
    source = [encode_entry(e, session_id=sid) for e in entries]
    try:
        existing = await dst.load_entries(sid)
    except SessionNotFound:
        await dst.create_session(record)
        existing = []
        status: Literal["copied", "resumed", "skipped"] = "copied"
    else:
        status = "resumed"
        dst_load = getattr(dst, "load_session", None)
        if dst_load is not None:
            have: SessionRecord = await dst_load(sid)
            if (have.parent_id, _instant(have.created_at)) != (
                    record.parent_id, _instant(record.created_at)):
                raise CopyConflict(
                    f"session {sid!r} exists in the destination with a different record "
                    f"(parent {have.parent_id!r}, created {have.created_at.isoformat()}) "
                    f"than the source (parent {record.parent_id!r}, created "
                    f"{record.created_at.isoformat()})", session_id=sid)
    if len(existing) > len(source):
        raise CopyConflict(f"session {sid!r} has {len(existing)} entries in the destination "
                           f"but only {len(source)} in the source", session_id=sid)
    for n, entry in enumerate(existing):
        if encode_entry(entry) != source[n]:
            raise CopyConflict(f"session {sid!r} differs at entry {n + 1} (id {entry.id!r}): "
                               f"the destination holds different content", session_id=sid)
    tail = entries[len(existing):]
    if not tail and status == "resumed":
        return "skipped", 0, 0
    blobs = await copy_blobs(src, dst, sid, tail)
    for start in range(0, len(tail), batch_size):
        await dst.append_entries(sid, tail[start:start + batch_size])
    return status, len(tail), blobs


def _instant(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt
