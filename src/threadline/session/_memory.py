"""An in-process store (S8): records and logs in two separate maps.

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
from collections.abc import AsyncIterator, Sequence

from threadline.errors import SessionExists, SessionNotFound
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._store import EntryLog, SessionPage, chain_after
from threadline.session._storekit import (
    check_record,
    check_retried_batch,
    check_session_id,
    lines_after,
    page_records,
)
from threadline.session._watch import Wakeups, follow, unknown_after

__all__ = ["MemoryStore"]


class MemoryStore:
    """Sessions that live as long as the object. Useful for tests and demos."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, SessionRecord] = {}
        self._logs: dict[str, list[bytes]] = {}
        self._ids: dict[str, dict[str, int]] = {}
        self._wakeups = Wakeups()

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        with self._lock:
            if record.id in self._records:
                raise SessionExists(record.id, "memory store")
            self._records[record.id] = record
            self._logs[record.id] = []
            self._ids[record.id] = {}

    async def load_entries(self, session_id: str) -> EntryLog:
        check_session_id(session_id)
        with self._lock:
            lines = self._logs.get(session_id)
            if lines is None:
                raise SessionNotFound(session_id, "memory store")
            lines = list(lines)
        return EntryLog(decode_entry(line, session_id=session_id) for line in lines)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        # Encode before taking the lock: an entry that cannot be stored leaves
        # the log untouched (all or nothing).
        if type(session_id) is not str or session_id not in self._records:
            check_session_id(session_id)  # a known session's id was checked when created
        lines = ([encode_entry(entries[0], session_id=session_id)] if len(entries) == 1
                 else [encode_entry(entry, session_id=session_id) for entry in entries])
        self._append_checked(session_id, entries, lines)

    def _append_checked(self, session_id: str, entries: Sequence[Entry],
                        lines: Sequence[bytes]) -> None:
        """``append_entries`` of entries the codec checked (``CheckedAppend``), done at once."""
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost, on every message a run stores
        try:
            log = self._logs.get(session_id)
            if log is None:
                raise SessionNotFound(session_id, "memory store")
            ids = self._ids[session_id]
            if len(lines) == 1 and (entry_id := entries[0].id) not in ids:
                # The usual call (one message), without building an id map.
                ids[entry_id] = len(log)
                log.append(lines[0])
            elif not _extend(session_id, log, ids, entries, lines):
                return  # S25: this exact batch is already stored
        finally:
            lock.release()
        self._wakeups.ring(session_id)

    async def load_session(self, session_id: str) -> SessionRecord:
        check_session_id(session_id)
        with self._lock:
            record = self._records.get(session_id)
        if record is None:
            raise SessionNotFound(session_id, "memory store")
        return record

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        with self._lock:
            records = list(self._records.values())
        return page_records(records, limit=limit, cursor=cursor)

    async def delete_session(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._lock:
            if self._records.pop(session_id, None) is None:
                raise SessionNotFound(session_id, "memory store")
            del self._logs[session_id]
            del self._ids[session_id]

    async def close(self) -> None:
        """Nothing to release; the data stays readable until the object is dropped."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session (S26); appends in this process wake watchers at once."""

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
            lines = [encode_entry(e) for e in chained]
            new_ids = {entry.id for entry in chained}
            if len(new_ids) < len(chained) or not ids.keys().isdisjoint(new_ids):
                stored = {i: (ids[i], log[ids[i]]) for i in new_ids if i in ids}
                check_retried_batch(session_id, [(e.id, line) for e, line in
                                                 zip(chained, lines, strict=True)],
                                    stored, "memory store")
                return chained  # S25: this batch is already stored
            ids.update((entry.id, len(log) + n) for n, entry in enumerate(chained))
            log.extend(lines)
        self._wakeups.ring(session_id)
        return chained

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        check_session_id(session_id)
        with self._lock:
            lines = self._logs.get(session_id)
            if lines is None:
                raise SessionNotFound(session_id, "memory store")
            lines = list(lines)
        return lines_after(lines, entry_id, session_id, "memory store")



def _extend(session_id: str, log: list[bytes], ids: dict[str, int],
            entries: Sequence[Entry], lines: Sequence[bytes]) -> bool:
    """Add a batch to a log (under the store's lock); False if it is a retry (S25)."""
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
