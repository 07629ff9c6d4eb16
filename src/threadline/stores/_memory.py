"""An in-process store: records and logs in two separate maps.

Entries are kept as their encoded JSON lines, not as the objects the caller
passed. Entry structs are frozen, but they can hold mutable values (tool call
``arguments``, ``details``, a registered custom class); keeping bytes means no
caller can change stored data after the fact, and a load returns exactly what
every other store would return for the same appends.

One ``threading.Lock`` guards both maps, so the store is safe across asyncio
tasks and threads. No method awaits while holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime

from threadline.errors import BlobNotFound, SessionExists, SessionNotFound
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._metadata import SessionMetadata, fold_metadata, newest_timestamp
from threadline.stores._contract import (
    BlobInfo,
    EntryLog,
    ListOrder,
    SearchHit,
    SessionInfo,
    SessionPage,
    chain_after,
)
from threadline.stores._listing import activity_of, check_listing, page_infos
from threadline.stores._rules import (
    check_blob_key,
    check_blob_keys,
    check_entries,
    check_entry_id,
    check_record,
    check_retried_batch,
    check_session_id,
    from_micros,
    lines_after,
    to_micros,
)
from threadline.stores._search import check_search, scan_search
from threadline.stores._watch import Wakeups, follow, unknown_after

__all__ = ["MemoryStore"]


class MemoryStore:
    """Sessions that live as long as the object. Useful for tests and demos."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, SessionRecord] = {}
        self._logs: dict[str, list[bytes]] = {}
        self._ids: dict[str, dict[str, int]] = {}
        self._catalog: dict[str, tuple[SessionMetadata, datetime | None]] = {}
        """Per session: the metadata and newest entry time so far (S62)."""
        self._wakeups = Wakeups()
        self._blobs: dict[str, tuple[bytes, int]] = {}  # key -> (data, touched in µs)

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        with self._lock:
            if record.id in self._records:
                raise SessionExists(record.id, "memory store")
            self._records[record.id] = record
            self._logs[record.id] = []
            self._ids[record.id] = {}
            self._catalog[record.id] = (SessionMetadata(), None)

    async def load_entries(self, session_id: str) -> EntryLog:
        check_session_id(session_id)
        with self._lock:
            lines = self._logs.get(session_id)
            if lines is None:
                raise SessionNotFound(session_id, "memory store")
            lines = list(lines)
        return EntryLog(decode_entry(line, session_id=session_id) for line in lines)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_entries")
        # Encode before taking the lock: an entry that cannot be stored leaves
        # the log untouched (all or nothing).
        lines = [encode_entry(entry, session_id=session_id) for entry in entries]
        with self._lock:
            log = self._logs.get(session_id)
            if log is None:
                raise SessionNotFound(session_id, "memory store")
            if not _extend(session_id, log, self._ids[session_id], entries, lines):
                return  # S25: this exact batch is already stored
            self._catalogue(session_id, entries)
        self._wakeups.ring(session_id)

    async def load_session(self, session_id: str) -> SessionRecord:
        check_session_id(session_id)
        with self._lock:
            record = self._records.get(session_id)
        if record is None:
            raise SessionNotFound(session_id, "memory store")
        return record

    def _catalogue(self, session_id: str, entries: Sequence[Entry]) -> None:
        """Fold a stored batch into the session's catalog row (under the lock)."""
        meta, newest = self._catalog[session_id]
        ts = newest_timestamp(entries)
        if ts is not None and (newest is None or ts > newest):
            newest = ts
        self._catalog[session_id] = (fold_metadata(entries, meta), newest)

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None, owner: str | None = None,
        tenant: str | None = None, labels: Mapping[str, str] | None = None,
        order: ListOrder = "created",
    ) -> SessionPage:
        after, filters = check_listing(limit, cursor, order, owner=owner, tenant=tenant,
                                       labels=labels)
        with self._lock:
            rows = [(r, *self._catalog[r.id]) for r in self._records.values()]
        infos = [SessionInfo(record=r, metadata=m, last_activity=activity_of(r, n))
                 for r, m, n in rows]
        return page_infos(infos, limit=limit, after=after, filters=filters, order=order)

    async def delete_session(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._lock:
            if self._records.pop(session_id, None) is None:
                raise SessionNotFound(session_id, "memory store")
            del self._logs[session_id]
            del self._ids[session_id]
            del self._catalog[session_id]

    async def search(self, query: str, *, owner: str | None = None, tenant: str | None = None,
                     active_path: bool = False, limit: int = 20) -> list[SearchHit]:
        """Full-text search across sessions (``SearchableStore``), reading every entry."""
        q = check_search(query, owner, tenant, limit, active_path)
        with self._lock:
            logs = {sid: list(log) for sid, log in self._logs.items()}
        return scan_search(((sid, [decode_entry(line) for line in log])
                            for sid, log in logs.items()), q)

    # -- blobs (S57) ---------------------------------------------------------------------

    async def put_blob(self, key: str, data: bytes) -> None:
        check_blob_key(key)
        data = bytes(data)  # a copy: the caller's buffer may change later
        with self._lock:
            have = self._blobs.get(key)
            self._blobs[key] = (data if have is None else have[0], _now_micros())

    async def get_blob(self, key: str) -> bytes:
        check_blob_key(key)
        with self._lock:
            have = self._blobs.get(key)
        if have is None:
            raise BlobNotFound(key, "memory store")
        return have[0]

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        wanted = check_blob_keys(keys)
        with self._lock:
            return {k for k in wanted if k in self._blobs}

    async def touch_blobs(self, keys: Sequence[str]) -> set[str]:
        """Refresh the touched time of those of ``keys`` that are stored; return them."""
        wanted = check_blob_keys(keys)
        now = _now_micros()
        with self._lock:
            found = {k for k in wanted if k in self._blobs}
            for k in found:
                self._blobs[k] = (self._blobs[k][0], now)
        return found

    async def list_blobs(self) -> list[BlobInfo]:
        with self._lock:
            items = list(self._blobs.items())
        return [BlobInfo(key=k, size=len(d), touched_at=from_micros(t)) for k, (d, t) in items]

    async def delete_blobs(self, keys: Sequence[str], *, older_than: datetime) -> list[str]:
        wanted = check_blob_keys(keys)
        cutoff = to_micros(older_than)
        deleted = []
        with self._lock:  # the age check and the delete in one step against put_blob
            for k in dict.fromkeys(wanted):
                have = self._blobs.get(k)
                if have is not None and have[1] < cutoff:
                    del self._blobs[k]
                    deleted.append(k)
        return deleted

    async def close(self) -> None:
        """Nothing to release; the data stays readable until the object is dropped."""

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session; appends in this process wake watchers at once."""
        check_session_id(session_id)
        check_entry_id(after, session_id, "watch")

        async def start() -> int:
            with self._lock:
                ids = self._ids.get(session_id)
                if ids is None:
                    raise SessionNotFound(session_id, "memory store")
                if after is None:
                    return 0
                if after not in ids:
                    raise unknown_after(session_id, after, "memory store")
                return ids[after] + 1

        async def read(position: int) -> tuple[list[Entry], int]:
            with self._lock:
                log = self._logs.get(session_id)
                if log is None:
                    raise SessionNotFound(session_id, "memory store")
                lines = log[position:]
            return ([decode_entry(line, session_id=session_id) for line in lines],
                    position + len(lines))

        return follow(session_id, start, read, self._wakeups, None)
    # -- the linear capability (S32) ------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_linear")
        # Encoded before the lock, as append_entries does: a batch holding what
        # cannot be stored is refused whole. Chaining changes the first entry only.
        lines = [encode_entry(e, session_id=session_id) for e in entries]
        with self._lock:  # the last entry and the append, in one critical section
            log = self._logs.get(session_id)
            if log is None:
                raise SessionNotFound(session_id, "memory store")
            ids = self._ids[session_id]
            if not entries:
                return []
            at = ids.get(entries[0].id)
            # A retry (S25) keeps the parent its first entry was stored with.
            parent = (decode_entry(log[at], session_id=session_id).parent_id if at is not None
                      else decode_entry(log[-1], session_id=session_id).id if log else None)
            chained = chain_after(entries, parent)
            if chained[0] is not entries[0]:
                lines[0] = encode_entry(chained[0], session_id=session_id)
            new_ids = {entry.id for entry in chained}
            if len(new_ids) < len(chained) or not ids.keys().isdisjoint(new_ids):
                stored = {i: (ids[i], log[ids[i]]) for i in new_ids if i in ids}
                check_retried_batch(session_id, [(e.id, line) for e, line in
                                                 zip(chained, lines, strict=True)],
                                    stored, "memory store")
                return chained  # S25: this batch is already stored
            ids.update((entry.id, len(log) + n) for n, entry in enumerate(chained))
            log.extend(lines)
            self._catalogue(session_id, chained)
        self._wakeups.ring(session_id)
        return chained

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        check_session_id(session_id)
        check_entry_id(entry_id, session_id, "load_entries_after")
        with self._lock:
            lines = self._logs.get(session_id)
            if lines is None:
                raise SessionNotFound(session_id, "memory store")
            lines = list(lines)
        return lines_after(lines, entry_id, session_id, "memory store",
                           lambda line: [decode_entry(line, session_id=session_id)])


def _now_micros() -> int:
    return time.time_ns() // 1000


def _extend(session_id: str, log: list[bytes], ids: dict[str, int],
            entries: Sequence[Entry], lines: Sequence[bytes]) -> bool:
    """Add a batch to a log (under the store's lock); False if it is a retry."""
    start = len(log)
    new_ids = {entry.id: start + n for n, entry in enumerate(entries)}
    if len(new_ids) < len(entries) or not ids.keys().isdisjoint(new_ids):
        stored = {i: (ids[i], log[ids[i]]) for i in new_ids if i in ids}
        check_retried_batch(session_id, [(e.id, line) for e, line in
                                         zip(entries, lines, strict=True)],
                            stored, "memory store")
        return False
    ids.update(new_ids)
    log.extend(lines)
    return True
