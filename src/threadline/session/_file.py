"""The JSON-lines file store (S8): one append-only file per session.

Layout: ``<root>/<name>.jsonl``. Line 1 is a ``session_init`` object (format
version, id, parent id, creation time); every later line is one entry, in
append order. Nothing is ever rewritten.

File names. An id made only of lowercase letters, digits, ``-`` and ``_``
(at most 100 characters, not a Windows device name such as ``con``) is its
own file name. Every other id is written as ``=`` plus the lowercase base32
of its UTF-8 bytes, or ``==`` plus its SHA-256 when that would be too long.
Neither form can contain a path separator, and readable names never start
with ``=``, so no id can leave the root and no two ids share a file, even on
a case-insensitive or Unicode-normalising file system. The id stored in the
first line is checked whenever the store opens a file (for appends: when it
opens the descriptor it keeps, see below).

Writes:

- ``create_session`` writes the first line to a temporary file, fsyncs it and
  hard-links it to the final name. ``link`` fails if the name exists, so of
  two processes creating one id exactly one wins, and a session file is never
  seen half-created. The directory is fsynced.
- ``append_entries`` takes an exclusive ``flock`` on the file. If the last
  line has no newline (a writer died mid-write), the fragment is copied to
  ``<name>.jsonl.torn-<n>`` and the file truncated to its last newline. The
  call's entries then go out in one ``os.write`` (short writes are
  continued), then ``fdatasync``, then the lock is released. Several entries
  of one call are framed as one ``batch`` line (the codec's ``frame``), so a
  writer killed mid-write leaves a torn last line, never part of a call.
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
  and the next write takes all of them at once (group commit): each call's
  lines stay together and in call order, and each call returns only after
  the ``fdatasync`` that covers its lines. Every call in a group gets the
  group's outcome: a failed write is cut off again, so none of their lines
  stays; a failed sync is a ``DurabilityError`` for each of them. Appends to
  different sessions run in parallel.
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
import fcntl
import hashlib
import os
import re
import secrets
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from threadline.errors import (
    ConfigError,
    CorruptLog,
    DurabilityError,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import (
    check_record,
    decode_body,
    decode_init,
    encode_entry,
    encode_init,
    format_version,
    frame,
)
from threadline.session._entries import FORMAT_VERSION, Entry, SessionRecord
from threadline.session._memory import check_session_id, page_records
from threadline.session._store import EntryLog, SessionPage

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
_MAX_BASE32_BYTES = 120  # 192 base32 characters: the name stays well under 255 bytes


def session_file_name(session_id: str) -> str:
    """The file name (inside the root) that holds ``session_id``."""
    check_session_id(session_id)
    if _READABLE.fullmatch(session_id) and session_id not in _DEVICE_NAMES:
        return session_id + SUFFIX
    raw = session_id.encode("utf-8")
    if len(raw) <= _MAX_BASE32_BYTES:
        return "=" + base64.b32encode(raw).decode("ascii").rstrip("=").lower() + SUFFIX
    return "==" + hashlib.sha256(raw).hexdigest() + SUFFIX


def _fdatasync(fd: int) -> None:
    # macOS has no fdatasync; fsync is the closest it offers.
    getattr(os, "fdatasync", os.fsync)(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _OpenLog(NamedTuple):
    """A session file this store opened for appending, first line checked."""

    fd: int
    dev: int
    ino: int
    path: Path

    def size_if_current(self) -> int:
        """The file's size if its path still names it (not deleted or replaced), else -1."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return -1
        return st.st_size if (st.st_dev, st.st_ino) == (self.dev, self.ino) else -1


class _WouldBlock(Exception):
    """Another process holds the session's lock; ``log`` is still open."""

    def __init__(self, log: _OpenLog) -> None:
        self.log = log


