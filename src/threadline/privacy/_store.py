"""``EncryptedStore``: envelope encryption at rest, as a layer over any Store.

Every entry is sealed before the store beneath sees it and opened after it
gives it back; the store keeps sealed entries like any others, so it needs
no change. The layer offers exactly the optional capabilities the store
beneath has (listing, linear appends, watch, blobs), each
sealing and opening on the way through.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from threadline.ai._messages import BlobPart
from threadline.errors import (
    BlobNotFound,
    ConfigError,
    KeyUnavailable,
    MalformedEnvelope,
    PlaintextEntry,
    SessionNotFound,
)
from threadline.privacy._envelope import (
    DataKey,
    blob_key,
    blob_version,
    envelope_version,
    open_blob,
    open_entry,
    seal_blob,
    seal_entry,
)
from threadline.privacy._keyring import ERASED, KeyErasure, Keyring
from threadline.session._codec import check_entry, compact_checked
from threadline.session._entries import Entry, ErasedEntry, SealedEntry, SessionRecord
from threadline.stores._blobs import blob_parts
from threadline.stores._contract import (
    BlobInfo,
    BlobStore,
    Choose,
    Cut,
    EntryLog,
    SearchHit,
    SessionPage,
    Store,
    chain_after,
)
from threadline.stores._rules import check_blob_key, check_entries, check_record, check_session_id
from threadline.stores._search import check_search, scan_search

__all__ = ["EncryptedStore", "Subject"]

Subject = str | Callable[[SessionRecord], "str | None"] | None
"""Whose data a new session holds: a name, a function of its record, or None for its own id."""

# Methods a store may have beyond the three of the protocol, which the layer
# offers when the store beneath has them (and only then, so isinstance checks
# against CatalogStore, LinearStore and WatchableStore tell the truth).
_BLOB_METHODS = ("put_blob", "get_blob", "has_blobs", "touch_blobs", "list_blobs",
                 "delete_blobs", "put_session_blob", "get_session_blob", "session_blob_keys")
_FAR = datetime(9999, 1, 1, tzinfo=UTC)

_OPTIONAL = ("load_session", "list_sessions", "delete_session", "append_linear",
             "load_entries_after", "watch", "prune_session", "put_blob", "search")


class EncryptedStore:
    """Wraps ``inner`` so that what it stores is sealed under ``keys``.

    ``subject`` names whose data a new session holds, so that
    ``erase_subject`` can erase it: a string (one user or tenant per store
    handle), a function of the new session's record returning one (None for
    the default), or None: the session's own id. A fork always takes its
    source session's key, so erasing a subject reaches its forks. A session
    keeps the key it was first given in the keyring, in every store holding
    a copy of it.

    Reading fails closed. An entry that is not sealed raises
    ``PlaintextEntry``, unless ``plaintext="read"`` (migration mode: such
    entries load as they are, and ``migrate_session`` rewrites them sealed).
    An entry whose key is missing or cannot be unwrapped raises
    ``KeyUnavailable``, unless ``locked="placeholder"`` (for tools that show
    what is readable): it then loads as its ``SealedEntry``. An entry of an
    erased subject loads as an ``ErasedEntry``. An entry whose envelope is
    damaged loads as its ``SealedEntry`` with a line in the load's
    ``diagnostics``; ``unseal`` raises the ``MalformedEnvelope`` for it.
    Nothing read is ever deleted or rewritten.

    ``deflate=False`` stores the content without compressing it first (see
    docs/privacy.md on what the length of a ciphertext says).

    Search (docs/search.md). The store beneath indexes what it is given,
    and a sealed entry gives it nothing: with ``searching="index"`` (the
    default) ``search`` is the store beneath's, and finds no sealed entry.
    ``searching="decrypt"`` opts in to finding them by opening every session
    at search time and matching in memory: still nothing of a sealed entry
    is written to any index, and an erased subject is never found.
    """

    def __new__(cls, inner: Store, keys: Keyring, **options: Any) -> EncryptedStore:
        present = frozenset(n for n in _OPTIONAL if callable(getattr(inner, n, None)))
        if options.get("searching") == "decrypt" and "list_sessions" in present:
            present |= {"search"}  # S65: searched by opening, never indexed
        return super().__new__(_with(present))

    def __init__(self, inner: Store, keys: Keyring, *, subject: Subject = None,
                 plaintext: Literal["refuse", "read"] = "refuse",
                 locked: Literal["raise", "placeholder"] = "raise",
                 deflate: bool = True,
                 searching: Literal["index", "decrypt"] = "index") -> None:
        if searching not in ("index", "decrypt"):
            raise ConfigError(f"EncryptedStore searching must be 'index' or 'decrypt', got "
                              f"{searching!r}")
        self.inner = inner
        """The store beneath: it holds the sealed entries."""
        self.keys = keys
        self.subject = subject
        self.plaintext = plaintext
        self.locked = locked
        self.deflate = deflate
        self.searching = searching
        self._bound: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"EncryptedStore({self.inner!r}, {self.keys!r})"

    # -- whose key a session is sealed with ------------------------------------------------

    async def _subject_key(self, record: SessionRecord) -> str:
        if record.parent_id is not None:
            # A fork holds its source's content: the source's key, so erasing
            # the source's subject reaches the fork.
            parent = await self.keys.session_key(record.parent_id)
            if parent is not None:
                return parent
            return await self._subject_key(SessionRecord(id=record.parent_id))
        subject = self.subject(record) if callable(self.subject) else self.subject
        return await self.keys.key_id(record.id if subject is None else subject)

    async def _session_key(self, session_id: str) -> str:
        key_id = self._bound.get(session_id)
        if key_id is None:
            key_id = await self.keys.session_key(session_id)
            if key_id is None:
                # A session the keyring never saw (written before encryption,
                # or by another program): it gets its key now.
                load_session = getattr(self.inner, "load_session", None)
                record = (await load_session(session_id) if load_session is not None
                          else SessionRecord(id=session_id))
                key_id = await self.keys.bind_session(session_id,
                                                      await self._subject_key(record))
            self._bound[session_id] = key_id
        return key_id

    # -- the Store protocol ---------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        key_id = await self.keys.bind_session(record.id, await self._subject_key(record))
        await self.keys.writing_key(key_id)  # the key exists before the session does
        await self.inner.create_session(record)
        self._bound[record.id] = key_id

    async def load_entries(self, session_id: str) -> EntryLog:
        check_session_id(session_id)
        return await self._open(session_id, await self.inner.load_entries(session_id))

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_entries")
        await self.inner.append_entries(session_id, await self._seal(session_id, entries))

    async def close(self) -> None:
        """Close the store beneath (when it has ``close``)."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> EncryptedStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sealing and opening ---------------------------------------------------------------

    async def _seal(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        # Every entry is checked before a key is fetched or anything is
        # written, so a bad entry leaves the store and the keyring as they were.
        checked = await _cpu(len(entries), _check, session_id, entries)
        if all(c is None for c in checked):
            return list(entries)
        key = await self.keys.writing_key(await self._session_key(session_id))
        return await _cpu(len(entries), self._sealed, session_id, entries, checked, key)

    def _sealed(self, session_id: str, entries: Sequence[Entry],
                checked: list[tuple[Entry, bytes] | None], key: DataKey) -> list[Entry]:
        return [entry if c is None else seal_entry(c[0], c[1], compact_checked(c[0], c[1]),
                                                   session_id, key, deflate=self.deflate)
                for entry, c in zip(entries, checked, strict=True)]

    async def _open(self, session_id: str, log: Iterable[Entry]) -> EntryLog:
        stored = list(log)
        versions = await _cpu(len(stored), _versions, session_id, stored)
        wanted = {(stored[n].key, v) for n, v in versions.items()  # type: ignore[union-attr]
                  if isinstance(v, int)}
        keys = await self.keys.reading_keys(wanted) if wanted else {}
        return await _cpu(len(stored), self._opened, session_id, stored, versions, keys,
                          list(getattr(log, "diagnostics", ())))

    def _opened(self, session_id: str, stored: list[Entry],
                versions: dict[int, int | MalformedEnvelope],
                keys: Mapping[tuple[str, int], object], diagnostics: list[str]) -> EntryLog:
        if len(versions) == len(stored) and len(keys) == 1:
            (key,) = keys.values()
            if isinstance(key, DataKey) and all(type(v) is int for v in versions.values()):
                # The usual session: every entry sealed with one key at hand.
                try:
                    return EntryLog([open_entry(e, session_id, key)  # type: ignore[arg-type]
                                     for e in stored], diagnostics)
                except MalformedEnvelope:
                    pass  # a damaged entry: the way below reports it and opens the rest
        opening = _Opening(self, session_id, keys, diagnostics)
        out = EntryLog(opening.one(entry, versions.get(n)) for n, entry in enumerate(stored))
        if opening.locked:
            diagnostics.append(f"session {session_id!r}: {_entries(opening.locked)} locked "
                               f"(no key to open them): their content is not shown")
        if opening.plain:
            diagnostics.append(f"session {session_id!r}: {_entries(opening.plain)} not "
                               f"sealed (read in migration mode)")
        out.diagnostics = diagnostics
        return out

    async def unseal(self, session_id: str, entry: SealedEntry) -> Entry:
        """Open one sealed entry of ``session_id``, or raise why it cannot be opened.

        The typed error for a placeholder a load returned: ``MalformedEnvelope``
        or ``KeyUnavailable``, naming the session and entry. An erased entry
        opens as its ``ErasedEntry``.
        """
        check_session_id(session_id)
        version = envelope_version(entry, session_id)
        key = (await self.keys.reading_keys({(entry.key, version)}))[(entry.key, version)]
        if isinstance(key, KeyUnavailable):
            raise KeyUnavailable(str(key), session_id=session_id, entry_id=entry.id) from key
        if not isinstance(key, DataKey):
            return _erased(entry)
        return open_entry(entry, session_id, key)

    # -- erasure ---------------------------------------------------------------------------

    async def erase_subject(self, subject: str) -> KeyErasure:
        """Destroy ``subject``'s data keys: its entries load as ``ErasedEntry`` from now on.

        That holds for every session sealed with them (forks included), in
        this store and in every copy of it, backups and exports taken while
        encrypted included, as long as no copy of the keyring outlives the
        erasure. Over a store with blobs, the blobs those sessions reference
        are deleted from it too; ``KeyErasure.blobs`` counts them.
        """
        if not isinstance(self.inner, BlobStore):
            return await self.keys.erase_subject(subject)
        # Named while the keys that compute the names still exist.
        doomed = await subject_blob_keys(self, await self.keys.key_id(subject))
        erasure = await self.keys.erase_subject(subject)
        return dataclasses.replace(erasure, blobs=await delete_all(self, doomed))

    if TYPE_CHECKING:
        # Present when the store beneath has them (see _OPTIONAL).
        async def load_session(self, session_id: str) -> SessionRecord: ...
        async def list_sessions(self, *, limit: int = 100, cursor: str | None = None,
                                **filters: Any) -> SessionPage: ...
        async def delete_session(self, session_id: str) -> None: ...
        async def append_linear(self, session_id: str,
                                entries: Sequence[Entry]) -> list[Entry]: ...
        async def load_entries_after(self, session_id: str,
                                     entry_id: str | None) -> list[Entry]: ...
        def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]: ...
        async def prune_session(self, session_id: str, choose: Choose, *,
                                batch: int = 1000) -> Cut: ...
        async def put_blob(self, key: str, data: bytes) -> None: ...
        async def get_blob(self, key: str) -> bytes: ...
        async def has_blobs(self, keys: Sequence[str]) -> set[str]: ...
        async def touch_blobs(self, keys: Sequence[str]) -> set[str]: ...
        async def list_blobs(self) -> list[BlobInfo]: ...
        async def delete_blobs(self, keys: Sequence[str], *,
                               older_than: datetime) -> list[str]: ...
        async def put_session_blob(self, session_id: str, part: BlobPart,
                                   data: bytes) -> None: ...
        async def get_session_blob(self, session_id: str, part: BlobPart) -> bytes: ...
        async def session_blob_keys(self, session_id: str,
                                    parts: Sequence[BlobPart]) -> dict[str, list[str]]: ...
        async def search(self, query: str, *, owner: str | None = None,
                         tenant: str | None = None, active_path: bool = False,
                         limit: int = 20) -> list[SearchHit]: ...


