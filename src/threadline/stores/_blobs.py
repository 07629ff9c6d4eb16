"""Attachments kept beside the log: attach, open, collect.

An entry holds a ``BlobPart`` (hash, media type, size, name); the bytes live
in the store's ``BlobStore`` under a key. For a plain store the key is the
SHA-256 hex of the bytes, so the same file attached twice, or carried into a
fork, is stored once. A layer that keeps blobs per session (``EncryptedStore``
keys them per subject) offers the session methods of ``SessionBlobs``, and
these functions use them instead.

The receipts rule holds because the order is fixed here: ``attach`` returns
only after ``put_blob`` made the bytes durable, and the caller appends the
entry holding the part after that. Garbage collection counts references from
entries and spares every blob touched within its grace period, so a blob
attached for an append that has not landed yet is never swept.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import msgspec

from threadline.ai._messages import BlobPart
from threadline.errors import BlobNotFound, BlobTooLarge, ConfigError, CorruptLog, SessionNotFound
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry
from threadline.stores._contract import BlobStore, Store
from threadline.stores._rules import check_session_id

__all__ = [
    "DEFAULT_MAX_BLOB",
    "GcReport",
    "SessionBlobs",
    "attach",
    "blob_parts",
    "blob_store",
    "collect_garbage",
    "copy_blobs",
    "open_blob",
]

DEFAULT_MAX_BLOB = 20 * 1024 * 1024
"""20 MiB. The providers take images of 5 to 20 MB inline; a bigger file would
be refused by the model anyway, and belongs to an upload hook, not the log."""

# RFC 6838 type and subtype names, without parameters: a media type goes to
# HTTP headers and HTML attributes, so only these characters may be in it.
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HASH_INLINE = 1 << 20


@runtime_checkable
class SessionBlobs(Protocol):
    """A store whose blob keys depend on the session (``EncryptedStore``).

    ``put_session_blob`` stores a part's plaintext for ``session_id``;
    ``get_session_blob`` gives it back; ``session_blob_keys`` names, per
    hash, every stored key a reference from that session may resolve to
    (garbage collection keeps them all).
    """

    async def put_session_blob(self, session_id: str, part: BlobPart, data: bytes) -> None: ...

    async def get_session_blob(self, session_id: str, part: BlobPart) -> bytes: ...

    async def session_blob_keys(self, session_id: str,
                                parts: Sequence[BlobPart]) -> dict[str, list[str]]: ...


class GcReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``collect_garbage`` did."""

    sessions: int
    """Sessions whose entries were read."""
    referenced: int
    """Stored keys some entry references (kept)."""
    young: int
    """Unreferenced blobs spared because they were touched within the grace period."""
    deleted: list[str]
    """Keys deleted."""
    freed: int
    """Bytes deleted (as stored)."""


def blob_store(store: Store, what: str) -> BlobStore:
    """``store`` as a ``BlobStore``, or ``ConfigError`` saying it keeps no blobs."""
    if not isinstance(store, BlobStore):
        raise ConfigError(f"{what}: {type(store).__name__} keeps no blobs (it has no put_blob, "
                          f"get_blob, has_blobs, list_blobs and delete_blobs)")
    return store


def _check_part(part: object, session_id: str) -> BlobPart:
    if not isinstance(part, BlobPart):
        raise ConfigError(f"session {session_id!r}: expected a BlobPart, got "
                          f"{type(part).__name__}")
    if not isinstance(part.sha256, str) or not _HEX64.fullmatch(part.sha256):
        raise ConfigError(f"session {session_id!r}: not a SHA-256 hex digest: "
                          f"{str(part.sha256)[:80]!r}")
    return part


