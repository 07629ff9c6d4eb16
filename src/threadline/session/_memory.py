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
from collections.abc import Sequence

from threadline.errors import SessionExists, SessionNotFound, StoreError
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._store import EntryLog, SessionPage
from threadline.session._storekit import check_record, check_session_id, page_records

__all__ = ["MemoryStore"]


class MemoryStore:
    """Sessions that live as long as the object. Useful for tests and demos."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, SessionRecord] = {}
        self._logs: dict[str, list[bytes]] = {}
        self._ids: dict[str, set[str]] = {}

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        with self._lock:
            if record.id in self._records:
                raise SessionExists(record.id, "memory store")
            self._records[record.id] = record
            self._logs[record.id] = []
            self._ids[record.id] = set()

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
        check_session_id(session_id)
        lines = [encode_entry(entry, session_id=session_id) for entry in entries]
        new_ids = {entry.id for entry in entries}
        with self._lock:
            log = self._logs.get(session_id)
            if log is None:
                raise SessionNotFound(session_id, "memory store")
            ids = self._ids[session_id]
            if len(new_ids) < len(entries) or not ids.isdisjoint(new_ids):
                raise StoreError(
                    f"memory store: append to session {session_id!r} repeats an entry id "
                    f"already in the session; nothing was appended", session_id=session_id)
            log.extend(lines)
            ids |= new_ids

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
