"""The JSON-lines file store: one append-only file per session under a root folder.

Line 1 of a session file is its ``session_init`` record, and every later line
holds what one ``append_entries`` call added (``_format.py``); nothing is ever
rewritten. Appends to one session are written in groups (``stores/_group.py``):
under an exclusive ``flock``, a group's lines go out in one ``write`` and, with
``fsync`` durability, one ``fdatasync``, on a worker thread. Reads take a
shared lock. docs/design.md says what each durability setting promises and
which files the store touches.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import os
import secrets
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from threadline.errors import (
    ConfigError,
    CorruptLog,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import encode_compact
from threadline.session._entries import Entry, SessionRecord
from threadline.stores._contract import (
    BlobInfo,
    Choose,
    Cut,
    EntryLog,
    ListOrder,
    SearchHit,
    SessionPage,
    chain_after,
)
from threadline.stores._group import GroupCommit, Outcome
from threadline.stores._listing import check_listing, page_infos
from threadline.stores._rules import (
    check_blob_key,
    check_blob_keys,
    check_entries,
    check_entry_id,
    check_record,
    check_retried_batch,
    check_session_id,
    tenant_folder,
    to_micros,
)
from threadline.stores._search import check_search
from threadline.stores._watch import Wakeups, follow
from threadline.stores.file._blobs import FileBlobs
from threadline.stores.file._catalog import Catalog, scan
from threadline.stores.file._format import (
    decode_body,
    decode_lines,
    encode_init,
    format_version,
    frame,
    ids_in,
    stored_entries,
)
from threadline.stores.file._names import (
    check_head,
    fdatasync,
    glob_escape,
    open_regular,
    read_head,
    session_file_name,
    write_all,
)
from threadline.stores.file._prune import prune_file
from threadline.stores.file._search import SearchIndex
from threadline.stores.file._search import forget as forget_indexed
from threadline.stores.file._tail import (
    WatchPosition,
    entries_after,
    lines_backwards,
    watch_read,
    watch_start,
)

try:
    import fcntl
except ImportError:  # Windows: no flock, so no file store (the other stores work)
    fcntl = None  # type: ignore[assignment]

__all__ = ["FileStore", "session_file_name"]

Durability = Literal["fsync", "flush"]
_T = TypeVar("_T")

_MAX_INDEXES = 64
"""Sessions whose entry ids a store keeps in memory (about 100 bytes an entry)."""
_TAIL = 32
"""Bytes an index compares to tell that a file still holds what it read."""
_ENCODE_INLINE = 64
"""Appends of up to this many entries are checked on the event loop; bigger ones on a thread."""


class _Append(NamedTuple):
    """One ``append_entries`` call, checked."""

    lines: list[bytes]
    """The entries as ``encode_entry`` gave them: what a retry is compared with."""
    compact: list[bytes]
    """The same entries as a version 3 file holds them."""
    ids: list[str]


class _Index:
    """The entry ids in a session file up to ``size`` (the end of a complete line).

    The repeated-id rule needs them under the lock: read once when the store
    first appends to the file, then only the lines added since. It is kept
    for the file it was read from, as long as that file still holds what it
    was read with: the same device, inode and first line, and the same bytes
    before ``size`` (an append-only file only grows, so a file rewritten in
    place by another program is read again).
    """

    __slots__ = ("body", "dev", "head", "ids", "ino", "size", "tail", "version")

    def __init__(self, st: os.stat_result, head: bytes) -> None:
        self.dev, self.ino = st.st_dev, st.st_ino
        self.head = head
        self.version = format_version(head)
        """The file's format version: a file keeps the one it was created with."""
        self.body = self.size = len(head) + 1
        """Where the entry lines start, and where the ones read so far end."""
        self.tail = (head + b"\n")[-_TAIL:]
        """The bytes just before ``size``."""
        self.ids: set[str] = set()

    def holds(self, fd: int, st: os.stat_result, head: bytes) -> bool:
        return ((st.st_dev, st.st_ino) == (self.dev, self.ino) and head == self.head
                and st.st_size >= self.size
                and os.pread(fd, len(self.tail), self.size - len(self.tail)) == self.tail)

    def catch_up(self, fd: int, size: int) -> None:
        """Learn the ids of the complete lines up to ``size``."""
        if size > self.size:
            data = os.pread(fd, size - self.size, self.size)
            end = data.rfind(b"\n") + 1
            self.ids.update(ids_in(memoryview(data)[:end]))
            self.advance(data[:end])

    def advance(self, lines: bytes) -> None:
        """Count ``lines``, complete lines now stored after ``size``."""
        self.size += len(lines)
        self.tail = (self.tail + lines[-_TAIL:])[-_TAIL:]


