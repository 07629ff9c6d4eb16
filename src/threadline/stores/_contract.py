"""The Store contract, written once: on ``Store`` and in docs/writing-a-store.md.

``threadline.testing.StoreConformance`` checks every rule stated here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

import msgspec

from threadline.errors import ConfigError, CorruptLog, EntryNotFound
from threadline.session._entries import Entry, OpaqueEntry, SessionRecord
from threadline.session._metadata import SessionMetadata

__all__ = [
    "BlobInfo",
    "BlobStore",
    "CatalogStore",
    "Choose",
    "Cut",
    "EntryLog",
    "LinearStore",
    "ListOrder",
    "PrunableStore",
    "SearchHit",
    "SearchableStore",
    "SessionInfo",
    "SessionPage",
    "Store",
    "WatchableStore",
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
    """Where sessions live: three async methods, nothing else required.

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
    and even if the writer is killed mid-call: when it returns every
    entry is durable; when it raises none was stored, and no reader on any
    handle ever sees part of a batch. Each entry is checked before any is
    written (``encode_entry``): one that could not load back exactly as
    given is refused with ``InvalidEntry``. An empty batch
    still requires the session (``SessionNotFound``). Entry ids are unique
    in a session, under one rule: a batch whose entries are all already
    stored, byte for byte and in the same order, is an acknowledged retry,
    so the call succeeds and stores nothing; any other batch that repeats a
    stored entry id (or holds one twice) is refused whole with
    ``StoreError`` (or a subclass) and nothing is stored. So
    retrying an append whose outcome is unknown stores it exactly once
   . A store does not check that an entry's parent exists (the
    tree index treats such an entry as a root); it stores what it is given
    and loads it back byte for byte, lines other programs wrote included
   .

    Loads. ``load_entries`` returns every entry in append order as a list
    (the built-in stores return an ``EntryLog``, a list with
    ``diagnostics``). Every handle on the same storage sees an append as
    soon as it was acknowledged: no handle may serve a stale copy, and two
    handles appending after the same leaf grow sibling branches.

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


ListOrder = Literal["created", "activity"]
"""How ``list_sessions`` orders: newest ``created_at`` first, or newest ``last_activity``."""


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A listed session: its record (unchanged), its metadata now, its last activity.

    ``last_activity`` is the latest of the record's ``created_at`` and the
    ``timestamp`` of every entry appended to the session.
    """

    record: SessionRecord
    metadata: SessionMetadata = SessionMetadata()
    last_activity: datetime

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def title(self) -> str | None:
        return self.metadata.title


class SessionPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of ``list_sessions``: newest first; pass ``next_cursor`` for more.

    ``sessions`` are the records; ``infos`` the same sessions, in the same
    order, with their metadata and last activity.

    ``problems`` names what the store found in place of a session and could
    not read (a file that is not a session log, for example), one
    ``CorruptLog`` each, with its ``path``. They never hide the good
    sessions. A store reports them on the first page (no cursor).
    """

    sessions: list[SessionRecord]
    next_cursor: str | None = None
    problems: list[CorruptLog] = msgspec.field(default_factory=list)
    infos: list[SessionInfo] = msgspec.field(default_factory=list)


@runtime_checkable
class CatalogStore(Store, Protocol):
    """A ``Store`` that also keeps a catalog of its sessions: read one record,
    list them page by page, delete one. Every built-in store is one.
    """

    async def load_session(self, session_id: str) -> SessionRecord:
        """The record (existence and lineage). Raises ``SessionNotFound``."""
        ...

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None,
        owner: str | None = None, tenant: str | None = None,
        labels: Mapping[str, str] | None = None, order: ListOrder = "created",
    ) -> SessionPage:
        """Sessions ordered newest first by ``created_at`` (or, with
        ``order="activity"``, by ``last_activity``), then ``id`` descending.

        Each record equals what ``load_session`` returns. ``limit`` is an
        integer of at least 1 and ``cursor`` a ``next_cursor`` of an earlier
        page of this store in the same order; anything else raises
        ``ConfigError``. Pages are keyset pages: a session created between
        two calls does not shift the later pages. A listing never returns a
        deleted session and never misses one that any handle created before
        the call.

        ``owner``, ``tenant`` and ``labels`` (every name with exactly that
        value) keep only the sessions whose metadata matches. In
        activity order a session appended to between two pages moves above
        the cursor: the later pages neither repeat it nor shift.
        """
        ...

    async def delete_session(self, session_id: str) -> None:
        """Remove the record and its log. Raises ``SessionNotFound``."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LinearStore(Store, Protocol):
    """An optional capability: several writers, one linear history.

    ``append_entries`` keeps the parents it is given, so two writers that
    loaded the same leaf grow sibling branches. ``append_linear`` instead
    chains the batch after whatever entry is last in the log when the write
    happens: the check and the write are one atomic step (under the file lock,
    in the transaction), so concurrent batches from any number of processes
    land one after another on a single path.

    Repeats follow the repeated-id rule, adapted to the re-chaining: a batch whose entry ids
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
    """The sort time: ``created_at``, or ``last_activity`` in activity order."""
    id: str
    activity: bool = False


def encode_cursor(record: SessionRecord, last_activity: datetime | None = None) -> str:
    """An opaque keyset cursor positioned after ``record`` (in activity order with
    ``last_activity``)."""
    if last_activity is None:
        return msgspec.json.encode(_Cursor(record.created_at, record.id)).hex()
    return msgspec.json.encode(_Cursor(last_activity, record.id, True)).hex()


