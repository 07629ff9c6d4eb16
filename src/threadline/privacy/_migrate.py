"""Rewriting, sealed, a session stored before encryption; deleting a session with its forks.

A store is append-only, so a session is rewritten whole: its entries, sealed,
go first into a staging session beside it, then the session is deleted,
created again with the same record and given the staged entries, and the
staging session is deleted. A run killed anywhere is finished by the next
run for the same session.
"""

from __future__ import annotations

import contextlib
import hashlib
from datetime import datetime

import msgspec

from threadline.errors import BlobNotFound, ConfigError, SessionNotFound
from threadline.privacy._store import EncryptedStore
from threadline.session._entries import (
    CustomEntry,
    Entry,
    ErasedEntry,
    SealedEntry,
    SessionRecord,
    register_custom,
)
from threadline.stores._blobs import blob_parts
from threadline.stores._contract import BlobStore, Store
from threadline.stores._rules import check_session_id

__all__ = ["delete_with_forks", "migrate_session"]

_STAGED = "threadline.privacy.staged"


class _Staged(msgspec.Struct, frozen=True, kw_only=True):
    """The first entry of a staging session: whose entries follow."""

    session: str
    parent_id: str | None
    created_at: datetime


register_custom(_STAGED, _Staged)


STAGING_PREFIX = "threadline-staged-"


def _staging_id(session_id: str) -> str:
    return STAGING_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


async def staged_for(inner: Store, staging: str) -> str | None:
    """The session a staging session holds the sealed entries of (None: not one)."""
    if not staging.startswith(STAGING_PREFIX):
        return None
    entries = await inner.load_entries(staging)
    head = entries[0] if entries else None
    marker = head.data if isinstance(head, CustomEntry) else None
    return marker.session if isinstance(marker, _Staged) else None


async def migrate_session(store: EncryptedStore, session_id: str) -> int:
    """Rewrite ``session_id`` so that every entry is sealed; the entries it holds then.

    Returns 0, changing nothing, when every entry is sealed already.
    For a store written before encryption was turned on: open it with
    ``plaintext="read"``. The store beneath needs ``load_session`` and
    ``delete_session``. Nothing may append to the session while this runs
    (an entry appended meanwhile would be lost). Ids, parents, times and the
    session record stay as they were. The blobs its entries reference are
    sealed under the subject's names first; the plaintext copies stay
    until ``collect_garbage``, through a store not in migration mode, finds
    nothing referencing them.
    """
    check_session_id(session_id)
    inner = store.inner
    for needed in ("load_session", "delete_session"):
        if getattr(inner, needed, None) is None:
            raise ConfigError(f"migrate_session needs a store with {needed}; "
                              f"{type(inner).__name__} has none")
    staging = _staging_id(session_id)
    staged = await _staged(inner, staging, session_id)
    if staged is None:
        record: SessionRecord = await inner.load_session(session_id)  # type: ignore[attr-defined]
        stored = list(await inner.load_entries(session_id))
        if all(isinstance(e, (SealedEntry, ErasedEntry)) for e in stored):
            return 0
        if isinstance(inner, BlobStore):
            await _seal_blobs(store, inner, session_id, stored)
        sealed = await store._seal(session_id, stored)
        marker = CustomEntry(kind=_STAGED, data=_Staged(
            session=session_id, parent_id=record.parent_id, created_at=record.created_at))
        await inner.create_session(SessionRecord(id=staging, created_at=record.created_at))
        await inner.append_entries(staging, [marker, *sealed])
    else:
        record, sealed = staged
    with contextlib.suppress(SessionNotFound):  # deleted by the run this one finishes
        await inner.delete_session(session_id)  # type: ignore[attr-defined]
    await inner.create_session(record)
    await inner.append_entries(session_id, sealed)
    await inner.delete_session(staging)  # type: ignore[attr-defined]
    return len(sealed)


async def _seal_blobs(store: EncryptedStore, inner: BlobStore, session_id: str,
                      stored: list[Entry]) -> None:
    """Store sealed the plaintext blobs that ``stored`` references, before its entries move."""
    parts = blob_parts(e for e in stored if not isinstance(e, (SealedEntry, ErasedEntry)))
    if not parts:
        return
    # Sealed names only: in migration mode the plaintext key is among them too.
    names = {sha: [n for n in ns if n != sha]
             for sha, ns in (await store.session_blob_keys(session_id, parts)).items()}
    have = await store.has_blobs(sorted({n for ns in names.values() for n in ns}))
    for part in parts:
        if any(n in have for n in names[part.sha256]):
            continue
        try:
            data = await inner.get_blob(part.sha256)
        except BlobNotFound:
            continue  # missing before the migration too: the reference stays as it was
        if hashlib.sha256(data).hexdigest() == part.sha256:
            await store.put_session_blob(session_id, part, data)


async def _staged(inner: Store, staging: str,
                  session_id: str) -> tuple[SessionRecord, list[Entry]] | None:
    """What an earlier, interrupted run staged for ``session_id``, if it got that far."""
    try:
        entries = list(await inner.load_entries(staging))
    except SessionNotFound:
        return None
    if not entries:  # killed between creating the staging session and filling it
        await inner.delete_session(staging)  # type: ignore[attr-defined]
        return None
    head = entries[0]
    marker = head.data if isinstance(head, CustomEntry) else None
    if not isinstance(marker, _Staged) or marker.session != session_id:
        raise ConfigError(f"session {staging!r} is in the way of migrating {session_id!r}: it is "
                          f"not a staging session for it")
    record = SessionRecord(id=session_id, parent_id=marker.parent_id,
                           created_at=marker.created_at)
    return record, entries[1:]


async def delete_with_forks(store: Store, session_id: str) -> list[str]:
    """Delete ``session_id`` and every session forked from it, at any depth; their ids.

    Forks are found by the catalog's lineage (``parent_id``), so the store
    needs ``list_sessions`` and ``delete_session``. Forks go first, so a run
    stopped part way leaves the session, and running it again finishes the
    job. Without encryption this is the only erasure there is, and it
    reaches what the store still holds, not its backups.
    """
    check_session_id(session_id)
    lister = getattr(store, "list_sessions", None)
    delete = getattr(store, "delete_session", None)
    if lister is None or delete is None:
        raise ConfigError(f"delete_with_forks needs a store with list_sessions and "
                          f"delete_session; {type(store).__name__} lacks one")
    children: dict[str, list[str]] = {}
    known: set[str] = set()
    cursor = None
    while True:
        page = await lister(limit=500, cursor=cursor)
        for record in page.sessions:
            known.add(record.id)
            if record.parent_id is not None:
                children.setdefault(record.parent_id, []).append(record.id)
        cursor = page.next_cursor
        if cursor is None:
            break
    if session_id not in known and session_id not in children:
        raise SessionNotFound(session_id, "the store's listing")
    order, seen = [session_id], {session_id}
    for sid in order:  # breadth first; the list grows as it is walked
        fresh = [c for c in sorted(children.get(sid, ())) if c not in seen]
        order += fresh
        seen.update(fresh)
    deleted = []
    for sid in reversed(order):
        if sid in known:
            await delete(sid)
            deleted.append(sid)
    return deleted[::-1]