class _Optional(EncryptedStore):
    """The optional methods, of which ``_with`` takes those the store beneath has."""

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self.inner.load_session(session_id)  # type: ignore[attr-defined, no-any-return]

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None,
                            **filters: Any) -> SessionPage:
        """The listing of the store beneath (``owner``, ``tenant``, ``labels``, ``order``
        passed on). Metadata entries are sealed like every entry, so the store
        beneath lists no metadata for them (docs/privacy.md)."""
        return await self.inner.list_sessions(  # type: ignore[attr-defined, no-any-return]
            limit=limit, cursor=cursor, **filters)

    async def delete_session(self, session_id: str) -> None:
        """Delete the session from the store beneath; its key stays in the keyring."""
        await self.inner.delete_session(session_id)  # type: ignore[attr-defined]

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_linear")
        sealed = await self._seal(session_id, entries)
        stored: list[Entry] = await self.inner.append_linear(  # type: ignore[attr-defined]
            session_id, sealed)
        if not stored:
            return []
        opened = [e if isinstance(e, (SealedEntry, ErasedEntry)) else check_entry(e, session_id)[1]
                  for e in entries]
        return chain_after(opened, stored[0].parent_id)

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        check_session_id(session_id)
        stored = await self.inner.load_entries_after(  # type: ignore[attr-defined]
            session_id, entry_id)
        return await self._open(session_id, stored)

    async def prune_session(self, session_id: str, choose: Choose, *,
                            batch: int = 1000) -> Cut:
        """Prune through the store beneath; ``choose`` sees compactions opened.

        Retention needs only what stays in plaintext (ids, parents, times,
        types) and which entry a compaction keeps, which is sealed. The keys
        that open the session's compactions are fetched first, since
        ``choose`` runs under the lock of the store beneath and cannot wait
        for a key provider; a compaction that does not open (erased, locked,
        damaged, or sealed with a key fetched too late) stays sealed, and
        nothing is folded into it.
        """
        check_session_id(session_id)
        stored = await self.inner.load_entries(session_id)
        wanted: set[tuple[str, int]] = set()
        for entry in stored:
            if type(entry) is SealedEntry and entry.of == "compaction":
                with contextlib.suppress(MalformedEnvelope):
                    wanted.add((entry.key, envelope_version(entry, session_id)))
        keys = await self.keys.reading_keys(wanted) if wanted else {}

        def opened(record: SessionRecord, entries: Sequence[Entry]) -> Cut:
            out: list[Entry] = []
            for entry in entries:
                if type(entry) is SealedEntry and entry.of == "compaction":
                    with contextlib.suppress(MalformedEnvelope):
                        key = keys.get((entry.key, envelope_version(entry, session_id)))
                        if isinstance(key, DataKey):
                            out.append(open_entry(entry, session_id, key))
                            continue
                out.append(entry)
            return choose(record, out)

        cut: Cut = await self.inner.prune_session(  # type: ignore[attr-defined]
            session_id, opened, batch=batch)
        return cut

    async def search(self, query: str, *, owner: str | None = None, tenant: str | None = None,
                     active_path: bool = False, limit: int = 20) -> list[SearchHit]:
        """``SearchableStore.search``: see ``searching`` in the class's docstring."""
        if self.searching == "index":
            return await self.inner.search(  # type: ignore[attr-defined, no-any-return]
                query, owner=owner, tenant=tenant, active_path=active_path, limit=limit)
        q = check_search(query, owner, tenant, limit, active_path)
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.list_sessions(limit=1000, cursor=cursor)
            ids += [r.id for r in page.sessions]
            if (cursor := page.next_cursor) is None:
                break
        opened: list[tuple[str, Sequence[Entry]]] = []
        for sid in ids:
            try:
                opened.append((sid, await self.load_entries(sid)))
            except SessionNotFound:
                continue  # deleted since the listing
        return scan_search(opened, q)

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        # Called now, so a bad argument raises here as it would on the store beneath.
        source: AsyncIterator[Entry] = self.inner.watch(  # type: ignore[attr-defined]
            session_id, after)
        return self._follow(session_id, source)

    # -- blobs (S59) ------------------------------------------------------------
    # A blob of a session is sealed (AES-256-GCM) with the data key of the
    # session's subject and stored in the store beneath under ``blob_key``: an
    # HMAC of its SHA-256 under a key derived from that data key. So one subject's
    # same file is stored once, two subjects never share a stored blob (which
    # would tell one that the other holds the file), and neither the name nor the
    # bytes say anything about the content without the key. The additional data
    # binds the ciphertext to its storage key and media type: bytes moved to
    # another key do not open.
    #
    # A new key version (rotation, or writing after an erasure) starts a new set
    # of names; reads and garbage collection try every version the keyring holds.
    # The plain ``BlobStore`` methods pass sealed bytes through, which is what
    # garbage collection and copies of sealed stores need; ``put_blob`` refuses
    # bytes that are not a sealed blob, so nothing reaches the store in the clear.

    async def put_blob(self, key: str, data: bytes) -> None:
        """Store bytes that are sealed already (a copy between sealed stores)."""
        check_blob_key(key)
        if not key.startswith("s"):
            raise PlaintextEntry(f"blob {key!r}: an encrypted store keeps sealed blobs only; "
                                 f"attach the plaintext with stores.attach")
        blob_version(bytes(data), key)  # MalformedEnvelope for what is not a sealed blob
        await _inner(self).put_blob(key, data)

    async def get_blob(self, key: str) -> bytes:
        """The sealed bytes under ``key`` (``stores.open_blob`` opens them)."""
        return await _inner(self).get_blob(key)

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        return await _inner(self).has_blobs(keys)

    async def touch_blobs(self, keys: Sequence[str]) -> set[str]:
        touch = getattr(self.inner, "touch_blobs", None)
        if touch is None:
            return await _inner(self).has_blobs(keys)  # the store beneath cannot touch
        found: set[str] = await touch(keys)
        return found

    async def list_blobs(self) -> list[BlobInfo]:
        return await _inner(self).list_blobs()

    async def delete_blobs(self, keys: Sequence[str], *,
                           older_than: datetime) -> list[str]:
        return await _inner(self).delete_blobs(keys, older_than=older_than)

    # -- per session: what stores.attach, open_blob and collect_garbage use -------------

    async def put_session_blob(self, session_id: str,
                               part: BlobPart, data: bytes) -> None:
        """Seal ``data`` with the session's subject key and store it under its subject name."""
        check_session_id(session_id)
        key = await self.keys.writing_key(await self._session_key(session_id))
        name = blob_key(key, part.sha256)
        await _inner(self).put_blob(name, seal_blob(key, name, part.media_type, data))

    async def get_session_blob(self, session_id: str,
                               part: BlobPart) -> bytes:
        """The plaintext ``part`` of ``session_id`` references. Raises ``BlobNotFound``."""
        check_session_id(session_id)
        inner = _inner(self)
        names = [blob_key(k, part.sha256)
                 for k in await self.keys.data_keys(await self._session_key(session_id))]
        have = await inner.has_blobs(names) if names else set()
        for name in names:
            if name in have:
                try:
                    stored = await inner.get_blob(name)
                except BlobNotFound:
                    continue  # collected between the look-up and the read
                key_id, version = blob_version(stored, name)
                key = (await self.keys.reading_keys({(key_id, version)}))[(key_id, version)]
                if not isinstance(key, DataKey):
                    break  # erased meanwhile
                return open_blob(key, name, part.media_type, stored)
        if self.plaintext == "read":
            # Migration mode: a session written before encryption keeps its
            # blobs in the clear under their hash until migrate_session.
            with contextlib.suppress(BlobNotFound):
                return await inner.get_blob(part.sha256)
        why = "no key of its subject is left" if not names else "not stored"
        raise BlobNotFound(part.sha256, f"{self!r} ({why})", session_id=session_id)

    async def session_blob_keys(self, session_id: str,
                                parts: Sequence[BlobPart]) -> dict[str, list[str]]:
        """Per hash, the names the session's references may be stored under (every key version)."""
        keys = await self.keys.data_keys(await self._session_key(session_id))
        # In migration mode a reference may still be to a plaintext blob: keep it too.
        plain = self.plaintext == "read"
        return {p.sha256: [blob_key(k, p.sha256) for k in keys] + ([p.sha256] if plain else [])
                for p in parts}

    async def _follow(self, session_id: str, source: AsyncIterator[Entry]) -> AsyncIterator[Entry]:
        try:
            async for entry in source:
                for opened in await self._open(session_id, [entry]):
                    yield opened
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