class FileStore:
    """Sessions as JSON-lines files under ``root``.

    ``root`` is created if missing, unless ``create=False``: then a missing
    folder is a ``StoreError``, so a reader never leaves an empty store behind.
    ``durability`` is ``"fsync"`` (the default: an acknowledged append is on
    stable storage) or ``"flush"`` (written to the operating system only).

    ``tenant`` confines the store to one tenant's folder,
    ``<root>/tenants/<name>`` (``tenant_folder`` in ``stores/_rules.py``); a
    store without one uses ``root`` and sees no tenant's sessions.

    Safe to share between asyncio tasks, threads and event loops, and between
    processes on one machine (``flock``); not on network file systems whose
    ``flock`` is not shared between machines, nor where there is no ``fcntl``
    (``ConfigError``).
    """

    def __init__(self, root: str | os.PathLike[str], durability: Durability = "fsync",
                 *, create: bool = True, tenant: str | None = None) -> None:
        if fcntl is None:
            raise ConfigError("FileStore needs flock (the fcntl module), which this platform "
                              "lacks; use SQLiteStore or MemoryStore here")
        if durability not in ("fsync", "flush"):
            raise ConfigError(f"durability must be 'fsync' or 'flush', got {durability!r}")
        self.tenant = tenant
        self.root = tenant_folder(root, tenant)
        self.durability: Durability = durability
        self._group: GroupCommit[str, _Append] = GroupCommit(self._write_group,
                                                             label="FileStore")
        self._indexes: dict[str, _Index] = {}
        self._indexes_lock = threading.Lock()
        self._catalog: Catalog | None = None
        self._listing = threading.Lock()  # one listing at a time catches the catalog up
        self._search: SearchIndex | None = None
        self._search_lock = threading.Lock()
        if not create:
            if not self.root.is_dir():
                raise StoreError(f"no file store at {self.root}: the folder does not exist")
        else:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create store directory {self.root}: {exc}") from exc
        # Resolved once: session paths are this directory plus a name with no
        # separator, opened with O_NOFOLLOW, so nothing after the root can
        # lead outside it.
        self._dir = Path(os.path.realpath(self.root))
        self._blobs = FileBlobs(self._dir, durability == "fsync", self._group.poison)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r}, durability={self.durability!r})"

    async def __aenter__(self) -> FileStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def path_for(self, session_id: str) -> Path:
        """Where ``session_id`` lives (whether or not it exists)."""
        return self._dir / session_file_name(session_id)

    # -- the Store contract ---------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        self._group.check_writable(record.id)
        await self._thread("create", record.id, self._create, record)

    async def load_entries(self, session_id: str) -> EntryLog:
        check_session_id(session_id)
        log = await self._thread("load", session_id, self._load, session_id)
        for diagnostic in log.diagnostics:
            warnings.warn(diagnostic, RuntimeWarning, stacklevel=2)
        return log

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_entries")
        self._group.check_writable(session_id)
        if not entries:
            await self.load_session(session_id)  # an empty append still needs the session
            return
        call = await self._checked(session_id, entries)
        await self._group.enqueue(session_id, call, session_id)

    async def _checked(self, session_id: str, entries: Sequence[Entry]) -> _Append:
        """The call's lines, each entry checked (``InvalidEntry``) before anything is written."""
        def encode() -> list[tuple[bytes, bytes]]:
            return [encode_compact(entry, session_id=session_id) for entry in entries]

        pairs = encode() if len(entries) <= _ENCODE_INLINE else await asyncio.to_thread(encode)
        ids = [e.id for e in entries]
        if len(set(ids)) < len(ids):
            raise _repeats(session_id, self.path_for(session_id), "within the batch")
        return _Append([p[0] for p in pairs], [p[1] for p in pairs], ids)

    # -- beyond the contract --------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        check_session_id(session_id)
        return await self._thread("load", session_id, self._load_session, session_id)

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None, owner: str | None = None,
        tenant: str | None = None, labels: Mapping[str, str] | None = None,
        order: ListOrder = "created",
    ) -> SessionPage:
        """A page of sessions, newest first; files that are not sessions go in ``problems``.

        The first call reads the first line of every ``*.jsonl`` in the root;
        later calls reuse it while the root is unchanged (``_catalog.py``).
        Metadata and activity come from the derived catalog, which reads what
        was appended since its last look: every file's, when the listing
        filters or orders by activity; the page's own otherwise.
        """
        after, filters = check_listing(limit, cursor, order, owner=owner, tenant=tenant,
                                       labels=labels)

        def run() -> tuple[SessionPage, list[CorruptLog]]:
            with self._listing:
                return listed()

        def listed() -> tuple[SessionPage, list[CorruptLog]]:
            catalog = self._scan()
            if order == "created" and filters.none:
                # The page is known from the first lines alone: catch up on its files only.
                end = (len(catalog.keys) if after is None else bisect.bisect_left(
                    catalog.keys, (to_micros(after[0]), after[1])))
                start = max(0, end - limit - 1)
            else:
                start, end = 0, len(catalog.listed)
            gone = 0
            infos = []
            for f, name in zip(catalog.listed[start:end], catalog.names[start:end],
                               strict=True):
                if not f.catch_up(os.path.join(self._dir, name)):
                    gone += 1
                elif filters.match(f.meta):
                    infos.append(f.info())
            if gone and start:  # deleted since the scan: the page reaches further back
                infos += [f.info() for f, name in zip(catalog.listed[:start],
                                                      catalog.names[:start], strict=True)
                          if f.catch_up(os.path.join(self._dir, name))]
            return (page_infos(infos, limit=limit, after=after, filters=filters, order=order),
                    catalog.problems)

        page, problems = await self._thread("list", None, run)
        if cursor is None and problems:
            page = msgspec.structs.replace(page, problems=list(problems))
        return page

    async def delete_session(self, session_id: str) -> None:
        check_session_id(session_id)
        self._group.check_writable(session_id)
        await self._thread("delete", session_id, self._delete, session_id)

    # -- blobs, under <root>/blobs (S57) ----------------------------------------------

    async def put_blob(self, key: str, data: bytes) -> None:
        check_blob_key(key)
        self._group.check_writable(None)
        await self._blob_thread("store", key, self._blobs.put, key, data)

    async def get_blob(self, key: str) -> bytes:
        check_blob_key(key)
        return await self._blob_thread("read", key, self._blobs.get, key)

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        return await self._blob_thread("look up", None, self._blobs.has, check_blob_keys(keys))

    async def touch_blobs(self, keys: Sequence[str]) -> set[str]:
        """Refresh the touched time of those of ``keys`` that are stored; return them."""
        wanted = check_blob_keys(keys)
        return await self._blob_thread("touch", None, self._blobs.touch, wanted)

    async def list_blobs(self) -> list[BlobInfo]:
        return await self._blob_thread("list", None, self._blobs.listing)

    async def delete_blobs(self, keys: Sequence[str], *, older_than: datetime) -> list[str]:
        wanted = check_blob_keys(keys)
        self._group.check_writable(None)
        return await self._blob_thread("delete", None, self._blobs.delete, wanted, older_than)

    async def _blob_thread(self, verb: str, key: str | None, fn: Callable[..., _T],
                           *args: Any) -> _T:
        try:
            return await self._group.run(fn, *args)
        except OSError as exc:
            what = "blobs" if key is None else f"blob {key}"
            raise StoreError(f"cannot {verb} {what} in {self._blobs.path}: {exc}") from exc

    async def search(self, query: str, *, owner: str | None = None, tenant: str | None = None,
                     active_path: bool = False, limit: int = 20) -> list[SearchHit]:
        """Full-text search across sessions (``SearchableStore``): the derived index
        beside the logs (``file/_search.py``), checked against them first."""
        q = check_search(query, owner, tenant, limit, active_path)

        def run() -> list[SearchHit]:
            sessions = [(r.id, self.path_for(r.id)) for r in self._scan().records]
            with self._search_lock:
                if self._search is None:
                    self._search = SearchIndex(self._dir, self._load)
                return self._search.search(sessions, q)

        return await self._thread("search", None, run)

    async def close(self) -> None:
        """Wait for the appends in flight, then stop the worker threads.

        The store stays usable: a later call starts them again.
        """
        await self._group.close()

    # -- blocking implementation ----------------------------------------------

    async def _thread(self, verb: str, session_id: str | None, fn: Callable[..., _T],
                      *args: Any) -> _T:
        try:
            return await self._group.run(fn, *args)
        except OSError as exc:
            what = "sessions" if session_id is None else f"session {session_id!r}"
            raise StoreError(f"cannot {verb} {what} in {self.root}: {exc}",
                             session_id=session_id) from exc

    def _open(self, session_id: str, flags: int) -> tuple[int, os.stat_result, Path]:
        path = self.path_for(session_id)
        try:
            fd, st = open_regular(path, flags, session_id)
        except FileNotFoundError:
            raise SessionNotFound(session_id, str(self.root)) from None
        return fd, st, path

    def _read_record(self, fd: int, session_id: str, path: Path) -> SessionRecord:
        return check_head(read_head(fd), session_id, path)

    def _sync_dir(self, session_id: str) -> None:
        if self.durability != "fsync":
            return
        try:
            fd = os.open(self._dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                         | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._group.poison(f"fsync of directory {self.root} failed", exc,
                                     session_id) from exc

    def _create(self, record: SessionRecord) -> None:
        """Write the first line to a temporary file, sync it, link it to the session's name.

        ``link`` fails if the name exists, so of two processes creating one id
        exactly one wins, and a session file is never seen half-written.
        """
        path = self.path_for(record.id)
        tmp = self._dir / f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                write_all(fd, encode_init(record) + b"\n")
                if self.durability == "fsync":
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        raise self._group.poison(f"fsync of {tmp} failed", exc,
                                                 record.id) from exc
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise SessionExists(record.id, str(path)) from None
        finally:
            tmp.unlink(missing_ok=True)
        self._sync_dir(record.id)

    def _locked(self, session_id: str) -> tuple[int, _Index]:
        """The session's file, open for appending and exclusively locked, and its ids up to date.

        The file at the path must still be the one opened once the lock is
        held: a session deleted or replaced meanwhile is opened afresh.
        """
        assert fcntl is not None
        while True:
            fd, st, path = self._open(session_id, os.O_RDWR | os.O_APPEND)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    now = os.stat(path, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)
                    continue
                head = read_head(fd)
                line = head[:head.find(b"\n")]
                with self._indexes_lock:
                    index = self._indexes.get(session_id)
                if index is None or not index.holds(fd, now, line):
                    check_head(head, session_id, path)
                    index = _Index(now, line)
                index.catch_up(fd, now.st_size)
                self._keep(session_id, index)
                return fd, index
            except BaseException:
                os.close(fd)
                raise

    def _keep(self, session_id: str, index: _Index, *, replace: bool = True) -> None:
        """Keep ``index`` as the session's, the most recently used one."""
        with self._indexes_lock:
            if not replace and session_id in self._indexes:
                return
            self._indexes.pop(session_id, None)
            self._indexes[session_id] = index
            if len(self._indexes) > _MAX_INDEXES:
                del self._indexes[next(iter(self._indexes))]

    def _write_group(self, session_id: str, calls: list[_Append]) -> list[Outcome]:
        """Worker: store a group of calls to one session; what each caller is told."""
        try:
            fd, index = self._locked(session_id)
        except OSError as exc:
            raise self._append_error(session_id, exc) from exc
        try:
            return self._append_locked(fd, index, session_id, calls)
        except OSError as exc:
            raise self._append_error(session_id, exc) from exc
        finally:
            os.close(fd)  # also releases the lock

    def _append_error(self, session_id: str, exc: OSError) -> StoreError:
        return StoreError(f"cannot append to session {session_id!r} in {self.root}: {exc}",
                          session_id=session_id)

    def _append_locked(self, fd: int, index: _Index, session_id: str,
                       calls: Sequence[_Append]) -> list[Outcome]:
        """Write the calls that repeat no stored id, then sync (under the lock).

        A call whose entries are all stored already, byte for byte and in
        order, is an acknowledged retry: it writes nothing, but the
        sync still covers its entries, which another writer may have written
        and not yet synced. Any other call repeating an id is refused alone.
        """
        path = self.path_for(session_id)
        outcomes: list[Outcome] = []
        admitted: list[_Append] = []
        new: set[str] = set()
        retried = False
        for call in calls:
            if index.ids.isdisjoint(call.ids) and new.isdisjoint(call.ids):
                admitted.append(call)
                new.update(call.ids)
                outcomes.append(None)
                continue
            refusal = self._refusal_unless_stored(fd, index, admitted, call, session_id)
            retried = retried or refusal is None
            outcomes.append(refusal)
        data = b"".join(frame(c.lines, version=index.version, compact=c.compact)
                        for c in admitted)
        start = self._repair_tail(fd, index.size, path, session_id) if data else index.size
        if data:
            try:
                write_all(fd, data)
            except OSError as exc:
                self._cut(fd, start, path, session_id, exc)
                raise StoreError(f"append to {path} failed: {exc}",
                                 session_id=session_id) from exc
        if self.durability == "fsync" and (data or retried):
            try:
                fdatasync(fd)
            except OSError as exc:
                # Cut first: once the store is poisoned, nothing may be left
                # that another handle could find and acknowledge as a retry.
                if data:
                    self._cut(fd, start, path, session_id, exc)
                raise self._group.poison(f"fdatasync of {path} failed", exc,
                                         session_id) from exc
        index.size = start
        index.advance(data)
        index.ids |= new
        return outcomes

    def _refusal_unless_stored(self, fd: int, index: _Index, admitted: Sequence[_Append],
                               call: _Append, session_id: str) -> StoreError | None:
        """None if ``call`` is stored already as one run (in the file or earlier in the group)."""
        body = os.pread(fd, index.size - index.body, index.body)
        lines = [e for line in body.split(b"\n")[:-1] for e in stored_entries(line)]
        for other in admitted:
            lines += other.lines
        wanted = set(call.ids)
        stored: dict[str, tuple[int, bytes]] = {}
        for position, line in enumerate(lines):
            found = ids_in(line)
            if found and found[0] in wanted:
                stored.setdefault(found[0], (position, line))
        try:
            check_retried_batch(session_id, list(zip(call.ids, call.lines, strict=True)),
                                stored, str(self.path_for(session_id)))
        except StoreError as exc:
            return exc
        return None

    def _cut(self, fd: int, size: int, path: Path, session_id: str, exc: OSError) -> None:
        """Take a failed append's lines off the file again (all or nothing), and sync that."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc2:
            raise self._group.poison(f"append to {path} failed ({exc}) and could not be undone",
                                     exc2, session_id) from exc
        if self.durability == "fsync":
            # Failing too, it leaves the cut to every reader but a power loss.
            with contextlib.suppress(OSError):
                fdatasync(fd)

    def _repair_tail(self, fd: int, size: int, path: Path, session_id: str) -> int:
        """Make the file end with its last complete line; return its size.

        A last line without a newline (a writer died mid-write) is copied to
        ``<name>.torn-<n>`` first; a copy that fails is removed again.
        """
        end = os.fstat(fd).st_size
        if end == size:
            return size
        fragment = os.pread(fd, end - size, size)
        n = 1
        while True:
            aside = path.with_name(f"{path.name}.torn-{n}")
            try:
                afd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                              | getattr(os, "O_CLOEXEC", 0), 0o644)
                break
            except FileExistsError:
                n += 1
        try:
            try:
                write_all(afd, fragment)
                if self.durability == "fsync":
                    try:
                        os.fsync(afd)
                    except OSError as exc:
                        raise self._group.poison(f"fsync of {aside} failed", exc,
                                                 session_id) from exc
            finally:
                os.close(afd)
            self._sync_dir(session_id)
        except BaseException:
            # The fragment is still in the session file, untouched: a copy that
            # failed to land is of no use, and each retry would leave another.
            os.unlink(aside)
            raise
        # The truncation reaches the disk with the append's fdatasync.
        os.ftruncate(fd, size)
        return size

    def _open_shared(self, session_id: str) -> tuple[int, os.stat_result, Path]:
        """The session's file, open for reading and share-locked.

        Once the lock is held the path must still name the file opened: a
        prune replaces the file (``_prune``), and a reader that opened the
        old one just before would otherwise miss what is appended after.
        """
        assert fcntl is not None
        while True:
            fd, st, path = self._open(session_id, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                try:
                    now = os.stat(path, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
            except BaseException:
                os.close(fd)
                raise
            if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd, st, path
            os.close(fd)
            if now is None:
                raise SessionNotFound(session_id, str(self.root))

    def _load(self, session_id: str) -> EntryLog:
        fd, st, path = self._open_shared(session_id)
        with open(fd, "rb", closefd=True) as f:
            data = f.read()
        check_head(data, session_id, path)
        first = data.find(b"\n")
        end = data.rfind(b"\n") + 1
        diagnostics: list[str] = []
        if end < len(data):
            lineno = data.count(b"\n", 0, end) + 1
            diagnostics.append(
                f"{path} line {lineno}: ignored a torn last line ({len(data) - end} bytes "
                f"with no newline), left by an append that did not finish; none of that "
                f"append's entries are kept (several entries of one call share one line)"
            )
        entries = decode_body(data, first + 1, end, session_id=session_id, path=str(path),
                              first_line=2)
        # The ids the load has are the index an append needs: opening a
        # session and appending to it reads the file once. An index kept
        # already may be newer; an older one is only behind, never wrong.
        index = _Index(st, data[:first])
        index.ids = {e.id for e in entries}
        index.size, index.tail = end, data[max(0, end - _TAIL):end]
        self._keep(session_id, index, replace=False)
        return EntryLog(entries, diagnostics)

    def _load_session(self, session_id: str) -> SessionRecord:
        fd, _, path = self._open(session_id, os.O_RDONLY)
        try:
            return self._read_record(fd, session_id, path)
        finally:
            os.close(fd)

    def _scan(self) -> Catalog:
        self._catalog = scan(self._dir, self._catalog,
                             lambda head, path, name: check_head(head, None, path, name))
        return self._catalog

    def _forget(self, session_id: str) -> None:
        with self._indexes_lock:
            self._indexes.pop(session_id, None)

    def _delete(self, session_id: str) -> None:
        assert fcntl is not None
        self._forget(session_id)
        fd, _, path = self._open(session_id, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink == 0:
                raise SessionNotFound(session_id, str(self.root))
            self._read_record(fd, session_id, path)
            # Unlinking under the lock: an appender that opened the file finds,
            # once it gets the lock, that the path no longer names it.
            os.unlink(path)
            forget_indexed(self._dir, path.name)
            for aside in self._dir.glob(f"{glob_escape(path.name)}.torn-*"):
                aside.unlink(missing_ok=True)
        finally:
            os.close(fd)
        self._sync_dir(session_id)

    # -- pruning (S69, S70) -----------------------------------------------------

    async def prune_session(self, session_id: str, choose: Choose, *,
                            batch: int = 1000) -> Cut:
        """Remove what ``choose`` picks, rewriting the session's file atomically.

        Under the exclusive lock every append takes, the file is read, the
        entries kept are written to a new file (lines untouched unless a
        ``batch`` line loses some of its entries), which is synced and
        renamed over the old one, and the folder is synced. An appender
        waiting for the lock finds that the path names another file and
        appends to the new one; a killed prune leaves the old file or the
        new one, never a mix. ``batch`` is not needed here: one rename is
        one step whatever the size.
        """
        check_session_id(session_id)
        self._group.check_writable(session_id)
        return await self._thread("prune", session_id, self._prune, session_id, choose)

    def _prune(self, session_id: str, choose: Choose) -> Cut:
        assert fcntl is not None
        while True:
            fd, st, path = self._open(session_id, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    now = os.stat(path, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    if now is None:
                        raise SessionNotFound(session_id, str(self.root))
                    continue
                return prune_file(
                    fd, path, session_id, choose, fsync=self.durability == "fsync",
                    forget=lambda: self._forget(session_id),
                    repair_tail=functools.partial(self._repair_tail, session_id=session_id),
                    sync_dir=lambda: self._sync_dir(session_id))
            finally:
                os.close(fd)

    # -- watch (S26) ------------------------------------------------------------

    watch_interval: float = 0.05
    """Seconds between two looks at a watched file that had nothing new."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session by polling its file every ``watch_interval`` seconds.

        A watcher remembers the byte offset after the last complete line it
        delivered, and how many entries of the next line it delivered when
        it stopped inside a ``batch`` line; a line still being written (no
        newline yet) waits for the next look. A torn tail that an append
        cuts off starts exactly at that offset, so the line written in its
        place is read in full.
        """
        check_session_id(session_id)
        check_entry_id(after, session_id, "watch")

        async def start() -> WatchPosition:
            return await self._thread("watch", session_id, watch_start, self._open, session_id,
                                      after)

        async def read(at: WatchPosition) -> tuple[list[Entry], WatchPosition]:
            return await self._thread("watch", session_id, watch_read, self._open, session_id, at)

        return follow(session_id, start, read, Wakeups(), self.watch_interval)

    # -- the linear capability (S32) ------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_linear")
        self._group.check_writable(session_id)
        if not entries:
            await self.load_session(session_id)
            return []
        await self._checked(session_id, entries)  # InvalidEntry before anything is read
        return await self._thread("append to", session_id, self._linear, session_id, entries)

    def _linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        """Chain ``entries`` after the last stored entry and append them, under one lock."""
        fd, index = self._locked(session_id)
        try:
            chained = chain_after(entries, self._linear_parent(fd, index, session_id,
                                                               entries[0].id))
            pairs = [encode_compact(e, session_id=session_id) for e in chained]
            call = _Append([p[0] for p in pairs], [p[1] for p in pairs], [e.id for e in chained])
            (outcome,) = self._append_locked(fd, index, session_id, [call])
        finally:
            os.close(fd)
        if outcome is not None:
            raise outcome
        return chained

    def _linear_parent(self, fd: int, index: _Index, session_id: str,
                       first_id: str) -> str | None:
        """The last stored entry's id; for a retry, the parent its first entry has.

        A retry keeps its stored parent, so that it reads as stored and
        stores nothing.
        """
        path = str(self.path_for(session_id))
        last: str | None = None
        for line in lines_backwards(fd, index.body, index.size):
            if first_id not in index.ids:
                stored = decode_lines(line, session_id=session_id, path=path)
                if stored:
                    return stored[-1].id
                continue
            try:
                stored = decode_lines(line, session_id=session_id, path=path)
            except CorruptLog:
                continue  # a damaged line holds no stored copy
            if last is None and stored:
                last = stored[-1].id
            for entry in stored:
                if entry.id == first_id:
                    return entry.parent_id
        return last

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        check_session_id(session_id)
        check_entry_id(entry_id, session_id, "load_entries_after")
        if entry_id is None:
            return await self.load_entries(session_id)
        return await self._thread("load", session_id, self._load_after, session_id, entry_id)

    def _load_after(self, session_id: str, entry_id: str) -> list[Entry]:
        fd, _, path = self._open_shared(session_id)
        try:
            self._read_record(fd, session_id, path)
            return entries_after(fd, path, session_id, entry_id)
        finally:
            os.close(fd)


def _repeats(session_id: str, path: Path, where: str) -> StoreError:
    return StoreError(f"{path}: append to session {session_id!r} repeats an entry id {where}; "
                      f"nothing was appended", session_id=session_id)