def decode_cursor(cursor: str, order: ListOrder = "created") -> tuple[datetime, str]:
    """The position ``encode_cursor`` wrote for ``order``. Raises ``ConfigError`` for
    anything else, a cursor of the other order included."""
    if not isinstance(cursor, str):
        raise ConfigError(f"a list_sessions cursor is a string, got {type(cursor).__name__}")
    try:
        c = msgspec.json.decode(bytes.fromhex(cursor), type=_Cursor)
    except (ValueError, msgspec.DecodeError) as exc:
        raise ConfigError(f"not a list_sessions cursor: {cursor[:80]!r}") from exc
    if c.activity != (order == "activity"):
        raise ConfigError(f"this list_sessions cursor is for order="
                          f"{'activity' if c.activity else 'created'}, not {order!r}")
    return c.created_at, c.id


@runtime_checkable
class WatchableStore(Store, Protocol):
    """A store that can follow a session as other tasks and processes append.

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


class Cut(msgspec.Struct, frozen=True, kw_only=True):
    """What to take out of one session: the whole session, or some of its entries.

    ``entries`` are ids, in the order they go: a store that removes them over
    several transactions removes them in that order, so every prefix of the
    list must itself leave the tree whole (the retention planner in
    ``threadline.privacy`` makes sure of that).
    """

    session: bool = False
    entries: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.session or bool(self.entries)


Choose = Callable[[SessionRecord, Sequence[Entry]], Cut]
"""Decides a ``Cut`` from a session's record and its entries as stored, in append order."""


@runtime_checkable
class PrunableStore(Store, Protocol):
    """An optional capability: take entries or a whole session out, safely.

    ``prune_session`` reads the session under the lock its appends take (the
    file lock, the write transaction, the session's row lock), asks
    ``choose`` what to remove from what it read, and removes that before any
    append can come in between. So a decision is never made on a stale read:
    an entry appended meanwhile is either seen by ``choose`` or appended
    after the removal. ``batch`` bounds the entries one transaction removes
    (a SQL store asks ``choose`` again, on a fresh read, for each further
    transaction); a whole session goes in one. Returns what was removed
    (an empty ``Cut`` when nothing was). Raises ``SessionNotFound``.
    """

    async def prune_session(self, session_id: str, choose: Choose, *,
                            batch: int = 1000) -> Cut:
        ...


class BlobInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One stored blob, as ``list_blobs`` reports it."""

    key: str
    size: int
    """Bytes as stored (sealed blobs: the envelope included)."""
    touched_at: datetime
    """When it was last put (aware, UTC); garbage collection spares it for a grace period after."""


@runtime_checkable
class BlobStore(Protocol):
    """An optional capability: bytes kept beside the log under a key.

    Keys are what ``check_blob_key`` accepts (1 to 128 lowercase ASCII letters
    and digits; ``attach`` uses the SHA-256 hex of the bytes, so a store
    deduplicates by content). Every method refuses any other key with
    ``ConfigError`` before touching storage, so a key never names a path.

    ``put_blob`` is durable when it returns (fsync, commit), like an append,
    so an entry appended after it never references bytes a crash can lose.
    Putting a key again stores nothing new but refreshes its ``touched_at``.
    ``delete_blobs`` removes only keys touched before ``older_than``, and a
    put that wins the race with it keeps its blob: the check and the delete
    are one step per key.
    """

    async def put_blob(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` durably; again: refresh its touched time."""
        ...

    async def get_blob(self, key: str) -> bytes:
        """The bytes under ``key``. Raises ``BlobNotFound``."""
        ...

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        """Those of ``keys`` that are stored."""
        ...

    async def list_blobs(self) -> list[BlobInfo]:
        """Every stored blob, in no particular order."""
        ...

    async def delete_blobs(self, keys: Sequence[str], *, older_than: datetime) -> list[str]:
        """Delete those of ``keys`` touched before ``older_than``; return the ones deleted."""
        ...


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    """One entry that ``SearchableStore.search`` found.

    ``snippet`` is plain text from the entry's indexed text around the first
    match (never markup: escape it for the output it goes to). ``rank`` is
    higher for a better match; it compares hits of one search, not of two
    stores.
    """

    session_id: str
    entry_id: str
    snippet: str
    rank: float


@runtime_checkable
class SearchableStore(Store, Protocol):
    """An optional capability: full-text search across sessions.

    What is indexed is ``threadline.stores.indexed_text`` of each entry (user
    and assistant text, tool names, summaries; not tool arguments or results,
    nor sealed entries). An entry is searchable as soon as its append was
    acknowledged, on every handle, and a deleted session is never found: the
    SQL stores update their index in the append's and the delete's own
    transaction, the file store checks its derived index against the logs on
    every search. See docs/search.md.
    """

    async def search(self, query: str, *, owner: str | None = None,
                     tenant: str | None = None, active_path: bool = False,
                     limit: int = 20) -> list[SearchHit]:
        """Entries holding every word of ``query``, best first, at most ``limit``.

        ``owner`` and ``tenant`` keep only sessions with that owner or tenant
        in their metadata; ``active_path`` only entries on the path to each
        session's last entry. A query without words, a ``limit`` outside
        1..1000 or more than 32 words raise ``ConfigError``.
        """
        ...