class _Waiter:
    """An ``append_entries`` call waiting for the write that includes its lines."""

    __slots__ = ("future", "lines", "loop")

    def __init__(self, lines: list[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.lines = lines
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def settle(self, error: BaseException | None) -> None:
        """Wake the caller, from any thread."""
        # RuntimeError: the caller's event loop is closed, no one is waiting.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, self.future, error)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _close_all(logs: dict[str, _OpenLog]) -> None:
    for log in logs.values():
        os.close(log.fd)
    logs.clear()


class FileStore:
    """Sessions as JSON-lines files under ``root`` (created if missing).

    Safe to share between asyncio tasks and threads, and between processes
    on one machine (``flock``); not on network file systems whose ``flock``
    is not shared between machines.
    """

    def __init__(self, root: str | os.PathLike[str], durability: Durability = "fsync") -> None:
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
        self._executor: ThreadPoolExecutor | None = None
        weakref.finalize(self, _close_all, self._logs)
        _STORES.add(self)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.root}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r}, durability={self.durability!r})"

    def path_for(self, session_id: str) -> Path:
        """Where ``session_id`` lives (whether or not it exists)."""
        return self.root / session_file_name(session_id)

    # -- the Store contract ---------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        check_record(record)
        await self._thread("create", record.id, self._create, record)

    async def load_entries(self, session_id: str) -> EntryLog:
        log = await self._thread("load", session_id, self._load, session_id)
        for diagnostic in log.diagnostics:
            warnings.warn(diagnostic, RuntimeWarning, stacklevel=2)
        return log

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        check_session_id(session_id)
        self._check_writable(session_id)
        if len(entries) <= _INLINE_MAX_ENTRIES:
            lines = [encode_entry(entry, session_id=session_id) for entry in entries]
            if self.durability == "flush" and self._write_inline(session_id, lines):
                return
        else:  # checking a big batch takes long enough to stall the event loop
            lines = await asyncio.to_thread(
                lambda: [encode_entry(entry, session_id=session_id) for entry in entries])
        waiter = _Waiter(lines, asyncio.get_running_loop())
        with self._lock:
            queue = self._queues.get(session_id)
            if queue is not None:
                queue.append(waiter)
            else:
                self._queues[session_id] = [waiter]
                self._pool().submit(self._drain, session_id)
        await waiter.future

    # -- beyond the contract --------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self._thread("load", session_id, self._load_session, session_id)

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        records = await self._thread("list", None, self._all_records)
        return page_records(records, limit=limit, cursor=cursor)

    async def delete_session(self, session_id: str) -> None:
        await self._thread("delete", session_id, self._delete, session_id)

    async def close(self) -> None:
        """Wait for running appends, then close cached files and stop the worker threads.

        The store stays usable: later calls reopen what they need.
        """
        with self._lock:
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
            return os.open(path, flags | os.O_CLOEXEC), path
        except FileNotFoundError:
            raise SessionNotFound(session_id, str(self.root)) from None
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc}", session_id=session_id) from exc

    def _read_record(self, fd: int, session_id: str | None, path: Path) -> SessionRecord:
        """Decode the first line and check it names ``session_id``."""
        head = b""
        while True:
            chunk = os.pread(fd, 1 << 16, len(head))
            newline = chunk.find(b"\n")
            if newline >= 0:
                head += chunk[:newline]
                break
            if not chunk:
                raise CorruptLog("no complete session_init line",
                                 session_id=session_id, path=str(path), line=1)
            head += chunk
        return self._check_record(head, session_id, path)

    def _check_record(self, line: bytes, session_id: str | None, path: Path) -> SessionRecord:
        record = decode_init(line, session_id=session_id, path=str(path))
        expected = session_id if session_id is not None else record.id
        if record.id != expected or session_file_name(record.id) != path.name:
            raise CorruptLog(
                f"session_init names session {record.id!r}, which does not belong in this file",
                session_id=session_id, path=str(path), line=1,
            )
        return record

    def _create(self, record: SessionRecord) -> None:
        self._check_writable(record.id)
        path = self.path_for(record.id)
        line = encode_init(record) + b"\n"
        tmp = self.root / f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
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
                log = self._write(session_id, log, [w.lines for w in group])
            except Exception as exc:
                error, log = exc, None
            with self._lock:
                done, (group, log) = group, self._next_group(session_id, log)
            # Waking callers last: the woken event loop then does not wait for
            # this thread to let go of the GIL.
            for waiter in done:
                waiter.settle(error)

    def _next_group(
        self, session_id: str, log: _OpenLog | None, *, inline: bool = False
    ) -> tuple[list[_Waiter], _OpenLog | None]:
        """Cache ``log``; take the appends queued for the session, and its open file.

        Called with ``_lock`` held. With nothing queued, the session is no
        longer busy. An inline writer hands what queued up behind it to a worker.
        """
        if log is not None:
            self._logs[session_id] = log
            if len(self._logs) > _MAX_OPEN_FILES:
                # A failed close of an evicted, fully synced file loses nothing;
                # raising here would kill the worker and strand queued appends.
                with contextlib.suppress(OSError):
                    os.close(self._logs.pop(next(iter(self._logs))).fd)
        group = self._queues[session_id]
        if not group:
            del self._queues[session_id]
            return [], None
        if inline:
            self._pool().submit(self._drain, session_id)
            return [], None
        self._queues[session_id] = []
        return group, self._logs.pop(session_id, None)

    def _write_inline(self, session_id: str, lines: list[bytes]) -> bool:
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
            kept = self._write(session_id, log, [lines], block=False)
        except _WouldBlock as busy:
            kept = busy.log
            return False
        finally:
            with self._lock:
                self._next_group(session_id, kept, inline=True)
        return True

    def _open_log(self, session_id: str, path: Path) -> _OpenLog:
        """Open the session for appending and check its first line names it."""
        fd, _ = self._open(session_id, os.O_RDWR | os.O_APPEND)
        try:
            st = os.fstat(fd)
            # Unlocked: line 1 is complete from creation and never rewritten.
            self._read_record(fd, session_id, path)
        except BaseException:
            os.close(fd)
            raise
        return _OpenLog(fd, st.st_dev, st.st_ino, path)

    def _write(self, session_id: str, log: _OpenLog | None, calls: list[list[bytes]],
               *, block: bool = True) -> _OpenLog:
        """Append each call's lines under the file lock; return the file, still open.

        ``log`` is a file this store opened before, or None. On error it is
        closed. Without ``block``, raises ``_WouldBlock`` if the lock is taken.
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
                    break
                # Deleted or replaced since we opened it: use what is at the
                # path now (checking its first line), if anything. Holding the
                # old file open kept its inode number from being reused.
                os.close(log.fd)
                log = None
            data = self._payload(log.fd, calls)
            if data:
                self._append_locked(log.fd, size, data, path, session_id)
            fcntl.flock(log.fd, fcntl.LOCK_UN)
            return log
        except _WouldBlock:
            raise
        except BaseException as exc:
            if log is not None:
                os.close(log.fd)  # also releases the lock
            if isinstance(exc, OSError):
                raise StoreError(f"cannot append to session {session_id!r} in {self.root}: "
                                 f"{exc}", session_id=session_id) from exc
            raise

    @staticmethod
    def _payload(fd: int, calls: list[list[bytes]]) -> bytes:
        """The bytes for these calls: a call of several entries is one batch line.

        A file created at format version 1 gets one line per entry, as before,
        since a version 1 reader cannot read batch lines.
        """
        batch = True
        if any(len(lines) > 1 for lines in calls):
            head = os.pread(fd, 1 << 16, 0)
            newline = head.find(b"\n")
            version = format_version(head[:newline]) if newline >= 0 else FORMAT_VERSION
            batch = version >= 2
        return b"".join(frame(lines, batch=batch) for lines in calls)

    def _append_locked(self, fd: int, size: int, data: bytes, path: Path,
                       session_id: str) -> None:
        size = self._repair_tail(fd, size, path, session_id)
        try:
            _write_all(fd, data)
        except OSError as exc:
            # Keep the append all-or-nothing: cut off what did get written.
            try:
                os.ftruncate(fd, size)
            except OSError as exc2:
                raise self._poison(
                    session_id, f"append to {path} failed ({exc}) and could not be undone",
                    exc2,
                ) from exc
            raise StoreError(f"append to {path} failed: {exc}",
                             session_id=session_id) from exc
        if self.durability == "fsync":
            try:
                _fdatasync(fd)
            except OSError as exc:
                raise self._poison(session_id, f"fdatasync of {path} failed", exc) from exc

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
            _write_all(afd, fragment)
            if self.durability == "fsync":
                try:
                    os.fsync(afd)
                except OSError as exc:
                    raise self._poison(session_id, f"fsync of {aside} failed", exc) from exc
        finally:
            os.close(afd)
        self._sync_dir(session_id)
        # The truncation reaches the disk with the append's fdatasync.
        os.ftruncate(fd, cut)
        return cut

    def _load(self, session_id: str) -> EntryLog:
        fd, path = self._open(session_id, os.O_RDONLY)
        with open(fd, "rb", closefd=True) as f:
            fcntl.flock(fd, fcntl.LOCK_SH)
            data = f.read()
        first = data.find(b"\n")
        if first < 0:
            raise CorruptLog("no complete session_init line",
                             session_id=session_id, path=str(path), line=1)
        self._check_record(data[:first], session_id, path)
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
        return EntryLog(entries, diagnostics)

    def _load_session(self, session_id: str) -> SessionRecord:
        fd, path = self._open(session_id, os.O_RDONLY)
        try:
            return self._read_record(fd, session_id, path)
        finally:
            os.close(fd)

    def _all_records(self) -> list[SessionRecord]:
        # No cache: a deleted and re-created session can get the old inode
        # back, so only reading the first line is sure to be current.
        records: list[SessionRecord] = []
        with os.scandir(self.root) as it:
            for item in it:
                if not item.name.endswith(SUFFIX) or item.name.startswith("."):
                    continue
                try:
                    fd = os.open(item.path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # deleted while we listed
                try:
                    records.append(self._read_record(fd, None, Path(item.path)))
                finally:
                    os.close(fd)
        return records

    def _delete(self, session_id: str) -> None:
        self._check_writable(session_id)
        with self._lock:
            cached = self._logs.pop(session_id, None)
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
        store._executor = None


os.register_at_fork(after_in_child=_forget_parent_state)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)