async def attach(store: Store, session_id: str, data: bytes, *, media_type: str,
                 name: str | None = None, max_size: int = DEFAULT_MAX_BLOB) -> BlobPart:
    """Store ``data`` durably and return the part that references it.

    Append the entry holding the part only after this returns: the bytes are
    then on stable storage (committed, for a server), so no acknowledged
    reference can point at bytes a crash lost. The size limit is checked
    first: ``BlobTooLarge`` stores nothing. Attaching bytes already stored
    stores nothing new and refreshes their touched time, which keeps them
    from garbage collection for its grace period.
    """
    check_session_id(session_id)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ConfigError(f"session {session_id!r}: attach takes bytes, got "
                          f"{type(data).__name__}")
    if not isinstance(max_size, int) or max_size < 0:
        raise ConfigError(f"attach max_size must be a non-negative integer, got {max_size!r}")
    if name is not None and (not isinstance(name, str) or len(name) > 1024):
        raise ConfigError(f"session {session_id!r}: an attachment name is a string of at most "
                          f"1,024 characters")
    size = len(data)
    if size > max_size:
        raise BlobTooLarge(size, max_size, session_id=session_id, name=name)
    if not isinstance(media_type, str) or not _MEDIA_TYPE.fullmatch(media_type.lower()):
        raise ConfigError(f"session {session_id!r}: not a media type (type/subtype, no "
                          f"parameters): {str(media_type)[:80]!r}")
    data = bytes(data)
    # A big file's hash on a thread: 20 MiB would hold the event loop for ~15 ms.
    digest = (hashlib.sha256(data).hexdigest() if size < _HASH_INLINE
              else await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest()))
    part = BlobPart(sha256=digest, media_type=media_type.lower(), size=size, name=name)
    if isinstance(store, SessionBlobs):
        await store.put_session_blob(session_id, part, data)
    else:
        await blob_store(store, "attach").put_blob(part.sha256, data)
    return part


async def open_blob(store: Store, session_id: str, part: BlobPart, *,
                    entry_id: str | None = None) -> bytes:
    """The bytes ``part`` references, checked against its hash and size.

    A missing blob raises ``BlobNotFound`` naming the session, the hash and
    (when given) the entry; bytes that do not match raise ``CorruptLog``.
    """
    check_session_id(session_id)
    _check_part(part, session_id)
    try:
        if isinstance(store, SessionBlobs):
            data = await store.get_session_blob(session_id, part)
        else:
            data = await blob_store(store, "open_blob").get_blob(part.sha256)
    except BlobNotFound as exc:
        raise BlobNotFound(part.sha256, type(store).__name__, session_id=session_id,
                           entry_id=entry_id) from exc
    if len(data) != part.size or hashlib.sha256(data).hexdigest() != part.sha256:
        raise CorruptLog(f"the stored bytes ({len(data):,} bytes) do not match the reference "
                         f"({part.size:,} bytes, sha256 {part.sha256})", session_id=session_id,
                         path=f"blob {part.sha256}")
    return data


# -- finding references ----------------------------------------------------------------

_MARK = b'"blob"'


def blob_parts(entries: Iterable[Entry]) -> list[BlobPart]:
    """Every ``BlobPart`` the entries hold, in messages and custom data alike, once each."""
    found: dict[tuple[str, str], BlobPart] = {}
    for entry in entries:
        line = encode_entry(entry)
        if _MARK in line:
            _walk(msgspec.json.decode(line), found)
    return list(found.values())


def _walk(value: Any, found: dict[tuple[str, str], BlobPart]) -> None:
    if isinstance(value, dict):
        if value.get("type") == "blob" and isinstance(value.get("sha256"), str):
            try:
                part = msgspec.convert(value, BlobPart)
            except msgspec.ValidationError:
                pass  # an object that only looks like a part
            else:
                found.setdefault((part.sha256, part.media_type), part)
                return
        for v in value.values():
            _walk(v, found)
    elif isinstance(value, list):
        for v in value:
            _walk(v, found)


async def _keys_of(store: Store, session_id: str,
                   parts: Sequence[BlobPart]) -> dict[str, list[str]]:
    """Per hash, the stored keys the session's references may resolve to."""
    if isinstance(store, SessionBlobs):
        return await store.session_blob_keys(session_id, parts)
    return {p.sha256: [p.sha256] for p in parts}


# -- moving ----------------------------------------------------------------------------

