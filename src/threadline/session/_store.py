"""The Store contract (S7), written once: on ``Store`` and in docs/writing-a-store.md.

``threadline.testing.StoreConformance`` checks every rule stated here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeAlias, runtime_checkable

import msgspec

from threadline.errors import ConfigError, CorruptLog, EntryNotFound
from threadline.session._entries import Entry, OpaqueEntry, SessionRecord

__all__ = [
    "AppendChecked",
    "CatalogStore",
    "CheckedAppend",
    "EntryLog",
    "LinearStore",
    "SessionPage",
    "Store",
    "WatchableStore",
    "chain_after",
    "checked_append",
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
    """Where sessions live: three async methods, nothing else required (S7).

    Sessions. ``create_session`` registers a ``SessionRecord`` once; its
    ``id``, ``parent_id`` and ``created_at`` (to the microsecond) are kept
    unchanged. Creating an id that exists raises ``SessionExists``, even
    with an identical record.

    Session ids. Every method refuses an id that breaks the one session-id
    rule (a non-empty ``str`` of valid Unicode, no NUL, at most 1,024 UTF-8
    bytes) with ``InvalidSessionId`` before touching storage. A store gives
    the id no other meaning.

    Errors. Every error is a ``StoreError`` naming the session in
    ``session_id``. ``SessionNotFound.session_id`` is the id that was asked
    for. Stored data that cannot be decoded raises ``CorruptLog`` naming
    where it lies; data written by a newer format version is refused the
    same way, with a message saying to upgrade.

    Appends. ``append_entries`` is all or nothing, whatever the batch size
    and even if the writer is killed mid-call (S14): when it returns every
    entry is durable; when it raises none was stored, and no reader on any
    handle ever sees part of a batch. Each entry is checked before any is
    written (``encode_entry``): one that could not load back exactly as
    given is refused with ``InvalidEntry`` (S16). An empty batch
    still requires the session (``SessionNotFound``). Entry ids are unique
    in a session, under one rule: a batch whose entries are all already
    stored, byte for byte and in the same order, is an acknowledged retry,
    so the call succeeds and stores nothing; any other batch that repeats a
    stored entry id (or holds one twice) is refused whole with
    ``StoreError`` (or a subclass) and nothing is stored. So
    retrying an append whose outcome is unknown stores it exactly once
    (S25). A store does not check that an entry's parent exists (the
    tree index treats such an entry as a root); it stores what it is given
    and loads it back byte for byte, lines other programs wrote included
    (S15).

    Loads. ``load_entries`` returns every entry in append order as a list
    (the built-in stores return an ``EntryLog``, a list with
    ``diagnostics``). Every handle on the same storage sees an append as
    soon as it was acknowledged: no handle may serve a stale copy, and two
    handles appending after the same leaf grow sibling branches (S4).

    Durable means: a local store has the data on stable storage (fsync)
    when the call returns; a network store has it committed by the server,
    so it survives the client's crash and the server's restart. When the
    connection is lost after the commit was sent, the outcome is unknown:
    the store raises ``StoreError`` (the built-in ones ``StoreUnavailable``)
    and the caller reloads, or sends the same batch again, which the
    repeated-id rule makes safe. After a ``DurabilityError`` a
    handle refuses every later create, append and delete.

    ``close()``, when a store has it, may be called more than once; after
    it a call either works or raises ``StoreError``.
    """

    async def create_session(self, record: SessionRecord) -> None:
        """Register a new session. Raises ``SessionExists`` if the id is taken."""
        ...

    async def load_entries(self, session_id: str) -> list[Entry]:
        """All entries in append order. Raises ``SessionNotFound``."""
        ...

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        """Durably append, all or nothing. Raises ``SessionNotFound``."""
        ...


class CheckedAppend(Protocol):
    """Not part of the contract (S7): an append the durable agent has already checked.

    Every append checks each entry by encoding it and decoding the line back
    (S16). The durable agent needs that decoded entry too, as the copy it
    holds (S40), so with a store that has ``_append_checked`` it makes the
    check itself, once, and hands over both: ``lines[i]`` is the line the
    codec's check gave for ``entries[i]``, and ``entries[i]`` the entry it
    decoded from it. Everything else is ``append_entries``'s: all or nothing,
    the repeated-id rule, durability, the errors. Returns None once the
    entries are stored, or an awaitable to wait on for that (a store that
    stores in memory needs no coroutine per message). A custom store needs
    none of this: the agent then copies and appends as for any store.
    """

    def _append_checked(self, session_id: str, entries: Sequence[Entry],
                        lines: Sequence[bytes]) -> Awaitable[None] | None: ...


AppendChecked: TypeAlias = Callable[
    [Any, str, Sequence[Entry], Sequence[bytes]], Awaitable[None] | None]


def checked_append(store: object) -> AppendChecked | None:
    """The store class's ``_append_checked`` (unbound), if it may stand in for its append.

    Only when the class that gives the store its ``append_entries`` defines
    ``_append_checked`` too: a subclass that overrides ``append_entries``
    (to count, log or refuse appends) is called through it. Looked up on the
    class, so a wrapper that passes unknown attributes on to the store it
    wraps is not bypassed either.
    """
    for cls in type(store).__mro__:
        defined = vars(cls)
        if "append_entries" in defined:
            method = defined.get("_append_checked")
            return method if callable(method) else None
    return None


class SessionPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of ``list_sessions``: newest first; pass ``next_cursor`` for more.

    ``problems`` names what the store found in place of a session and could
    not read (a file that is not a session log, for example), one
    ``CorruptLog`` each, with its ``path``. They never hide the good
    sessions. A store reports them on the first page (no cursor).
    """

    sessions: list[SessionRecord]
    next_cursor: str | None = None
    problems: list[CorruptLog] = msgspec.field(default_factory=list)