@dataclass
class _Opening:
    """One load's worth of opening: the keys it found, and what it noticed."""

    store: EncryptedStore
    session_id: str
    keys: Mapping[tuple[str, int], object]
    diagnostics: list[str]
    locked: int = 0
    plain: int = 0

    def one(self, entry: Entry, version: int | MalformedEnvelope | None) -> Entry:
        if type(entry) is ErasedEntry:
            return entry
        if type(entry) is not SealedEntry:
            if self.store.plaintext == "read":
                self.plain += 1
                return entry
            raise PlaintextEntry(
                "is not sealed, and this store requires encryption (to encrypt a store written "
                "before, open it with plaintext='read' and migrate its sessions)",
                session_id=self.session_id, entry_id=entry.id)
        problem = version
        if isinstance(version, int):
            key = self.keys[(entry.key, version)]
            if key is ERASED:
                return _erased(entry)
            if isinstance(key, KeyUnavailable):
                if self.store.locked == "raise":
                    raise KeyUnavailable(str(key), session_id=self.session_id,
                                         entry_id=entry.id) from key
                self.locked += 1
                return entry
            assert isinstance(key, DataKey)
            try:
                return open_entry(entry, self.session_id, key)
            except MalformedEnvelope as exc:
                problem = exc
        self.diagnostics.append(f"{problem} (it loads sealed; the other entries read)")
        return entry


