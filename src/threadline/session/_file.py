"""The JSON-lines file store (S8): one append-only file per session.

Layout: ``<root>/<name>.jsonl``. Line 1 is a ``session_init`` object (format
version, id, parent id, creation time); every later line holds what one
``append_entries`` call added, in append order: one entry, or (format
version 2) a ``batch`` line holding all the entries of a call of several.
Nothing is ever rewritten.

File names. An id made only of lowercase letters, digits, ``-`` and ``_``
(at most 100 characters, not a Windows device name such as ``con``) is its
own file name. Every other id is written as ``=`` plus the lowercase base32
of its UTF-8 bytes, or ``==`` plus its SHA-256 when that would be too long.
Neither form can contain a path separator, and readable names never start
with ``=``, so no id can leave the root and no two ids share a file, even on
a case-insensitive or Unicode-normalising file system. The id stored in the
first line is checked whenever the store opens a file (for appends: when it
opens the descriptor it keeps, see below).

Only regular files inside the root (S17): session files are opened with
``O_NOFOLLOW | O_NONBLOCK`` under the root resolved once, and anything but a
regular file is a ``CorruptLog``. A first line is read with one bounded read,
and nothing of a file that does not start like a session log is quoted. A
hard link is the same file under another name; docs/design.md says what
follows from that.

Writes:

- ``create_session`` writes the first line to a temporary file, fsyncs it and
  hard-links it to the final name. ``link`` fails if the name exists, so of
  two processes creating one id exactly one wins, and a session file is never
  seen half-created. The directory is fsynced.
- ``append_entries`` takes an exclusive ``flock`` on the file. If the last
  line has no newline (a writer died mid-write), the fragment is copied to
  ``<name>.jsonl.torn-<n>`` and the file truncated to its last newline; a
  copy that fails is removed again. A batch that repeats an entry id of the
  file is refused, unless the batch is stored already, byte for byte and
  as one run in order: that is a retry of an append that was stored, and it
  succeeds without writing (S25). The ids come from a recent load on this
  store, or one read of the file, plus the lines other writers added, read
  under the lock; the ids inside ``batch`` lines count; an open file keeps
  its ids in memory, about 100 bytes per entry, with the offset of the line
  of each entry this store wrote. The offsets of the other lines are found,
  with one more read, only when a batch repeats an id. The call's entries
  then go out in one ``os.write`` (short writes are continued), then
  ``fdatasync``, then the lock is released. Several entries of one call are
  framed as one ``batch`` line (the codec's ``frame``), so a writer killed
  mid-write leaves a torn last line, never part of a call. A file created at
  format version 1 keeps one line per entry, which a version 1 reader can
  still read.
- A failed fsync is never retried: the kernel may have dropped the dirty
  pages already, so a retry could report data as safe that is not. The store
  raises ``DurabilityError`` and refuses every later write on that object;
  open a new ``FileStore`` after checking the disk.

The append path is built to cost little more than its ``write`` and
``fdatasync`` (``bench/store.py``):

- The store keeps the descriptors of recently appended sessions open (at
  most ``_MAX_OPEN_FILES``, least recently used closed first). The first line
  is checked when a descriptor is opened; on every later append, once the
  lock is held, the file at the path must still be the descriptor's file
  (same device and inode; an open descriptor keeps its inode number from
  being reused). A session deleted or replaced since is reopened and checked
  afresh, or reported missing. (A file another process deleted keeps its
  disk space while this store holds it open: until its next append to that
  session, eviction, or ``close()``.)
- Appends run on the store's own worker threads, not in the event loop. While
  a worker writes a session, further appends to it from this store queue up,
  and the next write takes all of them at once (group commit, S34): each
  call's lines stay together and in call order, and each call returns only
  after the ``fdatasync`` that covers its lines. Every call in a group gets
  the group's outcome: a failed write is cut off again, so none of their
  lines stays; a failed sync is a ``DurabilityError`` for each of them.
  Appends to different sessions run in parallel. A worker is started for an
  idle session only once the tasks the event loop is running have made their
  calls, and a written group's callers are woken with one callback per event
  loop: so tasks that append again as soon as they are woken queue together
  and share the next write, instead of splitting into groups that each pay
  an fdatasync and two thread wake-ups (``bench/store.py``).
- A forked child drops the descriptors it inherited (they share the parent's
  locks) and starts its own workers. ``close()`` releases descriptors and
  threads early; the store stays usable afterwards.

``durability="flush"`` skips every fsync. Appends are then written to the
operating system before ``append_entries`` returns, so they survive the
process being killed, but not a power failure or kernel crash: the entries of
the last few seconds (and sessions created in that time) can be missing or
the file can end in a torn line, which the next load reports and the next
append moves aside.

Reads take a shared lock, read the whole file in one call and decode it with
msgspec. A torn last line is ignored and reported (a ``RuntimeWarning`` and a
string in ``EntryLog.diagnostics``); any other line that does not decode
raises ``CorruptLog`` with the file and line number.

Blocking I/O runs on the store's worker threads so the event loop is not
stalled by an fsync or a large read. The one exception is a small append with
``durability="flush"`` to a session no worker is writing: it is a few system
calls with no fsync, cheaper than the thread hop, so it runs inline. It only
tries the file lock; if another process holds it, a worker waits instead. The
garbage collector is not paused while decoding: entry structs are not tracked
by it, and pausing it measured no faster (``bench/store.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import secrets
import stat
import threading
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from threadline.errors import (
    ConfigError,
    CorruptLog,
    DurabilityError,
    EntryNotFound,
    InvalidSessionId,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import (
    compact_checked,
    decode_body,
    decode_init,
    decode_lines,
    encode_compact,
    encode_entry,
    encode_init,
    expand_line,
    format_version,
    frame,
)
from threadline.session._entries import Entry, SessionRecord
from threadline.session._store import EntryLog, SessionPage, chain_after, decode_cursor
from threadline.session._storekit import (
    check_limit,
    check_record,
    check_session_id,
    lines_after,
    page_sorted,
    sort_key,
)
from threadline.session._uring import Ring, alone, ring_for, wanted
from threadline.session._watch import Wakeups, follow, unknown_after

__all__ = ["FileStore", "session_file_name"]

Durability = Literal["fsync", "flush"]
_T = TypeVar("_T")

SUFFIX = ".jsonl"
_READABLE = re.compile(r"[a-z0-9_-]{1,100}")
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"}
    | {f"{p}{n}" for p in ("com", "lpt") for n in "0123456789¹²³"}
)
_INLINE_MAX_ENTRIES = 8
_MAX_OPEN_FILES = 64  # per store
# Lines of other writers an append through io_uring reads on the event loop;
# more, and a worker reads them (a new session's file is far smaller).
_CATCH_UP_ON_LOOP = 1 << 16
# Bytes an append through io_uring writes from the event loop (about 0.1 ms
# of copying into the page cache); a bigger one is a worker's.
_WRITE_ON_LOOP = 1 << 19
# Loads whose ids are kept for a following append (a list: 8 bytes per entry, and
# the id strings, about 85 bytes, once the entries are gone):
# enough for "open a session, then append to it", little for a reader of many.
_MAX_LOADED_IDS = 8
_MAX_BASE32_BYTES = 120  # 192 base32 characters: the name stays well under 255 bytes
# Never follow a symlink at a session path, and never wait on a FIFO or device
# there (O_NONBLOCK changes nothing for the regular files that pass the check).
_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_LIST_FLAGS = os.O_RDONLY | _OPEN_FLAGS
# A session_init line holds two ids of at most 1,024 UTF-8 bytes (6x that when
# escaped) and a timestamp, so 64 KiB bounds every header read; most headers
# fit in the first, small read.
_MAX_HEADER = 1 << 16
_FIRST_READ = 4096
_INIT_PREFIX = b'{"type":"session_init"'


def session_file_name(session_id: str) -> str:
    """The file name (inside the root) that holds ``session_id``."""
    check_session_id(session_id)
    if _READABLE.fullmatch(session_id) and session_id not in _DEVICE_NAMES:
        return session_id + SUFFIX
    raw = session_id.encode("utf-8")
    if len(raw) <= _MAX_BASE32_BYTES:
        return "=" + base64.b32encode(raw).decode("ascii").rstrip("=").lower() + SUFFIX
    return "==" + hashlib.sha256(raw).hexdigest() + SUFFIX


def _holds(name: str, session_id: str) -> bool:
    """Whether ``name`` is the file of ``session_id``; False for an id no store keeps."""
    if _READABLE.fullmatch(session_id) and session_id not in _DEVICE_NAMES:
        return name == session_id + SUFFIX  # the common case, without the full id check
    try:
        return name == session_file_name(session_id)
    except InvalidSessionId:
        return False


def _short(text: str, limit: int = 60) -> str:
    """``text`` for an error message: escaped, and cut if long."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _fdatasync(fd: int) -> None:
    # macOS has no fdatasync; fsync is the closest it offers.
    getattr(os, "fdatasync", os.fsync)(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_head(fd: int) -> bytes:
    """The start of a file, enough to hold its first line (one bounded read, mostly small)."""
    head = os.pread(fd, _FIRST_READ, 0)
    if b"\n" not in head and len(head) == _FIRST_READ:
        head = os.pread(fd, _MAX_HEADER, 0)
    return head


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(
    path: str | Path, flags: int, session_id: str | None
) -> tuple[int, os.stat_result]:
    """Open ``path`` if it is a regular file, never through a symbolic link.

    Anything else at a session path is reported as ``CorruptLog`` without
    blocking on it (a FIFO) or reading it (a device). ``FileNotFoundError``
    passes through for the caller to report.
    """
    try:
        fd = os.open(path, flags | _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV):
            of = "" if session_id is None else f" of session {session_id!r}"
            raise StoreError(f"cannot open {path}{of}: {exc}", session_id=session_id) from exc
        try:
            what = _kind(os.lstat(path).st_mode)
        except OSError:
            what = "not a regular file"
        raise CorruptLog(f"not a session log: {what}; the file store opens only regular "
                         f"files and never follows links", session_id=session_id,
                         path=str(path)) from exc
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptLog(f"not a session log: {_kind(st.st_mode)}; the file store opens only "
                         f"regular files", session_id=session_id, path=str(path))
    return fd, st


class _OpenLog(NamedTuple):
    """A session file this store opened for appending, first line checked."""

    fd: int
    dev: int
    ino: int
    path: Path
    known: _KnownIds
    version: int
    """The file's format version: how ``frame`` writes to it."""
    spelled: str
    """``path`` as a string: every append stats it, and a ``Path`` converts in Python."""

    def size_if_current(self) -> int:
        """The file's size if its path still names it (not deleted or replaced), else -1."""
        try:
            st = os.stat(self.spelled, follow_symlinks=False)
        except FileNotFoundError:
            return -1
        return st.st_size if (st.st_dev, st.st_ino) == (self.dev, self.ino) else -1


class _KnownIds:
    """The entry ids in a session file up to ``size`` (a line boundary).

    The repeated-id rule needs them under the append lock. Reading them
    costs one pass over the file when the store opens it for appending;
    later appends read only the lines other writers added since.

    Each id maps to the byte offset of its line, or ``_UNPLACED`` for ids
    learned from a load or another writer's lines: finding offsets there
    would cost a Python loop per line on every open, and they are only
    needed to tell an acknowledged retry from a conflicting append (S8),
    which is rare. ``place`` finds them then, with one read of the file.
    """

    __slots__ = ("ids", "size")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.size = 0

    def catch_up(self, fd: int, size: int) -> None:
        """Learn the ids of the complete lines up to ``size``."""
        if size < self.size:  # cut shorter by someone else: start over
            self.ids.clear()
            self.size = 0
        if size == self.size:
            return
        data = os.pread(fd, size - self.size, self.size)
        end = data.rfind(b"\n") + 1
        start = data.find(b"\n") + 1 if self.size == 0 else 0  # line 1 is session_init
        if start < end:
            for entry_id in _ids_in(memoryview(data)[start:end]):
                self.ids.setdefault(entry_id, _UNPLACED)  # the first line with an id wins
        self.size += end

    def add(self, ids: Sequence[str], data: bytes, offset: int) -> None:
        """Record a batch's ids, its framed lines ``data`` about to be written at ``offset``."""
        if data.find(b"\n") == len(data) - 1:  # one line holds them all
            for entry_id in ids:
                self.ids[entry_id] = offset
            return
        for entry_id, start in zip(ids, _line_starts(data, len(ids)), strict=True):
            self.ids[entry_id] = offset + start

    def place(self, fd: int) -> None:
        """Find the offset of every unplaced id's first line, reading the file once.

        Every id inside a ``batch`` line is placed at that line.
        """
        data = os.pread(fd, self.size, 0)
        pos = data.find(b"\n") + 1  # line 1 is session_init
        while pos < len(data):
            end = data.find(b"\n", pos) + 1 or len(data)
            for entry_id in _ids_in(memoryview(data)[pos:end]):
                if self.ids.get(entry_id) == _UNPLACED:
                    self.ids[entry_id] = pos
            pos = end


def _line_starts(data: bytes, count: int) -> list[int]:
    """Where the line of each of ``count`` entries starts in their framed ``data``.

    One line (a ``batch`` line, or a single entry) holds them all; a version
    1 file's call of several entries has one line each.
    """
    starts = [0]
    pos = data.find(b"\n") + 1
    while pos < len(data):
        starts.append(pos)
        pos = data.find(b"\n", pos) + 1
    return starts * count if len(starts) == 1 else starts


_UNPLACED = -1


class _StoredLines:
    """Complete lines of a session file, and of the lines admitted to follow it at ``base``."""

    __slots__ = ("admitted", "base", "fd")

    def __init__(self, fd: int, base: int, admitted: bytes) -> None:
        self.fd, self.base, self.admitted = fd, base, admitted

    def at(self, pos: int) -> bytes | None:
        """The line starting at byte ``pos``, without its newline; None past the end."""
        if pos >= self.base:
            start = pos - self.base
            end = self.admitted.find(b"\n", start)
            return None if end < 0 else self.admitted[start:end]
        parts: list[bytes] = []
        while pos < self.base:  # the file up to base is whole lines
            chunk = os.pread(self.fd, min(1 << 16, self.base - pos), pos)
            if not chunk:
                return None
            end = chunk.find(b"\n")
            if end >= 0:
                parts.append(chunk[:end])
                return b"".join(parts)
            parts.append(chunk)
            pos += len(chunk)
        return None


class _RawBatch(msgspec.Struct, gc=False):
    entries: list[msgspec.Raw]


_raw_batch_decoder = msgspec.json.Decoder(_RawBatch)


def _entries_of_line(line: bytes) -> list[bytes] | None:
    """The bytes of each entry in a stored line, as written; None if it does not decode."""
    try:
        item = _line_ids_decoder.decode(line)
        if isinstance(item, tuple) or item.type != "batch":
            return [expand_line(line)]
        return [expand_line(bytes(raw)) for raw in _raw_batch_decoder.decode(line).entries]
    except msgspec.DecodeError:  # a damaged line holds no stored copy
        return None


class _LineIds(msgspec.Struct, gc=False):
    # Only what the id index needs from a stored line. ``entries`` stays raw
    # JSON: it is parsed only for a ``batch`` line, since an entry of a type
    # this version does not know may have a field of that name of any shape.
    type: Any = None
    id: Any = None
    entries: msgspec.Raw = msgspec.Raw(b"null")


class _EntryId(msgspec.Struct, gc=False):
    id: Any = None


# A compact entry (format version 3) is an array that starts with its id.
_CompactId = tuple[Any, msgspec.Raw, msgspec.Raw, msgspec.Raw]
_line_ids_decoder = msgspec.json.Decoder(_LineIds | _CompactId)
_batch_ids_decoder = msgspec.json.Decoder(list[_EntryId | _CompactId])


def _ids_in(lines: memoryview) -> list[str]:
    """The entry ids in complete JSON lines, those inside ``batch`` lines included."""
    try:
        items = _line_ids_decoder.decode_lines(lines)
    except msgspec.DecodeError:  # a damaged line has no id to clash with
        items = []
        for line in bytes(lines).split(b"\n"):
            with contextlib.suppress(msgspec.DecodeError):
                items.append(_line_ids_decoder.decode(line))
    found = [item[0] if isinstance(item, tuple) else item.id for item in items
             if isinstance(item, tuple) or item.type != "batch"]
    for item in items:
        if not isinstance(item, tuple) and item.type == "batch":
            with contextlib.suppress(msgspec.DecodeError):  # damaged: no ids to clash with
                found.extend(e[0] if isinstance(e, tuple) else e.id
                             for e in _batch_ids_decoder.decode(item.entries))
    return [i for i in found if isinstance(i, str)]


class _Batch:
    """One ``append_entries`` call's encoded lines, and why it was refused, if it was."""

    __slots__ = ("compact", "ids", "lines", "refused")

    def __init__(self, lines: list[bytes], ids: Sequence[str],
                 compact: list[bytes] | None = None) -> None:
        self.lines = lines
        self.ids = ids
        self.compact = compact
        """The lines in their format version 3 form, where the caller made them."""
        self.refused: StoreError | None = None


class _WouldBlock(Exception):
    """The write needs a worker thread: another process holds the session's lock,
    or (on the event loop) the file needs work that could block. ``log``, if
    any, is still open, and not locked."""

    def __init__(self, log: _OpenLog | None) -> None:
        self.log = log


class _Rung:
    """A session whose appends an event loop writes, their fdatasync through io_uring."""

    __slots__ = ("abandoned", "end", "group", "idle", "log", "loop", "ring", "synced")

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: Ring, store: FileStore,
                 session_id: str) -> None:
        self.loop = loop
        self.ring = ring
        self.synced = functools.partial(store._ring_synced, session_id, self)
        """What the ring calls with the outcome of this session's fdatasync."""
        self.log: _OpenLog | None = None
        """The file a sync is in flight for: locked until the kernel is done."""
        self.group: list[_Waiter] = []
        """The calls that sync is for."""
        self.end = 0
        """The file's size once that sync is done."""
        self.abandoned = False
        """Taken over by a worker (the loop closed): the session is no longer this one's."""
        self.idle: asyncio.Future[None] | None = None
        """Set once the session is no longer this one's, for ``close`` to wait on."""