async def copy_blobs(src: Store, dst: Store, session_id: str, entries: Sequence[Entry]) -> int:
    """Put into ``dst`` the blobs ``entries`` reference that it lacks; return how many.

    Done before the entries are appended to ``dst`` (the receipts rule), and
    each blob is checked against its hash on the way. A blob ``dst`` has is
    touched there (``touch_blobs``, when it has it) instead of sent again. A blob missing from
    ``src`` raises ``BlobNotFound`` and nothing is appended.
    """
    parts = [p for p in blob_parts(entries) if _HEX64.fullmatch(p.sha256)]
    if not parts:
        return 0
    target = blob_store(dst, f"copying session {session_id!r}")
    keys = await _keys_of(dst, session_id, parts)
    # Touched, not only looked up: a blob the destination has is spared by its
    # collector like one attached now, even if nothing there references it yet (S58).
    touch = getattr(dst, "touch_blobs", None) or target.has_blobs
    have = await touch(sorted({k for ks in keys.values() for k in ks}))
    copied = 0
    for part in parts:
        if any(k in have for k in keys.get(part.sha256, ())):
            continue
        data = await open_blob(src, session_id, part)
        if isinstance(dst, SessionBlobs):
            await dst.put_session_blob(session_id, part, data)
        else:
            await target.put_blob(part.sha256, data)
        copied += 1
    return copied


# -- garbage collection ----------------------------------------------------------------

async def _mark(store: Store, list_sessions: Any, referenced: set[str]) -> int:
    """Add to ``referenced`` every key an entry of a listed session references."""
    sessions = 0
    cursor: str | None = None
    while True:
        page = await list_sessions(limit=200, cursor=cursor)
        if page.problems:
            raise page.problems[0]
        for record in page.sessions:
            try:
                entries = await store.load_entries(record.id)
            except SessionNotFound:
                continue  # deleted while we read: its references no longer count
            sessions += 1
            parts = blob_parts(entries)
            if parts:
                for ks in (await _keys_of(store, record.id, parts)).values():
                    referenced.update(ks)
        cursor = page.next_cursor
        if cursor is None:
            return sessions


async def collect_garbage(store: Store, *, grace: timedelta = timedelta(hours=1)) -> GcReport:
    """Delete the blobs no entry of any session references, once past ``grace``.

    Mark: every entry of every session the catalog lists is read, and each
    reference counts (a deleted session's no longer do, nor those of a
    subject erased from an ``EncryptedStore``). Sweep: of the blobs no
    reference names, those last touched before the collection started minus
    ``grace`` are deleted, each in one step against a concurrent put.

    That is safe against an append racing the collection, provided the
    append follows its ``attach`` within ``grace``: ``attach`` touches the
    blob, so a blob that an entry is about to reference is younger than the
    cut-off, even when the entry lands after the mark. A session that
    cannot be read stops the collection before anything is deleted.
    """
    blobs = blob_store(store, "collect_garbage")
    list_sessions = getattr(store, "list_sessions", None)
    if list_sessions is None:
        raise ConfigError(f"collect_garbage needs a store that lists its sessions; "
                          f"{type(store).__name__} cannot")
    if not isinstance(grace, timedelta) or grace < timedelta(0):
        raise ConfigError(f"collect_garbage grace must be a non-negative timedelta, got {grace!r}")
    # Before the mark: a blob touched after this instant is spared whatever the mark saw.
    cutoff = datetime.now(UTC) - grace
    referenced: set[str] = set()
    sessions = await _mark(store, list_sessions, referenced)
    stored = await blobs.list_blobs()
    young = 0
    candidates: dict[str, int] = {}
    for info in stored:
        if info.key in referenced:
            continue
        if info.touched_at >= cutoff:
            young += 1
        else:
            candidates[info.key] = info.size
    deleted = await blobs.delete_blobs(sorted(candidates), older_than=cutoff) if candidates else []
    return GcReport(sessions=sessions, referenced=sum(1 for i in stored if i.key in referenced),
                    young=young + len(candidates) - len(deleted), deleted=deleted,
                    freed=sum(candidates[k] for k in deleted))