# From this many entries, sealing or opening runs on a worker thread, as the
# stores do their decoding, so that a long session does not stall the event
# loop; for fewer, the hop costs more than the work.
_OFF_LOOP = 256

_T = TypeVar("_T")


async def _cpu(n: int, work: Callable[..., _T], *args: Any) -> _T:
    if n >= _OFF_LOOP:
        return await asyncio.to_thread(work, *args)
    return work(*args)


def _check(session_id: str, entries: Sequence[Entry]) -> list[tuple[Entry, bytes] | None]:
    """Each entry as the store will hold it, with its line; None for one sealed already."""
    checked: list[tuple[Entry, bytes] | None] = []
    for entry in entries:
        if isinstance(entry, (SealedEntry, ErasedEntry)):
            # Sealed already (a copy keeps its envelope, which is bound to the
            # session and entry it was made for), or a stub with nothing to
            # seal. The store beneath checks them.
            checked.append(None)
        else:
            line, back = check_entry(entry, session_id)
            checked.append((back, line))
    return checked


def _versions(session_id: str, stored: list[Entry]) -> dict[int, int | MalformedEnvelope]:
    """Position -> the key version each sealed entry names, or why it names none."""
    versions: dict[int, int | MalformedEnvelope] = {}
    for n, entry in enumerate(stored):
        if type(entry) is SealedEntry:
            try:
                versions[n] = envelope_version(entry, session_id)
            except MalformedEnvelope as exc:
                versions[n] = exc
    return versions


