"""What every built-in store shares: the session-id rule, paging, the retry check.

Each rule here is kept once so that an id, a page or a stored row means the
same thing on every store; a store module only adds its own I/O.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from threadline.errors import ConfigError, InvalidEntry, InvalidSessionId, StoreError
from threadline.session._codec import MAX_ENTRY_ID_BYTES
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
    SessionRecord,
)
from threadline.stores._contract import (
    SessionPage,
    decode_cursor,
    encode_cursor,
    entry_not_found,
)

__all__ = [
    "MAX_SESSION_ID_BYTES",
    "aware",
    "check_blob_key",
    "check_blob_keys",
    "check_entries",
    "check_entry_id",
    "check_limit",
    "check_record",
    "check_retried_batch",
    "check_session_id",
    "check_tenant",
    "entry_type",
    "from_micros",
    "lines_after",
    "page_fetched",
    "page_records",
    "page_sorted",
    "sort_key",
    "tenant_folder",
    "to_micros",
]

MAX_SESSION_ID_BYTES = 1024
"""Longest session id, in UTF-8 bytes.

PostgreSQL cannot index much more than 2,700 bytes per key, and the file
store's first line must stay small enough to read with one bounded read.
"""


def check_session_id(session_id: object) -> str:
    """The one session-id rule of every store (and ``durable.open``).

    A session id is a non-empty ``str`` of valid Unicode text (no lone
    surrogates) without NUL, at most ``MAX_SESSION_ID_BYTES`` bytes in UTF-8.
    Anything else raises ``InvalidSessionId`` before a store touches storage.
    """
    if not isinstance(session_id, str) or not session_id:
        raise InvalidSessionId(f"session id must be a non-empty string, got {session_id!r}")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidSessionId(
            f"session id {session_id!r} is not valid Unicode text (it holds a lone surrogate)",
            session_id=None,
        ) from exc
    if "\x00" in session_id:
        raise InvalidSessionId(f"session id {session_id!r} contains NUL, which no store can "
                               f"keep", session_id=session_id)
    if size > MAX_SESSION_ID_BYTES:
        raise InvalidSessionId(
            f"session id {session_id[:40]!r}... is {size} bytes in UTF-8; the limit is "
            f"{MAX_SESSION_ID_BYTES}", session_id=session_id)
    return session_id


MAX_TENANT_BYTES = 200
"""Longest tenant name, in UTF-8 bytes."""


def check_tenant(tenant: object) -> str:
    """The one tenant-name rule of every store: a non-empty ``str`` of valid
    Unicode without control characters, at most ``MAX_TENANT_BYTES`` bytes in
    UTF-8. Anything else raises ``ConfigError``."""
    if not isinstance(tenant, str) or not tenant:
        raise ConfigError(f"tenant must be a non-empty string, got {tenant!r}")
    try:
        size = len(tenant.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"tenant {tenant!r} is not valid Unicode text") from exc
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in tenant):
        raise ConfigError(f"tenant {tenant!r} contains a control character")
    if size > MAX_TENANT_BYTES:
        raise ConfigError(f"tenant {tenant[:40]!r}... is {size} bytes in UTF-8; the limit "
                          f"is {MAX_TENANT_BYTES}")
    return tenant


_PLAIN_TENANT = re.compile(r"[a-z0-9_-]{1,100}")
_DEVICES = frozenset({"con", "prn", "aux", "nul"}
                     | {f"{p}{n}" for p in ("com", "lpt") for n in "0123456789"})


def tenant_folder(root: str | os.PathLike[str], tenant: str | None) -> Path:
    """Where a file or SQLite store keeps ``tenant``'s data: ``<root>/tenants/<name>``.

    ``<name>`` is the tenant itself when made of lowercase letters, digits,
    ``-`` and ``_`` (and not a Windows device name), else ``=`` plus the
    lowercase base32 of its UTF-8 bytes, or ``==`` plus their SHA-256 when that
    would be too long: the file store's rule for session file names, so no
    tenant can leave ``<root>/tenants`` or share a folder with another, even on
    a case-insensitive file system. Without a tenant: ``root`` itself.
    """
    if tenant is None:
        return Path(root)
    raw = check_tenant(tenant).encode("utf-8")
    if _PLAIN_TENANT.fullmatch(tenant) and tenant not in _DEVICES:
        name = tenant
    elif len(raw) <= 120:
        name = "=" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()
    else:
        name = "==" + hashlib.sha256(raw).hexdigest()
    return Path(root) / "tenants" / name


def check_entry_id(entry_id: object, session_id: str, where: str) -> str | None:
    """The one rule for an entry-id argument (``after``, ``entry_id``): None or an id.

    An id is a non-empty ``str`` of valid Unicode without NUL, at most
    ``MAX_ENTRY_ID_BYTES`` in UTF-8, as ``encode_entry`` requires of every
    stored id; anything else could never name a stored entry and raises
    ``ConfigError`` naming ``where`` and the session. Whether the id is in
    the log is the caller's question.
    """
    if entry_id is None:
        return None
    problem = None
    if not isinstance(entry_id, str) or not entry_id:
        problem = f"must be None or a non-empty string, got {entry_id!r}"
    elif "\x00" in entry_id:
        problem = f"contains NUL: {entry_id[:40]!r}"
    else:
        try:
            size = len(entry_id.encode("utf-8"))
        except UnicodeEncodeError:
            problem = f"is not valid Unicode text (it holds a lone surrogate): {entry_id[:40]!r}"
        else:
            if size > MAX_ENTRY_ID_BYTES:
                problem = f"is {size} bytes in UTF-8; the limit is {MAX_ENTRY_ID_BYTES}"
    if problem is not None:
        raise ConfigError(f"{where} on session {session_id!r}: the entry id {problem}")
    return entry_id  # type: ignore[return-value]


_ENTRY_TYPES = (MessageEntry, CompactionEntry, BranchSummaryEntry, CustomEntry, CustomMessageEntry,
                SealedEntry, ErasedEntry, OpaqueEntry)


def check_entries(entries: object, session_id: str, where: str) -> Sequence[Entry]:
    """The batch argument of an append: a list or tuple of entries.

    Each item is only checked to be an entry here; the codec checks what it holds.
    """
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"{where} on session {session_id!r}: entries must be a list or tuple "
                          f"of entries, got {type(entries).__name__}")
    for i, item in enumerate(entries):
        if not isinstance(item, _ENTRY_TYPES):
            raise InvalidEntry(f"item {i} of the batch given to {where} is a "
                               f"{type(item).__name__}, not an entry", session_id=session_id)
    return entries


def check_record(record: SessionRecord) -> str:
    """Check a record's id and, when set, its ``parent_id`` (also a session id)."""
    sid = check_session_id(record.id)
    if record.parent_id is not None:
        try:
            check_session_id(record.parent_id)
        except InvalidSessionId as exc:
            raise InvalidSessionId(f"session {sid!r}: parent_id is not a valid session id: "
                                   f"{exc}", session_id=sid) from exc
    return sid