class _Waiter(_Batch):
    """An ``append_entries`` call waiting for the write that includes its lines."""

    __slots__ = ("future", "loop", "size")

    def __init__(self, lines: list[bytes], ids: Sequence[str],
                 loop: asyncio.AbstractEventLoop, compact: list[bytes] | None = None) -> None:
        # _Batch's fields set here, not by a call to its __init__: one frame
        # less on every append.
        self.lines, self.ids, self.compact, self.refused = lines, ids, compact, None
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.size = sum(map(len, lines))


def _wake(group: Sequence[_Waiter], error: BaseException | None,
          here: asyncio.AbstractEventLoop | None = None) -> None:
    """Settle a written group's calls, from any thread: one wake-up per event loop.

    One ``call_soon_threadsafe`` per call woke the loop once per call, and
    the loop often resumed the first callers before the rest were settled,
    so their next appends came in two or more groups (bench/store.py).
    Calls of ``here``, the running loop, are settled at once.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[_Waiter]] = {}
    for waiter in group:
        by_loop.setdefault(waiter.loop, []).append(waiter)
    for loop, waiters in by_loop.items():
        if loop is here:
            _settle(waiters, error)
            continue
        # RuntimeError: the callers' event loop is closed, no one is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, waiters, error)


def _settle(waiters: Sequence[_Waiter], error: BaseException | None) -> None:
    for waiter in waiters:
        future = waiter.future
        if future.cancelled():
            continue
        failure = error or waiter.refused
        if failure is None:
            future.set_result(None)
        else:
            future.set_exception(failure)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _close_all(logs: dict[str, _OpenLog]) -> None:
    for log in logs.values():
        os.close(log.fd)
    logs.clear()


class FileStore:
    """Sessions as JSON-lines files under ``root``.

    ``root`` is created if missing, unless ``create=False``: then a missing
    folder is a ``StoreError``, so a reader never leaves an empty store behind.

    Safe to share between asyncio tasks and threads, and between processes
    on one machine (``flock``); not on network file systems whose ``flock``
    is not shared between machines.
    """

    def __init__(self, root: str | os.PathLike[str], durability: Durability = "fsync",
                 *, create: bool = True) -> None:
        if durability not in ("fsync", "flush"):
            raise ConfigError(f"durability must be 'fsync' or 'flush', got {durability!r}")
        self.root = Path(root)
        self.durability: Durability = durability
        self._poisoned: str | None = None
        self._lock = threading.Lock()
        # Open files of sessions not being written right now, least recently
        # used first. A writer takes its session's out while it writes, so no
        # one else can close it under it.
        self._logs: dict[str, _OpenLog] = {}
        # Sessions a writer (worker or inline) is busy with -> appends queued behind it.
        self._queues: dict[str, list[_Waiter]] = {}
        # Busy sessions whose worker an event loop is yet to start -> that loop.
        self._unstarted: dict[str, asyncio.AbstractEventLoop] = {}
        # Busy sessions an event loop writes through io_uring (fsync only).
        self._rung: dict[str, _Rung] = {}
        self._executor: ThreadPoolExecutor | None = None
        # Read once: S44's switch, for the stores made after it is set.
        self._ring = durability == "fsync" and wanted()
        self._catalog: _Catalog | None = None
        # Entry ids of sessions loaded but not open for appending (see _KnownIds).
        self._loaded_ids: dict[str, tuple[int, int, _KnownIds | tuple[list[str], int]]] = {}
        weakref.finalize(self, _close_all, self._logs)
        _STORES.add(self)
        if not create:
            if not self.root.is_dir():
                raise StoreError(f"no file store at {self.root}: the folder does not exist")
        else:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create store directory {self.root}: {exc}") from exc
        # Resolved once (with create=False too: a reader lists and opens the
        # same way): session paths are this directory plus a name with no
        # separator, opened with O_NOFOLLOW, so no path component after the
        # root can lead outside it.
        self._dir = Path(os.path.realpath(self.root))

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r}, durability={self.durability!r})"

    def path_for(self, session_id: str) -> Path:
        """Where ``session_id`` lives (whether or not it exists)."""
        return self._dir / session_file_name(session_id)

    # -- the Store contract ---------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        await self._thread("create", record.id, self._create, record)

    async def load_entries(self, session_id: str) -> EntryLog:
        log = await self._thread("load", session_id, self._load, session_id)
        for diagnostic in log.diagnostics:
            warnings.warn(diagnostic, RuntimeWarning, stacklevel=2)
        return log

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        check_session_id(session_id)
        self._check_writable(session_id)
        # Encoding checks every entry (InvalidEntry) before anything is read
        # from it or written. The version 3 lines come from the same encode.
        if len(entries) == 1:
            line, small = encode_compact(entries[0], session_id=session_id)
            lines, compact, ids = [line], [small], [entries[0].id]
        else:
            lines, compact, ids = await self._encode_batch(session_id, entries)
        waiting = self._append_lines(session_id, lines, compact, ids)
        if waiting is not None:
            await waiting

    def _append_checked(self, session_id: str, entries: Sequence[Entry],
                        lines: Sequence[bytes]) -> Awaitable[None] | None:
        """``append_entries`` of entries the codec checked (``CheckedAppend``, S48)."""
        check_session_id(session_id)
        self._check_writable(session_id)
        if len(entries) == 1:
            ids = [entries[0].id]
        else:
            ids = [e.id for e in entries]
            if len(set(ids)) < len(ids):
                raise _repeats(session_id, self.path_for(session_id), "within the batch")
        compact = [compact_checked(e, line) for e, line in zip(entries, lines, strict=True)]
        return self._append_lines(session_id, list(lines), compact, ids)

    def _append_lines(self, session_id: str, lines: list[bytes], compact: list[bytes],
                      ids: list[str]) -> asyncio.Future[None] | None:
        """Write checked lines, or queue them: None once written, else what to wait on."""
        if (self.durability == "flush" and len(lines) <= _INLINE_MAX_ENTRIES
                and self._write_inline(session_id, _Batch(lines, ids, compact))):
            return None
        loop = asyncio.get_running_loop()
        waiter = _Waiter(lines, ids, loop, compact)
        ring = ring_for(loop) if self._ring else None
        now: tuple[_Rung, _OpenLog | None] | None = None
        with self._lock:
            queue = self._queues.get(session_id)
            if queue is None:
                self._sweep_locked()
                # Started once the tasks running now have queued their appends
                # too, so that one write takes them all (S34): callbacks made
                # due now run after those already due. Where no other callback
                # is due before the loop next waits, none of them can join it,
                # and the write starts at once.
                if ring is not None:
                    fresh = self._rung[session_id] = _Rung(loop, ring, self, session_id)
                    if alone(loop):
                        self._queues[session_id] = []
                        now = fresh, self._logs.pop(session_id, None)
                    else:
                        self._queues[session_id] = [waiter]
                        loop.call_soon(self._ring_next_group, session_id, fresh)
                else:
                    self._queues[session_id] = [waiter]
                    self._unstarted[session_id] = loop
                    loop.call_soon(self._start_drain, session_id)
            else:
                queue.append(waiter)
                owner = self._unstarted.get(session_id)
                if owner is not None and owner.is_closed():
                    # That loop closed before it ran the start: start it here,
                    # or this session's appends would wait for ever.
                    self._start_drain_locked(session_id)
                rung = self._rung.get(session_id)
                if rung is not None and rung.loop.is_closed():
                    self._abandon_locked(session_id, rung)
        if now is not None:
            self._ring_write(session_id, now[0], [waiter], now[1])
        return waiter.future

    async def _encode_batch(self, session_id: str, entries: Sequence[Entry]
                            ) -> tuple[list[bytes], list[bytes], list[str]]:
        """The lines, version 3 lines and ids of a call of several entries, checked."""
        if len(entries) <= _INLINE_MAX_ENTRIES:
            pairs = [encode_compact(entry, session_id=session_id) for entry in entries]
        else:  # checking a big batch takes long enough to stall the event loop
            pairs = await asyncio.to_thread(
                lambda: [encode_compact(entry, session_id=session_id) for entry in entries])
        ids = [e.id for e in entries]
        if len(set(ids)) < len(ids):
            raise _repeats(session_id, self.path_for(session_id), "within the batch")
        return [p[0] for p in pairs], [p[1] for p in pairs], ids

    def _start_drain(self, session_id: str) -> None:
        with self._lock:
            self._start_drain_locked(session_id)

    def _start_drain_locked(self, session_id: str) -> None:
        """Start a worker thread on a busy session's queue."""
        if self._unstarted.pop(session_id, None) is not None:
            self._pool().submit(self._drain, session_id)

    def _to_worker_locked(self, session_id: str, log: _OpenLog | None,
                          group: list[_Waiter]) -> None:
        """Hand a ring-written session to a worker thread, ``group`` first in its queue."""
        self._drop_rung_locked(session_id)
        self._queues[session_id][:0] = group
        if log is not None:
            self._logs[session_id] = log
        self._pool().submit(self._drain, session_id)

    def _drop_rung_locked(self, session_id: str) -> None:
        rung = self._rung.pop(session_id)
        if rung.idle is not None and not rung.loop.is_closed():
            rung.loop.call_soon_threadsafe(_resolve, rung.idle)

    def _sweep_locked(self) -> None:
        """Take over every session whose io_uring writer's event loop has closed."""
        for session_id, rung in list(self._rung.items()):
            if rung.loop.is_closed():
                self._abandon_locked(session_id, rung)

    def _abandon_locked(self, session_id: str, rung: _Rung) -> None:
        """Take over a session whose io_uring writer's event loop closed mid-write.

        Nothing will run on that loop again, so nobody else would unlock the
        file or write what queued behind it. Closing the descriptor is safe
        with a write in flight: the kernel holds the file, and its lock,
        until the write is done, so the worker's next write waits for it.
        """
        rung.abandoned = True
        if rung.log is not None:
            with contextlib.suppress(OSError):
                os.close(rung.log.fd)
        self._to_worker_locked(session_id, None, [])

    # -- beyond the contract --------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self._thread("load", session_id, self._load_session, session_id)

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        """A page of sessions, newest first; files that are not sessions go in ``problems``.

        The first call reads the first line of every ``*.jsonl`` in the root.
        Later calls reuse what it read while the directory is unchanged (see
        ``_Catalog``), so paging through costs about one scan in all.
        """
        check_limit(limit)
        after = None if cursor is None else decode_cursor(cursor)
        catalog = await self._thread("list", None, self._catalog_now)
        page = page_sorted(catalog.records, limit=limit, after=after, keys=catalog.keys)
        if cursor is None and catalog.problems:
            page = msgspec.structs.replace(page, problems=list(catalog.problems))
        return page

    async def delete_session(self, session_id: str) -> None:
        await self._thread("delete", session_id, self._delete, session_id)

    async def close(self) -> None:
        """Wait for running appends, then close cached files and stop the worker threads.

        The store stays usable: later calls reopen what they need.
        """
        loop = asyncio.get_running_loop()
        with self._lock:  # io_uring writers of this loop; other loops' finish on their own
            writing = [rung for rung in self._rung.values() if rung.loop is loop]
            for rung in writing:
                rung.idle = rung.idle or loop.create_future()
        for rung in writing:
            assert rung.idle is not None
            await rung.idle
        with self._lock:
            self._sweep_locked()
            executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown)
        with self._lock:
            _close_all(self._logs)

    # -- blocking implementation ----------------------------------------------

    async def _thread(
        self, verb: str, session_id: str | None, fn: Callable[..., _T], *args: Any
    ) -> _T:
        with self._lock:
            pool = self._pool()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except OSError as exc:
            what = "sessions" if session_id is None else f"session {session_id!r}"
            raise StoreError(f"cannot {verb} {what} in {self.root}: {exc}",
                             session_id=session_id) from exc

    def _check_writable(self, session_id: str) -> None:
        if self._poisoned is not None:
            raise DurabilityError(
                f"this FileStore refuses writes after an earlier fsync failure "
                f"({self._poisoned}); open a new FileStore once the disk is checked",
                session_id=session_id,
            )

    def _poison(self, session_id: str, what: str, exc: OSError) -> DurabilityError:
        self._poisoned = f"{what}: {exc}"
        return DurabilityError(f"{what}: {exc}", session_id=session_id)

    def _sync_dir(self, session_id: str) -> None:
        if self.durability != "fsync":
            return
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._poison(session_id, f"fsync of directory {self.root} failed", exc) from exc

    def _open(self, session_id: str, flags: int) -> tuple[int, Path]:
        path = self.path_for(session_id)
        try:
            return _open_regular(path, flags, session_id)[0], path
        except FileNotFoundError:
            raise SessionNotFound(session_id, str(self.root)) from None

    def _read_record(self, fd: int, session_id: str | None, path: str | Path) -> SessionRecord:
        """Decode the first line (one bounded read) and check it names ``session_id``."""
        return self._check_record(_read_head(fd), session_id, path)

    def _check_record(
        self, data: bytes, session_id: str | None, path: str | Path, name: str | None = None
    ) -> SessionRecord:
        """The record in the first line of ``data`` (which may hold more lines).

        ``name``: the file's name, where the caller has it (the listing's
        directory entries), so it is not split off ``path`` again.

        Nothing of a file that does not start like a session log is quoted:
        it may be anything, a secret included.
        """
        newline = data.find(b"\n", 0, _MAX_HEADER)
        if not data.startswith(_INIT_PREFIX):
            raise CorruptLog("not a session log: the first line is not a session_init object",
                             session_id=session_id, path=str(path), line=1)
        if newline < 0:
            detail = ("no complete session_init line" if len(data) < _MAX_HEADER else
                      f"the session_init line is longer than {_MAX_HEADER} bytes")
            raise CorruptLog(detail, session_id=session_id, path=str(path), line=1)
        record = decode_init(data[:newline], session_id=session_id, path=str(path))
        expected = session_id if session_id is not None else record.id
        if record.id != expected or not _holds(name or os.path.basename(path), record.id):
            raise CorruptLog(
                f"session_init names session {_short(record.id)}, which does not belong in "
                f"this file",
                session_id=session_id, path=str(path), line=1,
            )
        return record

    def _create(self, record: SessionRecord) -> None:
        check_record(record)
        self._check_writable(record.id)
        path = self.path_for(record.id)
        line = encode_init(record) + b"\n"
        tmp = self._dir / f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, line)
                if self.durability == "fsync":
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise SessionExists(record.id, str(path)) from None
        finally:
            tmp.unlink(missing_ok=True)
        self._sync_dir(record.id)

    def _pool(self) -> ThreadPoolExecutor:
        """The worker threads (call with ``_lock`` held)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(thread_name_prefix="threadline-file")
        return self._executor

    def _drain(self, session_id: str) -> None:
        """Worker: write the session's queued appends, all waiting ones in each write."""
        with self._lock:
            group, log = self._next_group(session_id, None)
        while group:
            error: BaseException | None = None
            try:
                log = self._write(session_id, log, group)
            except Exception as exc:
                error, log = exc, None
            with self._lock:
                done, (group, log) = group, self._next_group(session_id, log)
            # Waking callers last: the woken event loop then does not wait for
            # this thread to let go of the GIL.
            _wake(done, error)

    def _ring_next_group(self, session_id: str, rung: _Rung) -> None:
        """Write what queued for a ring-written session, or let the session go idle."""
        with self._lock:
            if self._rung.get(session_id) is not rung:
                return  # a worker took the session over
            group = self._queues[session_id]
            if not group:
                del self._queues[session_id]
                self._drop_rung_locked(session_id)
                return
            self._queues[session_id] = []
            log = self._logs.pop(session_id, None)
        self._ring_write(session_id, rung, group, log)

    def _ring_write(self, session_id: str, rung: _Rung, group: list[_Waiter],
                    log: _OpenLog | None) -> None:
        """``_write`` on the event loop, its fdatasync handed to io_uring (``_ring_synced``).

        A loop callback, no task: a task's steps cost a turn of the loop
        each. Only the plain case runs here: a file not locked by another
        process, with at most ``_CATCH_UP_ON_LOOP`` bytes of lines this store
        has not read, no torn tail to set aside, and at most
        ``_WRITE_ON_LOOP`` bytes to write. Anything else goes to a worker
        thread, which may read, wait or fsync as long as it needs; so do
        calls from other event loops, as a worker does not end with this one.
        """
        loop = rung.loop
        for waiter in group:
            if waiter.loop is not loop:
                with self._lock:
                    self._to_worker_locked(session_id, log, group)
                return
        try:
            log, size = self._lock_log(session_id, log, block=False)
        except _WouldBlock as busy:
            with self._lock:
                self._to_worker_locked(session_id, busy.log, group)
            return
        except Exception as exc:
            self._ring_done(session_id, rung, group, None, self._append_error(session_id, exc))
            return
        try:
            behind = size - log.known.size
            # Where this store wrote last, the file ends with a whole line.
            if ((behind and (behind > _CATCH_UP_ON_LOOP
                             or os.pread(log.fd, 1, size - 1) != b"\n"))
                    or (group[0].size if len(group) == 1 else sum(w.size for w in group))
                    > _WRITE_ON_LOOP):
                fcntl.flock(log.fd, fcntl.LOCK_UN)
                with self._lock:
                    self._to_worker_locked(session_id, log, group)
                return
            data = self._admit(log, size, group, session_id)
            if data:
                # The write goes to the page cache: as quick as a hop, and it
                # does not wait for the disk (the flush durability's inline
                # appends do the same). Only the fdatasync does.
                try:
                    _write_all(log.fd, data)
                except OSError as exc:
                    self._undo_write(log.fd, size, log.path, session_id, exc)
                rung.ring.fdatasync(log.fd, rung.synced)
                # The ring reports on this loop, so after these are set.
                rung.log, rung.group, rung.end = log, group, size + len(data)
                return
            fcntl.flock(log.fd, fcntl.LOCK_UN)
        except Exception as exc:
            rung.log, rung.group = None, []
            os.close(log.fd)  # also releases the lock (once an in-flight write is done)
            self._ring_done(session_id, rung, group, None, self._append_error(session_id, exc))
            return
        self._ring_done(session_id, rung, group, log, None)

    def _ring_synced(self, session_id: str, rung: _Rung, synced: int) -> None:
        """The ring's report of a group's fdatasync, on the loop: settle it, go on.

        On success the file is unlocked and the callers settled at once;
        caching the file and writing the next group wait one turn, until
        they have resumed: what a caller waits for ends with the sync.
        ``rung.log`` stays set until then, so a store that takes over after
        this loop closed (``_abandon_locked``) still closes the file.
        """
        with self._lock:
            log, group, rung.group = rung.log, rung.group, []
            if rung.abandoned or log is None:  # its taker closed the file, owns the session
                return
            if synced < 0:
                rung.log = None
        if synced >= 0:
            log.known.size = rung.end
            try:
                fcntl.flock(log.fd, fcntl.LOCK_UN)
            except OSError:  # closing releases it; the next append opens the file afresh
                with self._lock:
                    rung.log = None
                os.close(log.fd)
            _settle(group, None)
            rung.loop.call_soon(self._ring_settled, session_id, rung)
            return
        error = self._poison(session_id, f"fdatasync of {log.path} failed",
                             OSError(-synced, os.strerror(-synced)))
        os.close(log.fd)
        self._ring_done(session_id, rung, group, None, error)

    def _ring_settled(self, session_id: str, rung: _Rung) -> None:
        """After a synced group's callers resumed: keep its file open, go on with the session.

        Those callers ran first, so what they append next is queued by now
        and goes in one group.
        """
        with self._lock:
            log, rung.log = rung.log, None
            if rung.abandoned:
                return
            if log is not None:
                self._cache_locked(session_id, log)
        self._ring_next_group(session_id, rung)

    def _ring_done(self, session_id: str, rung: _Rung, done: list[_Waiter],
                   log: _OpenLog | None, error: BaseException | None) -> None:
        """Settle a written group; write what queued meanwhile, or look again soon."""
        with self._lock:
            if log is not None:
                self._cache_locked(session_id, log)
            queued = bool(self._queues[session_id])
        _settle(done, error)
        if queued:
            self._ring_next_group(session_id, rung)
        else:
            # The callers just settled run first, and what they append next
            # goes in one group.
            rung.loop.call_soon(self._ring_next_group, session_id, rung)

    def _append_error(self, session_id: str, exc: Exception) -> Exception:
        """What an append's caller is told of ``exc``: an OSError as a StoreError."""
        if isinstance(exc, OSError):
            error = StoreError(f"cannot append to session {session_id!r} in {self.root}: "
                               f"{exc}", session_id=session_id)
            error.__cause__ = exc
            return error
        return exc

    def _next_group(
        self, session_id: str, log: _OpenLog | None, *, inline: bool = False
    ) -> tuple[list[_Waiter], _OpenLog | None]:
        """Cache ``log``; take the appends queued for the session, and its open file.

        Called with ``_lock`` held. With nothing queued, the session is no
        longer busy. An inline writer hands what queued up behind it to a worker.
        """
        if log is not None:
            self._cache_locked(session_id, log)
        group = self._queues[session_id]
        if not group:
            del self._queues[session_id]
            return [], None
        if inline:
            self._pool().submit(self._drain, session_id)
            return [], None
        self._queues[session_id] = []
        return group, self._logs.pop(session_id, None)

    def _cache_locked(self, session_id: str, log: _OpenLog) -> None:
        self._logs[session_id] = log
        if len(self._logs) > _MAX_OPEN_FILES:
            # A failed close of an evicted, fully synced file loses nothing;
            # raising here would kill the writer and strand queued appends.
            with contextlib.suppress(OSError):
                os.close(self._logs.pop(next(iter(self._logs))).fd)

    def _write_inline(self, session_id: str, batch: _Batch) -> bool:
        """Append in the caller's thread, unless a writer is busy with the session.

        Without fsync a small append is a few microseconds of system calls,
        less than the thread hop (bench/store.py); with fsync it can take
        milliseconds, which the event loop must not wait for. Nor may it wait
        for another process's lock: then a worker does the append.
        """
        with self._lock:
            if session_id in self._queues:
                return False
            self._queues[session_id] = []
            log = self._logs.pop(session_id, None)
        kept = None
        try:
            kept = self._write(session_id, log, [batch], block=False)
        except _WouldBlock as busy:
            kept = busy.log
            return False
        finally:
            with self._lock:
                self._next_group(session_id, kept, inline=True)
        if batch.refused is not None:
            raise batch.refused
        return True

    def _open_log(self, session_id: str, path: Path) -> _OpenLog:
        """Open the session for appending and check its first line names it."""
        fd, _ = self._open(session_id, os.O_RDWR | os.O_APPEND)
        try:
            st = os.fstat(fd)
            # Unlocked: line 1 is complete from creation and never rewritten.
            head = _read_head(fd)
            self._check_record(head, session_id, path)
            # An older reader cannot read what a newer format adds, so a file
            # keeps the version it was created with.
            version = format_version(head[:head.find(b"\n")])
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            loaded = self._loaded_ids.pop(session_id, None)
        known = _KnownIds()
        if loaded and loaded[:2] == (st.st_dev, st.st_ino):
            kept = loaded[2]
            if isinstance(kept, _KnownIds):
                known = kept
            else:  # a load's ids, indexed only now that an append needs them
                known.ids = dict.fromkeys(kept[0], _UNPLACED)
                known.size = kept[1]
        return _OpenLog(fd, st.st_dev, st.st_ino, path, known, version, str(path))

    def _write(self, session_id: str, log: _OpenLog | None,
               batches: Sequence[_Batch] | Callable[[_OpenLog, int], Sequence[_Batch]],
               *, block: bool = True) -> _OpenLog:
        """Append the batches under the file lock; return the file, still open.

        A batch repeating an id already in the file (or in an earlier batch of
        the group) is left out and marked ``refused``. ``log`` is a file this
        store opened before, or None. On error it is closed. ``batches`` may be
        a function of the locked file and its size, which makes what is written
        depend on what is there (``append_linear``). Without ``block``, raises
        ``_WouldBlock`` (the file still open) if another process holds the lock.
        """
        try:
            log, size = self._lock_log(session_id, log, block=block)
        except OSError as exc:
            raise StoreError(f"cannot append to session {session_id!r} in {self.root}: "
                             f"{exc}", session_id=session_id) from exc
        try:
            if callable(batches):
                batches = batches(log, size)
            data = self._admit(log, size, batches, session_id)
            if data:
                end = self._append_locked(log.fd, size, data, log.path, session_id)
                log.known.size = end
            fcntl.flock(log.fd, fcntl.LOCK_UN)
            return log
        except BaseException as exc:
            os.close(log.fd)  # also releases the lock
            if isinstance(exc, OSError):
                raise StoreError(f"cannot append to session {session_id!r} in {self.root}: "
                                 f"{exc}", session_id=session_id) from exc
            raise

    def _lock_log(self, session_id: str, log: _OpenLog | None, *,
                  block: bool) -> tuple[_OpenLog, int]:
        """The session's file, open and locked, and its size.

        On failure the file is closed, given or opened here, except on
        ``_WouldBlock``: then it stays open, unlocked.
        """
        try:
            self._check_writable(session_id)
            path = self.path_for(session_id) if log is None else log.path
            while True:
                if log is None:
                    log = self._open_log(session_id, path)
                try:
                    fcntl.flock(log.fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _WouldBlock(log) from None
                size = log.size_if_current()
                if size >= 0:
                    return log, size
                # Deleted or replaced since we opened it: use what is at the
                # path now (checking its first line), if anything. Holding the
                # old file open kept its inode number from being reused.
                os.close(log.fd)
                log = None
        except _WouldBlock:
            raise
        except BaseException:
            if log is not None:
                os.close(log.fd)
            raise

    def _admit(self, log: _OpenLog, size: int, batches: Sequence[_Batch],
               session_id: str) -> bytes:
        """The framed lines of the batches that repeat no id; the ids become known.

        A batch whose lines are stored already (the same line, or lines, byte for
        byte, in one run), is an acknowledged retry (S25): it is left out and succeeds.
        Any other batch repeating a known id is left out and ``refused``.
        """
        known = log.known
        known.catch_up(log.fd, size)
        # The write goes at the last line boundary (_repair_tail cuts a torn
        # tail back to it), so the admitted lines land at known.size onwards.
        base = known.size
        if len(batches) == 1 and known.ids.keys().isdisjoint(batches[0].ids):
            batch = batches[0]  # the common case, without the lists
            data = frame(batch.lines, version=log.version, compact=batch.compact)
            known.add(batch.ids, data, base)
            return data
        admitted: list[bytes] = []
        pending = 0
        for batch in batches:
            data = frame(batch.lines, version=log.version, compact=batch.compact)
            if known.ids.keys().isdisjoint(batch.ids):
                known.add(batch.ids, data, base + pending)
                admitted.append(data)
                pending += len(data)
            elif not self._stored_already(log, batch, base, admitted):
                batch.refused = _repeats(session_id, log.path, "already in the session, and "
                                         "the batch is not a retry of a stored append")
        return b"".join(admitted)

    def _stored_already(self, log: _OpenLog, batch: _Batch, base: int,
                        admitted: Sequence[bytes]) -> bool:
        """Whether the entries of ``batch`` are stored, byte for byte, as one run in order.

        The run is read in the file's entries, one per line or several in a
        ``batch`` line, starting where the index places the batch's first
        id: the same rule as every other store's (S25), whatever framing
        the original append had (a version 1 file's lines, a batch line, or
        part of one). Lines at ``base`` or after are not written yet: they
        are ``admitted`` earlier in this group, and read there.
        """
        known = log.known
        if not all(i in known.ids for i in batch.ids):
            return False
        if any(known.ids[i] == _UNPLACED for i in batch.ids):
            known.place(log.fd)
            if any(known.ids[i] == _UNPLACED for i in batch.ids):
                return False  # a line whose id no longer reads back is no stored copy
        lines = _StoredLines(log.fd, base, b"".join(admitted))
        pos, done = known.ids[batch.ids[0]], 0
        while done < len(batch.lines):
            line = lines.at(pos)
            if line is None:
                return False
            stored = _entries_of_line(line)
            if not stored:
                return False
            if done == 0:  # the run may start inside a batch line
                if batch.lines[0] not in stored:
                    return False
                stored = stored[stored.index(batch.lines[0]):]
            want = batch.lines[done:done + len(stored)]
            if stored[:len(want)] != want:
                return False
            done += len(want)
            pos += len(line) + 1
        return True

    def _append_locked(self, fd: int, size: int, data: bytes, path: Path,
                       session_id: str) -> int:
        """Write ``data`` after repairing a torn tail; the file's new size."""
        size = self._repair_tail(fd, size, path, session_id)
        try:
            _write_all(fd, data)
        except OSError as exc:
            self._undo_write(fd, size, path, session_id, exc)
        if self.durability == "fsync":
            try:
                _fdatasync(fd)
            except OSError as exc:
                raise self._poison(session_id, f"fdatasync of {path} failed", exc) from exc
        return size + len(data)

    def _undo_write(self, fd: int, size: int, path: Path, session_id: str,
                    exc: OSError) -> None:
        """Keep a failed append all-or-nothing: cut off what did get written, and raise."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc2:
            raise self._poison(
                session_id, f"append to {path} failed ({exc}) and could not be undone",
                exc2,
            ) from exc
        raise StoreError(f"append to {path} failed: {exc}",
                         session_id=session_id) from exc

    def _repair_tail(self, fd: int, size: int, path: Path, session_id: str) -> int:
        """Make the file end at a newline; return its size."""
        if os.pread(fd, 1, size - 1) == b"\n":
            return size
        end = size
        while True:  # line 1 ends in a newline (checked by _read_record)
            start = max(0, end - (1 << 16))
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
            end = start
        fragment = os.pread(fd, size - cut, cut)
        n = 1
        while True:
            aside = path.with_name(f"{path.name}.torn-{n}")
            try:
                afd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                break
            except FileExistsError:
                n += 1
        try:
            try:
                _write_all(afd, fragment)
                if self.durability == "fsync":
                    try:
                        os.fsync(afd)
                    except OSError as exc:
                        raise self._poison(session_id, f"fsync of {aside} failed", exc) from exc
            finally:
                os.close(afd)
            self._sync_dir(session_id)
        except BaseException:
            # The fragment is still in the session file, untouched: a copy that
            # failed to land is of no use, and each retry would leave another.
            with contextlib.suppress(OSError):
                os.unlink(aside)
            raise
        # The truncation reaches the disk with the append's fdatasync.
        os.ftruncate(fd, cut)
        return cut

    def _load(self, session_id: str) -> EntryLog:
        fd, path = self._open(session_id, os.O_RDONLY)
        with open(fd, "rb", closefd=True) as f:
            fcntl.flock(fd, fcntl.LOCK_SH)
            data = f.read()
            st = os.fstat(fd)
        self._check_record(data, session_id, path)
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
        self._remember_ids(session_id, st, end, entries)
        return EntryLog(entries, diagnostics)

    def _remember_ids(self, session_id: str, st: os.stat_result, size: int,
                      entries: Sequence[Entry]) -> None:
        """Keep a load's ids, so that the next append need not read the file for them.

        As a list: hashing them into the index is most of the cost (the list
        is about a quarter of it), and a load no append follows never needs it.
        """
        ids = [e.id for e in entries]
        self._keep_ids(session_id, st.st_dev, st.st_ino, (ids, size))

    def _keep_ids(self, session_id: str, dev: int, ino: int,
                  known: _KnownIds | tuple[list[str], int]) -> None:
        with self._lock:
            self._loaded_ids.pop(session_id, None)
            self._loaded_ids[session_id] = (dev, ino, known)
            if len(self._loaded_ids) > _MAX_LOADED_IDS:
                del self._loaded_ids[next(iter(self._loaded_ids))]

    def _load_session(self, session_id: str) -> SessionRecord:
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            return self._read_record(fd, session_id, path)
        finally:
            os.close(fd)

    def _catalog_now(self) -> _Catalog:
        now = time.time_ns()  # before the stat: a change after it is stamped later
        st = os.stat(self._dir)
        old = self._catalog
        if old is not None and old.current(st):
            return old
        files: dict[str, _Listed] = {}
        with os.scandir(self._dir) as it:
            for item in it:
                if not item.name.endswith(SUFFIX) or item.name.startswith("."):
                    continue
                known = None if old is None else old.files.get(item.name)
                listed = self._list_one(item, known, now)
                if listed is not None:
                    files[item.name] = listed
        catalog = _Catalog(st, _settled(st.st_mtime_ns, now), files)
        self._catalog = catalog
        return catalog

    def _list_one(self, item: os.DirEntry[str], known: _Listed | None,
                  now: int) -> _Listed | None:
        """What the file at ``item`` holds: reused from ``known`` if it is surely the same file."""
        path = item.path  # a str: this runs once per file, and Path costs more than the read
        try:
            if known is not None and known.still(item):
                return known
            if not item.is_file(follow_symlinks=False):
                kind = _kind(os.stat(path, follow_symlinks=False).st_mode)
                return _Listed(item.inode(), CorruptLog(f"not a session log: {kind}", path=path),
                               now)
            # The directory entry said "regular file", and O_NONBLOCK keeps a
            # file swapped for a FIFO since from blocking us (its pread then
            # fails); no fstat here, it was a tenth of the listing's cost.
            fd = os.open(path, _LIST_FLAGS)
            try:
                head = _read_head(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None  # deleted while we listed
        except OSError as exc:
            return _Listed(item.inode(), CorruptLog(f"cannot read: {exc}", path=path), now)
        try:
            found: SessionRecord | CorruptLog = self._check_record(head, None, path, item.name)
        except CorruptLog as exc:
            found = exc
        return _Listed(item.inode(), found, now)

    def _delete(self, session_id: str) -> None:
        self._check_writable(session_id)
        with self._lock:
            cached = self._logs.pop(session_id, None)
            self._loaded_ids.pop(session_id, None)
        if cached is not None:
            os.close(cached.fd)
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink == 0:
                raise SessionNotFound(session_id, str(self.root))
            self._read_record(fd, session_id, path)
            # Unlinking under the lock: an appender holding the file open
            # finds, once it gets the lock, that the path no longer names it.
            os.unlink(path)
            for aside in self.root.glob(f"{glob_escape(path.name)}.torn-*"):
                aside.unlink(missing_ok=True)
        finally:
            os.close(fd)
        self._sync_dir(session_id)

    # -- watch (S26) ------------------------------------------------------------

    watch_interval: float = 0.05
    """Seconds between two looks at a watched file that had nothing new."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session (S26) by polling its file every ``watch_interval`` seconds.

        A watcher remembers the byte offset after the last complete line it
        delivered, and how many entries of the next line it delivered when
        it stopped inside a ``batch`` line; a line still being written (no
        newline yet) waits for the next look. A torn tail that an append
        cuts off starts exactly at that offset, so the line written in its
        place is read in full.
        """
        check_session_id(session_id)

        async def start() -> _WatchPosition:
            return await self._thread("watch", session_id, self._watch_start, session_id, after)

        async def read(at: _WatchPosition) -> tuple[list[Entry], _WatchPosition]:
            return await self._thread("watch", session_id, self._watch_read, session_id, at)

        return follow(session_id, start, read, Wakeups(), self.watch_interval)

    def _watch_start(self, session_id: str, after: str | None) -> _WatchPosition:
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            self._read_record(fd, session_id, path)
            offset = 0
            while (newline := os.pread(fd, 1 << 16, offset).find(b"\n")) < 0:
                offset += 1 << 16  # _read_record found a newline: this ends
        finally:
            os.close(fd)
        at = _WatchPosition(offset + newline + 1, 2)
        while after is not None:
            entries, nxt = self._watch_read(session_id, at)
            if not entries:
                raise unknown_after(session_id, after, str(path))
            for n, entry in enumerate(entries):
                if entry.id == after:
                    return self._watch_read(session_id, at, limit=n + 1)[1]
            at = nxt
        return at

    def _watch_read(self, session_id: str, at: _WatchPosition,
                    limit: int = 1000) -> tuple[list[Entry], _WatchPosition]:
        """Up to ``limit`` entries after ``at``, and the position after them.

        A line may hold many entries (a ``batch`` line): the position can sit
        inside one, after its first ``at.skip`` entries, so that a resume
        after an entry there neither repeats nor skips its neighbours.
        """
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, min(size - at.offset, 1 << 22), at.offset) if size > at.offset \
                else b""
            if b"\n" not in data and at.offset + len(data) < size:
                data = os.pread(fd, size - at.offset, at.offset)  # one line over 4 MiB
        finally:
            os.close(fd)
        entries: list[Entry] = []
        offset, line, skip = at
        for raw in data.split(b"\n")[:-1]:  # the last piece has no newline yet: wait for it
            got = decode_lines(raw, session_id=session_id, path=str(path), first_line=line)[skip:]
            room = limit - len(entries)
            if len(got) > room:
                entries.extend(got[:room])
                return entries, _WatchPosition(offset, line, skip + room)
            entries.extend(got)
            offset, line, skip = offset + len(raw) + 1, line + 1, 0
            if len(entries) == limit:
                break
        return entries, _WatchPosition(offset, line, skip)


    # -- the linear capability (S32) ------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        check_session_id(session_id)
        self._check_writable(session_id)
        stored: list[Entry] = list(entries)
        ids = [e.id for e in entries]
        if len(set(ids)) < len(ids):
            raise _repeats(session_id, self.path_for(session_id), "within the batch")
        batch = _Batch([], ids)

        def chained(log: _OpenLog, size: int) -> list[_Batch]:
            # Called with the exclusive lock held: no writer can slip in
            # between reading the last entry and appending after it. A retry
            # (S25) keeps the parent its first entry was stored with, so that
            # _admit finds the stored bytes and stores nothing.
            where = str(log.path)
            line = _line_of(log, size, ids[0])
            try:
                # The line may be a batch line: find the entry itself in it.
                first = None if line is None else next(
                    (e for e in decode_lines(line, session_id=session_id, path=where)
                     if e.id == ids[0]), None)
            except CorruptLog:
                first = None  # no stored copy to retry: _admit refuses the batch
            if first is not None:
                parent = first.parent_id
            else:
                line = _last_line(log.fd, size)
                last = [] if line is None else decode_lines(line, session_id=session_id,
                                                            path=where)
                parent = last[-1].id if last else None
            stored[:] = chain_after(entries, parent)
            batch.lines = [encode_entry(e, session_id=session_id) for e in stored]
            return [batch]

        def write() -> None:
            # A descriptor of its own: its flock excludes this store's cached
            # one as it excludes other processes. Its ids (the duplicate-id
            # rule's, now with this batch's) are kept for the next open.
            log = self._write(session_id, None, chained)
            os.close(log.fd)
            self._keep_ids(session_id, log.dev, log.ino, log.known)
            if batch.refused is not None:
                raise batch.refused

        if entries:
            await self._thread("append to", session_id, write)
        else:
            await self.load_session(session_id)
        return stored

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        if entry_id is None:
            return await self.load_entries(session_id)
        return await self._thread("load", session_id, self._load_after, session_id, entry_id)

    def _load_after(self, session_id: str, entry_id: str) -> list[Entry]:
        # Read back from the end, a growing chunk at a time, until the line of
        # ``entry_id`` is in view: the cost follows what is new, not the log.
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._read_record(fd, session_id, path)
            size = os.fstat(fd).st_size
            needle = b'"id":' + msgspec.json.encode(entry_id)
            chunk = 1 << 16
            while True:
                start = max(0, size - chunk)
                data = os.pread(fd, size - start, start)
                lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
                lines = lines[1:]  # cut by the chunk's start, or the session_init line
                if start == 0 or any(needle in line for line in lines):
                    try:
                        return lines_after(lines, entry_id, session_id, str(path))
                    except EntryNotFound:
                        if start == 0:
                            raise
                        # The id was only mentioned in a later entry: look further back.
                chunk *= 4
        finally:
            os.close(fd)


def _line_of(log: _OpenLog, size: int, entry_id: str) -> bytes | None:
    """The stored line of ``entry_id`` (call under the lock), or None if it has none."""
    known = log.known
    known.catch_up(log.fd, size)
    if known.ids.get(entry_id, _UNPLACED) == _UNPLACED and entry_id in known.ids:
        known.place(log.fd)
    start = known.ids.get(entry_id, _UNPLACED)
    if start == _UNPLACED:
        return None
    chunk = 1 << 16
    while True:
        data = os.pread(log.fd, chunk, start)
        end = data.find(b"\n")
        if end >= 0:
            return data[:end]
        if len(data) < chunk:
            return None
        chunk *= 4


def _last_line(fd: int, size: int) -> bytes | None:
    """The last complete entry line of the file (a torn tail skipped), or None."""
    chunk = 1 << 16
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        end = data.rfind(b"\n")
        if end >= 0:
            begin = data.rfind(b"\n", 0, end) + 1
            if begin > 0:
                return data[begin:end]
            if start == 0:
                return None  # only the session_init line
        if start == 0:
            return None
        chunk *= 4


class _WatchPosition(NamedTuple):
    offset: int
    """Byte offset of the next line not delivered in full (after a complete line)."""
    line: int
    """Line number (1-based) of that line, for error messages."""
    skip: int = 0
    """How many of that line's entries were delivered already (a ``batch`` line)."""


# How long after a change to a directory (or file) its timestamps may still
# repeat: file systems stamp changes from a clock that ticks in steps, so a
# change made just after a listing read the directory can carry the very
# timestamp the listing saw. Timestamps that are whole seconds suggest a file
# system that keeps no more than seconds.
_RACY_NS = 50_000_000
_RACY_COARSE_NS = 2_000_000_000


def _settled(stamp_ns: int, seen_at_ns: int) -> bool:
    """True if a change after ``seen_at_ns`` must give a timestamp other than ``stamp_ns``."""
    margin = _RACY_COARSE_NS if stamp_ns % 1_000_000_000 == 0 else _RACY_NS
    return stamp_ns < seen_at_ns - margin


class _Listed:
    """One ``*.jsonl`` in the root as a listing found it (a plain class: cheaper to make)."""

    __slots__ = ("found", "ino", "seen_at")

    def __init__(self, ino: int, found: SessionRecord | CorruptLog, seen_at: int) -> None:
        self.ino = ino
        self.found = found
        self.seen_at = seen_at  # time.time_ns() before the scan that read it

    def still(self, item: os.DirEntry[str]) -> bool:
        """Whether the file at ``item`` is surely the one read, unchanged since.

        Same inode, and a ctime a tick older than the read: any change to the
        file after the read (or a new file that got the old inode back)
        would carry a later ctime.
        """
        return (type(self.found) is SessionRecord and item.inode() == self.ino
                and _settled(os.stat(item.path, follow_symlinks=False).st_ctime_ns,
                             self.seen_at))


class _Catalog:
    """What one scan of the root found, and whether it may be served again.

    Creating, deleting or renaming a session changes the directory's mtime,
    so while the mtime (and the directory itself) is unchanged, no session
    came or went and the scan still holds. Because a timestamp can repeat
    for a change made within a clock tick of the scan, a scan is served
    again only if the mtime it saw is older than that (``_settled``); a
    busy directory is scanned again on every call. A scan after a change
    re-reads only files it has not seen, and files whose inode changed or
    whose ctime is not a tick older than the scan that read them (a session
    deleted and created again may get the old inode back, but not an old
    ctime); everything else is reused.

    Not noticed: another program rewriting a session file's first line in
    place. The store never does; the first line is written once.
    """

    __slots__ = ("dev", "files", "ino", "keys", "mtime_ns", "problems", "records", "reusable")

    def __init__(self, st: os.stat_result, reusable: bool, files: dict[str, _Listed]) -> None:
        self.dev, self.ino, self.mtime_ns = st.st_dev, st.st_ino, st.st_mtime_ns
        self.reusable = reusable
        self.files = files
        keyed = sorted((sort_key(f.found), f.found) for f in files.values()
                       if isinstance(f.found, SessionRecord))
        self.keys = [k for k, _ in keyed]  # unique (ids are), so records are never compared
        self.records = [r for _, r in keyed]
        self.problems = sorted((f.found for f in files.values()
                                if isinstance(f.found, CorruptLog)), key=lambda e: e.path or "")

    def current(self, st: os.stat_result) -> bool:
        return self.reusable and (st.st_dev, st.st_ino, st.st_mtime_ns) == (
            self.dev, self.ino, self.mtime_ns)


def _repeats(session_id: str, path: Path, where: str) -> StoreError:
    return StoreError(f"{path}: append to session {session_id!r} repeats an entry id {where}; "
                      f"nothing was appended", session_id=session_id)


_STORES: weakref.WeakSet[FileStore] = weakref.WeakSet()


def _forget_parent_state() -> None:
    # A forked child must not write through the parent's descriptors: they
    # share the parent's flock, so the two would not exclude each other. The
    # parent's worker threads do not exist in the child, and its lock may
    # have been held at the fork.
    for store in _STORES:
        store._lock = threading.Lock()
        _close_all(store._logs)
        store._queues.clear()
        store._unstarted.clear()
        store._rung.clear()
        store._executor = None


os.register_at_fork(after_in_child=_forget_parent_state)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)