def _erased(entry: SealedEntry) -> ErasedEntry:
    return ErasedEntry(id=entry.id, parent_id=entry.parent_id, timestamp=entry.timestamp,
                       origin_id=entry.origin_id, of=entry.of, kind=entry.kind)


def _entries(n: int) -> str:
    return "1 entry is" if n == 1 else f"{n} entries are"


def _inner(store: EncryptedStore) -> BlobStore:
    inner = store.inner
    assert isinstance(inner, BlobStore)  # the methods are offered only over a BlobStore
    return inner


async def subject_blob_keys(store: EncryptedStore, key_id: str) -> list[str]:
    """The stored names of every blob a session sealed with ``key_id`` references.

    Read before an erasure destroys the keys that compute them. A blob
    attached but never referenced is not found here; it cannot be opened once
    the keys are gone, and garbage collection takes it after its grace.
    """
    keys = await store.keys.data_keys(key_id)
    if not keys:
        return []
    names: set[str] = set()
    for session_id in await store.keys.sessions_of(key_id):
        try:
            entries = await store.load_entries(session_id)
        except SessionNotFound:
            continue  # the keyring knows it; this store does not hold it
        for part in blob_parts(entries):
            names.update(blob_key(k, part.sha256) for k in keys)
    return sorted(names)


async def delete_all(store: EncryptedStore, names: Sequence[str]) -> int:
    """Delete ``names`` however recently touched (an erasure does not wait for a grace)."""
    return len(await _inner(store).delete_blobs(names, older_than=_FAR)) if names else 0


@functools.cache
def _with(present: frozenset[str]) -> type[EncryptedStore]:
    methods = {name: _Optional.__dict__[name] for name in present if name != "put_blob"}
    if "put_blob" in present:
        methods.update((name, _Optional.__dict__[name]) for name in _BLOB_METHODS)
    if "watch" in present:
        methods["_follow"] = _Optional.__dict__["_follow"]
    cls = type("EncryptedStore", (EncryptedStore,), methods)
    cls.__module__ = EncryptedStore.__module__
    cls.__qualname__ = EncryptedStore.__qualname__
    return cls