@runtime_checkable
class CatalogStore(Store, Protocol):
    """A ``Store`` that also keeps a catalog of its sessions: read one record,
    list them page by page, delete one. Every built-in store is one.
    """

    async def load_session(self, session_id: str) -> SessionRecord:
        """The record (existence and lineage). Raises ``SessionNotFound``."""
        ...

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        """Sessions ordered newest first by ``created_at``, then ``id`` descending.

        Each record equals what ``load_session`` returns. ``limit`` is an
        integer of at least 1 and ``cursor`` a ``next_cursor`` of an earlier
        page of this store; anything else raises ``ConfigError``. Pages are
        keyset pages: a session created between two calls does not shift the
        later pages. A listing never returns a deleted session and never
        misses one that any handle created before the call.
        """
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

    Repeats follow S25, adapted to the re-chaining: a batch whose entry ids
    are all stored already, as one run, with the batch's own bytes apart from
    the parent of its first entry, is a retry whose acknowledgement was lost;
    the call succeeds, stores nothing and returns the batch as it was stored.
    Any other batch repeating a stored id, or holding one id twice, is refused
    whole with ``StoreError``. So the durable agent retries ``append_linear``
    after ``StoreUnavailable`` as it retries ``append_entries``.
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
    """The position ``encode_cursor`` wrote. Raises ``ConfigError`` for anything else."""
    if not isinstance(cursor, str):
        raise ConfigError(f"a list_sessions cursor is a string, got {type(cursor).__name__}")
    try:
        c = msgspec.json.decode(bytes.fromhex(cursor), type=_Cursor)
    except (ValueError, msgspec.DecodeError) as exc:
        raise ConfigError(f"not a list_sessions cursor: {cursor[:80]!r}") from exc
    return c.created_at, c.id


@runtime_checkable
class WatchableStore(Store, Protocol):
    """A store that can follow a session as other tasks and processes append (S26).

    Optional, like listing; every built-in store offers it.
    """

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """The entries appended after entry ``after`` (None: from the first), then new ones.

        Entries come in append order, each exactly once, and the iterator
        waits for more until the caller stops iterating (``break`` or
        ``aclose()``). A store error ends the iteration (``StoreUnavailable``
        while the server is down); to pick up after it or any disconnect,
        watch again with the id of the last entry received. Raises
        ``SessionNotFound``, or ``StoreError`` when ``after`` is not an entry
        of the session.
        """
        ...
