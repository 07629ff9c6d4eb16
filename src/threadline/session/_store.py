"""The Store contract (S7).

A store needs exactly three async methods. ``create_session`` registers a
session's existence and lineage once; ``load_entries`` and ``append_entries``
manage its append-only log. Entries come back in append order; the tree is
rebuilt from parent pointers, and the leaf after loading is the last entry.

Entry ids are unique within a session. An append that repeats an id already
in the session, or repeats one within itself, may be refused with
``StoreError``, appending nothing: the memory, SQLite and PostgreSQL stores
refuse it. A store that cannot check without reading its whole log may append
it (the file store does); readers then keep the first entry with that id
(``TreeIndex`` counts the repeats in ``duplicates``).

The built-in stores add ``load_session``, ``list_sessions`` and
``delete_session`` (see ``ManagedStore``); a custom store need not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

from threadline.errors import EntryNotFound
from threadline.session._entries import Entry, OpaqueEntry, SessionRecord

__all__ = [
    "EntryLog",
    "LinearStore",
    "ManagedStore",
    "SessionPage",
    "Store",
    "chain_after",
    "decode_cursor",
    "encode_cursor",
]


class EntryLog(list[Entry]):
    """The entries of one session in append order, plus what the load noticed.

    ``diagnostics`` lists problems the store recovered from without losing an
    acknowledged entry (a torn last line left by a crash mid-append, for
    example). It is empty for a clean log.
    """

    __slots__ = ("diagnostics",)

    def __init__(self, entries: Iterable[Entry] = (), diagnostics: Sequence[str] = ()) -> None:
        super().__init__(entries)
        self.diagnostics: list[str] = list(diagnostics)


@runtime_checkable
class Store(Protocol):
    async def create_session(self, record: SessionRecord) -> None:
        """Register a new session. Raises ``SessionExists`` if the id is taken."""
        ...

    async def load_entries(self, session_id: str) -> list[Entry]:
        """All entries in append order. Raises ``SessionNotFound``."""
        ...

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        """Durably append, all or nothing. Raises ``SessionNotFound``."""
        ...


class SessionPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of ``list_sessions``: newest first; pass ``next_cursor`` for more."""

    sessions: list[SessionRecord]
    next_cursor: str | None = None


@runtime_checkable
class ManagedStore(Store, Protocol):
    """What the built-in stores offer beyond the contract."""

    async def load_session(self, session_id: str) -> SessionRecord:
        """The record (existence and lineage). Raises ``SessionNotFound``."""
        ...

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        """Sessions ordered newest first by ``created_at``, then ``id`` descending."""
        ...

    async def delete_session(self, session_id: str) -> None:
        """Remove the record and its log. Raises ``SessionNotFound``."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LinearStore(Store, Protocol):
    """An optional capability: several writers, one linear history (S32).

    ``append_entries`` keeps the parents it is given, so two writers that
    loaded the same leaf grow sibling branches (S4). ``append_linear`` instead
    chains the batch after whatever entry is last in the log when the write
    happens: the check and the write are one atomic step (under the file lock,
    in the transaction), so concurrent batches from any number of processes
    land one after another on a single path.
    """

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        """Append ``entries`` (already chained among themselves) after the log's
        last entry; return them as stored, the first re-parented. Raises
        ``SessionNotFound``."""
        ...

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        """The entries appended after ``entry_id`` (all of them for ``None``), in
        append order. Raises ``EntryNotFound`` if ``entry_id`` is not in the log."""
        ...


def chain_after(entries: Sequence[Entry], parent_id: str | None) -> list[Entry]:
    """``entries`` with the first one re-parented onto ``parent_id``."""
    if not entries or entries[0].parent_id == parent_id:
        return list(entries)
    first = entries[0]
    if isinstance(first, OpaqueEntry):
        obj = msgspec.json.decode(first.raw)
        obj["parent_id"] = parent_id
        moved: Entry = OpaqueEntry(type=first.type, id=first.id, parent_id=parent_id,
                                   timestamp=first.timestamp, raw=msgspec.json.encode(obj))
    else:
        moved = msgspec.structs.replace(first, parent_id=parent_id)
    return [moved, *entries[1:]]


def entry_not_found(session_id: str, entry_id: str, where: str) -> EntryNotFound:
    return EntryNotFound(f"{where}: entry {entry_id!r} is not in session {session_id!r}")


class _Cursor(msgspec.Struct, array_like=True):
    created_at: datetime
    id: str


def encode_cursor(record: SessionRecord) -> str:
    """An opaque keyset cursor positioned after ``record``."""
    return msgspec.json.encode(_Cursor(record.created_at, record.id)).hex()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    from threadline.errors import ConfigError

    try:
        c = msgspec.json.decode(bytes.fromhex(cursor), type=_Cursor)
    except (ValueError, msgspec.DecodeError) as exc:
        raise ConfigError(f"not a list_sessions cursor: {cursor!r}") from exc
    return c.created_at, c.id