_BLOB_KEY = frozenset("0123456789abcdefghijklmnopqrstuvwxyz")


def check_blob_key(key: object) -> str:
    """The one blob-key rule: 1 to 128 lowercase ASCII letters and digits.

    Narrow on purpose: a key becomes a file name and an SQL value, so nothing
    in it can climb out of a folder, hide in a terminal or differ by case.
    """
    if not isinstance(key, str) or not 0 < len(key) <= 128 or not _BLOB_KEY.issuperset(key):
        shown = repr(key[:80]) if isinstance(key, str) else type(key).__name__
        raise ConfigError(f"not a blob key: {shown} (1 to 128 lowercase letters and digits)")
    return key


def check_blob_keys(keys: object) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, Sequence | set | frozenset):
        raise ConfigError(f"blob keys come as a sequence of strings, got {type(keys).__name__}")
    return [check_blob_key(k) for k in keys]


def aware(dt: datetime) -> datetime:
    """A naive time taken as UTC, so it orders with aware ones (as the codec reads it)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(0, 0, 1)


def to_micros(dt: datetime) -> int:
    """Microseconds since the Unix epoch; a naive time is taken as UTC."""
    # aware() inline and the divisor made once: this runs for every SQL append
    # and every record a listing sorts, and took three times as long.
    return ((dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)) - _EPOCH) // _MICROSECOND


def from_micros(us: int) -> datetime:
    return _EPOCH + timedelta(0, 0, us)  # positional: a keyword costs half as much again


def sort_key(record: SessionRecord) -> tuple[int, str]:
    # Integers, not datetimes: comparing aware datetimes whose tzinfo objects
    # differ calls utcoffset() twice per comparison, which dominated sorting.
    return to_micros(record.created_at), record.id


def check_limit(limit: int) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(f"list_sessions limit must be an integer of at least 1, got {limit!r}")


def page_records(
    records: Iterable[SessionRecord], *, limit: int, cursor: str | None
) -> SessionPage:
    """One page of ``records``, newest first by ``created_at`` then ``id`` descending."""
    check_limit(limit)
    after = None if cursor is None else decode_cursor(cursor)
    return page_sorted(sorted(records, key=sort_key), limit=limit, after=after)


def page_sorted(
    ascending: Sequence[SessionRecord], *, limit: int,
    after: tuple[datetime, str] | None, keys: Sequence[tuple[int, str]] | None = None,
) -> SessionPage:
    """A page from records already sorted oldest first (``keys`` their sort keys)."""
    if keys is None:
        keys = [sort_key(r) for r in ascending]
    end = len(ascending) if after is None else bisect.bisect_left(
        keys, (to_micros(after[0]), after[1]))
    start = max(0, end - limit)
    page = list(reversed(ascending[start:end]))
    return SessionPage(sessions=page, next_cursor=encode_cursor(page[-1]) if start else None)


def page_fetched(records: Sequence[SessionRecord], limit: int) -> SessionPage:
    """A page from up to ``limit + 1`` records fetched newest first (one extra says "more")."""
    page = list(records[:limit])
    more = len(records) > limit
    return SessionPage(sessions=page, next_cursor=encode_cursor(page[-1]) if more else None)


def entry_type(entry: Entry) -> str:
    """The ``type`` discriminator an entry encodes with."""
    if isinstance(entry, OpaqueEntry):
        return entry.type
    return str(entry.__struct_config__.tag)


def check_retried_batch(
    session_id: str,
    batch: Sequence[tuple[str, bytes]],
    stored: Mapping[str, tuple[int, bytes]],
    where: str,
) -> None:
    """Return if ``batch`` (id, bytes) is already stored whole; raise ``StoreError`` if not.

    ``stored`` maps the ids of the batch that the session holds to their
    position in its log and their stored bytes.
    """
    problem = _conflict(batch, stored)
    if problem:
        raise StoreError(f"{where}: append to session {session_id!r} repeats an entry id "
                         f"already in the session, and is not a retry of a stored append: "
                         f"{problem}; nothing was appended", session_id=session_id)


def _conflict(batch: Sequence[tuple[str, bytes]], stored: Mapping[str, tuple[int, bytes]]) -> str:
    if len({entry_id for entry_id, _ in batch}) < len(batch):
        return "the batch holds one id twice"
    missing = [entry_id for entry_id, _ in batch if entry_id not in stored]
    if missing:
        return f"entry {missing[0]!r} is new but others are stored"
    first = stored[batch[0][0]][0]
    for offset, (entry_id, data) in enumerate(batch):
        position, stored_data = stored[entry_id]
        if stored_data != data:
            return f"entry {entry_id!r} is stored with different content"
        if position != first + offset:
            return f"entry {entry_id!r} is stored out of the batch's order"
    return ""

def lines_after(lines: Sequence[bytes], entry_id: str | None, session_id: str,
                where: str, decode: Callable[[bytes], list[Entry]]) -> list[Entry]:
    """Decode (with ``decode``) the lines after the one holding ``entry_id`` (all for ``None``).

    Walks back from the end, so the cost is that of the new lines only. A
    line may hold several entries (the file store's ``batch`` lines).
    """
    out: list[Entry] = []
    for line in reversed(lines):
        entries = decode(line)
        for n in range(len(entries) - 1, -1, -1):
            if entries[n].id == entry_id:
                out.extend(reversed(entries[n + 1:]))
                out.reverse()
                return out
        out.extend(reversed(entries))
    if entry_id is not None:
        raise entry_not_found(session_id, entry_id, where)
    out.reverse()
    return out
