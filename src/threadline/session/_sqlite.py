"""SQLite store: one database file, shared safely by threads and processes.

Each store owns one connection, driven by one dedicated worker thread, so the
event loop never blocks on disk and the connection is only ever touched by one
thread at a time. (Measured against ``asyncio.to_thread`` with a connection
per pool thread: appends are bound by the commit's fsync either way, and one
thread keeps transactions strictly ordered within the process.) Where the
kernel offers io_uring, appends skip the thread (S46, below).

Durability: WAL, and ``synchronous="FULL"`` by default, so an acknowledged
append has been synced and survives power loss. The store gets it as SQLite's
``NORMAL`` (a commit writes its WAL frames and does not sync them) plus an
fdatasync of the WAL of its own after the commit and before the
acknowledgement: the write lock is let go before the sync instead of after it,
so other writers commit while this one waits for the disk, and one sync covers
them all. Where there is no fdatasync or the WAL cannot be opened, SQLite
syncs inside the commit as ``FULL`` does. ``synchronous="NORMAL"`` is the
documented opt-in: still crash-safe for the process, but the last commits may
be lost on power failure.

Why an acknowledged append is as durable as under ``FULL`` (S46):

- the fdatasync flushes every page of the WAL written before it, so our
  frames, and whatever other connections committed before or after ours
  (their frames follow ours in the same file): a later commit that is
  durable makes every earlier one durable;
- SQLite syncs what we do not: the WAL header whenever a commit starts the WAL
  over (also under ``NORMAL``), and a checkpoint syncs the WAL before it copies
  frames into the database, and the database after. A checkpoint (ours or
  another process's) that runs while our sync is in flight has synced our
  frames itself; only once every frame is copied and synced may a writer
  start the WAL over and overwrite them, or a ``TRUNCATE`` checkpoint cut it;
- the WAL is never replaced while a connection has it open (SQLite deletes
  it only when the last connection closes, after a full checkpoint), and the
  store's connections stay open while its descriptor is: the file synced is
  the one SQLite writes;
- unix SQLite assumes power-safe overwrites, so ``FULL`` pads nothing either;
- a failed fdatasync fails the append with ``DurabilityError`` and the store
  refuses every later write (the kernel may have dropped the pages), also
  appends queued behind it.

One thing differs: another connection may read a commit during the sync, before
it is durable (``FULL`` syncs before it makes a commit visible), as readers of
the file store may. A power loss in that window loses it, unacknowledged; a
process crash does not.

S46, appends on the event loop: where ``ring_for`` gives the calling loop an
io_uring, the first loop that appends becomes the store's home. Its appends
are committed on that loop, on a second connection that never waits (no busy
timeout, no auto-checkpoint), and the WAL's fdatasync goes to the ring; its
report settles the callers from the loop and starts the next group, with no
thread or task between (``_loop_group``, ``_loop_synced``). Appends made while
a sync is in flight share the next transaction and sync (S42). Whatever could
wait goes to the worker, in call order: another connection's write lock
(SQLITE_BUSY at once), a group over ``_LOOP_MAX_BYTES``, calls from another
loop, and a commit that would start the WAL over (its header sync) or find
``_CHECKPOINT_FRAMES`` of its frames not yet copied into the database (the
worker's connection checkpoints after that commit), both told by the
wal-index header; a WAL past ``_WAL_MAX_FRAMES`` gets a RESTART checkpoint
from the worker. ``THREADLINE_IO_URING=0`` leaves every append to the worker.

Concurrency: appends run under ``BEGIN IMMEDIATE``, so an entry's ``seq`` (its
rowid, rising across the file) is taken while this connection holds the
database's write lock, and append order is commit order. Other writers wait
up to ``busy_timeout`` seconds. SQLite's write lock is not a queue: a waiter
sleeps in the busy handler and checks again, and the default handler sleeps
longer each time (1, 2, 5, 10 ... 100 ms). With several
writing processes a waiter that has backed off sleeps through many hand-offs
while the others keep taking the lock, so the latency tail grows far past a
commit's cost. So the connection's own busy timeout is only a short slice
(``_BUSY_SLICE``, in which SQLite checks after 1, 3 and 5 ms) and the store
retries slice after slice until ``busy_timeout``: no waiter sleeps more than
2 ms at a time, a much shorter tail for a little throughput (measured by
``bench/sql_stores.py``, in docs/benchmarks.md). The loop also covers the
busy cases in WAL mode that skip the busy handler.

Rows are compact (``session/_rows.py``): the session as an integer key, ids
as 16-byte keys, the timestamp as microseconds, and only the rest of the
codec's line in ``data``; a line that would not come back byte for byte from
that is kept whole. Either way a session copied between stores stays
byte-identical.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import queue
import sqlite3
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from threadline.errors import (
    ConfigError,
    CorruptLog,
    DurabilityError,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._rows import Row, compact, decode_compact, id_key, id_text, row_line
from threadline.session._store import (
    EntryLog,
    SessionPage,
    chain_after,
    decode_cursor,
    entry_not_found,
)
from threadline.session._storekit import (
    check_limit,
    check_record,
    check_retried_batch,
    check_session_id,
    from_micros,
    page_fetched,
    to_micros,
)
from threadline.session._uring import Ring, alone, ring_for, wanted
from threadline.session._watch import Wakeups, follow, unknown_after

__all__ = ["SQLiteStore"]

T = TypeVar("T")

# Longest single wait inside SQLite's busy handler; see the module docstring.
_BUSY_SLICE = 0.005

# Bytes of entries one transaction on the event loop may write (S46): a
# larger group, or one append this large, goes to the worker thread.
_LOOP_MAX_BYTES = 256 * 1024
# A WAL with this many frames not yet copied into the database is
# checkpointed by the next commit, on the worker (SQLite's auto-checkpoint,
# off on the loop's connection, whose commits must not copy the WAL and sync
# the database).
_CHECKPOINT_FRAMES = 1000
# A WAL this long (16 MiB of 4 KiB pages) gets a RESTART checkpoint from
# the worker: with no sync under the write lock, writers of several
# processes commit so often that a PASSIVE copy seldom catches up with them,
# and only one that does lets the WAL start over; RESTART holds the write
# lock while it copies, and waits for readers, so the next commit does.
_WAL_MAX_FRAMES = 4 * _CHECKPOINT_FRAMES
# The head of the wal-index (``<db>-shm``, https://sqlite.org/walformat.html),
# native byte order: iVersion at 0, isInit at 12, mxFrame (the last frame
# committed) at 16, and nBackfill (frames copied into the database) at 96.
_SHM_HEAD = 100
_SHM_VERSION = 3007000
_U32 = struct.Struct("=I")


def _compact_rows(conn: sqlite3.Connection) -> None:
    """Version 2: version 1's rows moved into compact rows (``session/_rows.py``).

    Runs inside the migration's write transaction, so a second process opening
    the same old file waits, then finds version 2 recorded and does nothing.
    """
    for stmt in _V2.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    keys = dict(conn.execute("SELECT id, key FROM sessions_v2"))
    # Entries whose session is gone (none should be) are not carried over.
    old = conn.execute("SELECT e.session_id, e.seq, e.id, e.parent_id, e.data FROM entries e "
                       "JOIN sessions s ON s.id = e.session_id ORDER BY e.session_id, e.seq")
    while batch := old.fetchmany(1000):
        conn.executemany("INSERT INTO entries_v2 (session, kind, id, parent, ts, data) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         [(keys[sid], *_old_row(entry_id, parent, data))
                          for sid, _, entry_id, parent, data in batch])
    for stmt in _V2_SWAP.split(";"):
        if stmt.strip():
            conn.execute(stmt)


def _old_row(entry_id: str, parent_id: str | None, data: Any) -> tuple[Any, ...]:
    """(kind, id, parent, ts, data) for a version 1 row; one that does not decode stays whole."""
    try:
        return compact(decode_entry(data), bytes(data))[:5]
    except CorruptLog:  # kept as it was, to be reported when loaded
        return (0, id_key(entry_id), None if parent_id is None else id_key(parent_id), None,
                data)


_V2 = """
    CREATE TABLE sessions_v2 (
        key INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after a delete
        id TEXT NOT NULL UNIQUE,
        parent_id TEXT,
        created_at INTEGER NOT NULL  -- microseconds since the Unix epoch, UTC
    );
    INSERT INTO sessions_v2 (id, parent_id, created_at)
        SELECT id, parent_id, created_at FROM sessions ORDER BY created_at, id;
    CREATE TABLE entries_v2 (
        -- The append order, across sessions: a rowid table appended at its
        -- end fills its pages (a WITHOUT ROWID table's leaves are ~80% full).
        seq INTEGER PRIMARY KEY,
        session INTEGER NOT NULL,    -- sessions.key
        kind INTEGER NOT NULL,       -- session/_rows.py KINDS, 0: data is the whole line
        id BLOB NOT NULL,            -- session/_rows.py id_key
        parent BLOB,
        ts INTEGER,                  -- microseconds since the Unix epoch (NULL when kind 0)
        data BLOB NOT NULL
    );
    CREATE UNIQUE INDEX entries_id ON entries_v2 (session, id);
    CREATE INDEX entries_order ON entries_v2 (session)  -- (session, seq): seq is the rowid
"""

_V2_SWAP = """
    DROP TABLE entries;
    DROP TABLE sessions;
    ALTER TABLE sessions_v2 RENAME TO sessions;
    ALTER TABLE entries_v2 RENAME TO entries;
    CREATE INDEX sessions_newest ON sessions (created_at DESC, id DESC)
"""

# Append-only: a released version is never edited, a change is a new version
# (SQL, or a function run in the migration's transaction).
MIGRATIONS: tuple[tuple[int, str | Callable[[sqlite3.Connection], None]], ...] = (
    (
        1,
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            parent_id TEXT,
            created_at INTEGER NOT NULL  -- microseconds since the Unix epoch, UTC
        ) WITHOUT ROWID;
        CREATE INDEX sessions_newest ON sessions (created_at DESC, id DESC);
        CREATE TABLE entries (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,        -- 1, 2, ... per session: the append order
            id TEXT NOT NULL,
            parent_id TEXT,
            type TEXT NOT NULL,
            data BLOB NOT NULL,          -- the codec's exact bytes
            PRIMARY KEY (session_id, seq),
            UNIQUE (session_id, id)
        ) WITHOUT ROWID;
        """,
    ),
    (2, _compact_rows),
)

# An entry row as decode_compact reads it.
_ROW = "e.seq, e.kind, e.id, e.parent, e.ts, e.data"

# Extended result codes that mean the write did not reach stable storage.
_DURABILITY_CODES = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CORRUPT", "SQLITE_NOTADB")


# (loop, future, call, last): after its last call a thread is free for another store.
_Job = tuple[asyncio.AbstractEventLoop | None, asyncio.Future[Any] | None, Callable[[], Any],
             bool]

# Threads released by closed stores, each waiting on its queue for the next
# store's job queue. Starting a thread cost 0.8-4.8 ms on this loaded 2-core
# machine (the scheduler runs a new thread behind the running ones, where it
# wakes a sleeping one at once), most of a cold open plus first load; a woken
# idle thread costs a hop (``bench/sql_stores.py``, "opening a store").
_idle: list[queue.SimpleQueue[queue.SimpleQueue[_Job]]] = []
_idle_guard = threading.Lock()
_IDLE_MAX = 4
# An idle thread ends after this long, so a process that stopped using SQLite
# keeps no threads.
_IDLE_SECONDS = 60.0


def _forget_idle() -> None:
    # A forked child has none of its parent's threads: a queue handed to one
    # of them would never be served.
    _idle.clear()
    _idle_guard.release()


# Held across fork, so the child's copy is never locked by a thread it lacks.
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(before=_idle_guard.acquire, after_in_parent=_idle_guard.release,
                        after_in_child=_forget_idle)


class _Worker:
    """The store's one thread: runs calls in order, answers each caller's event loop.

    A queue and a callback into the caller's loop: half the cost of a round
    trip through ``run_in_executor`` (measured 36 against 70 us on this
    2-core machine under load), which is paid on every append. The thread
    serves this store alone until its last call, then may serve a later store.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._started = False
        # Set once the last call is queued. Checked under the guard, so a call
        # from another thread racing close() is refused instead of queued
        # behind the last call, where no thread would ever take it.
        self._ended = False
        self._guard = threading.Lock()

    def call(self, fn: Callable[[], T], *, last: bool = False) -> asyncio.Future[T]:
        """Run ``fn`` on the thread; with ``last``, nothing may be called after it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._put(loop, fut, fn, last)
        return fut

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the thread, no answer: it settles its callers' futures itself."""
        self._put(None, None, fn, False)

    def last(self, fn: Callable[[], Callable[[], None]]) -> None:
        """``post`` ``fn`` as the last call: nothing may be called after it.

        What ``fn`` returns is called once the thread is free for another
        store, so that callers it tells find the thread released."""
        self._put(None, None, fn, True)

    def _put(self, loop: asyncio.AbstractEventLoop | None, fut: asyncio.Future[Any] | None,
             fn: Callable[[], Any], last: bool) -> None:
        with self._guard:
            if self._ended:
                raise _Ended
            if not self._started:
                self._start()
            self._jobs.put((loop, fut, fn, last))
            self._ended = last

    def _start(self) -> None:
        with _idle_guard:
            handoff = _idle.pop() if _idle else None
        if handoff is not None:
            handoff.put(self._jobs)
        else:
            threading.Thread(target=_serve, args=(self._jobs,), name="threadline-sqlite",
                             daemon=True).start()
        self._started = True


class _Ended(Exception):
    """A call came after the store's last call (close) was queued."""


def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
    while True:
        loop, fut, fn, last = jobs.get()
        result, error = None, None
        # Cancelled before it started: it never runs, unless it closes the store.
        if last or fut is None or not fut.cancelled():
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                error = exc
        handoff: queue.SimpleQueue[queue.SimpleQueue[_Job]] | None = None
        if last:
            # Idle before the caller hears of it, so a store it opens next finds this thread.
            with _idle_guard:
                if len(_idle) < _IDLE_MAX:
                    handoff = queue.SimpleQueue()
                    _idle.append(handoff)
        if loop is not None and fut is not None:
            _answer(loop, fut, result, error)
        elif last and callable(result):
            result()
        del fut, fn, result, error  # hold nothing of a finished call while idle
        if last:
            if handoff is None:
                return
            next_jobs = _wait_for_store(handoff)
            if next_jobs is None:
                return
            jobs = next_jobs


def _wait_for_store(
        handoff: queue.SimpleQueue[queue.SimpleQueue[_Job]]) -> queue.SimpleQueue[_Job] | None:
    """The next store's job queue, or None once the thread has been idle too long."""
    while True:
        try:
            return handoff.get(timeout=_IDLE_SECONDS)
        except queue.Empty:
            with _idle_guard:
                if any(h is handoff for h in _idle):
                    _idle[:] = [h for h in _idle if h is not handoff]
                    return None
            # A store took this thread just now: its queue is on the way.


def _answer(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: Any,
            error: BaseException | None) -> None:
    with contextlib.suppress(RuntimeError):  # the caller's loop has closed
        loop.call_soon_threadsafe(_settle, fut, result, error)


def _answer_after(append: _Append, fn: Callable[[], None]) -> None:
    try:
        fn()
    except BaseException as exc:
        _answer(append.loop, append.done, None, exc)
    else:
        _answer(append.loop, append.done, None, None)


# An append and what its caller is told: None (stored) or the error.
_Outcome = tuple["_Append", BaseException | None]


def _deliver_all(outcomes: list[_Outcome], here: asyncio.AbstractEventLoop | None) -> None:
    """Settle each call from ``here`` (the running loop, or None on a thread)."""
    for append, error in outcomes:
        if here is append.loop:
            _settle(append.done, None, error)
        else:
            _answer(append.loop, append.done, None, error)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)


@dataclass(slots=True)
class _Append:
    """One ``append_entries`` call waiting for the worker."""

    session_id: str
    entries: Sequence[Entry]
    datas: list[bytes]
    rows: list[Row]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None]

    def batch(self) -> list[tuple[str, bytes]]:
        return [(e.id, d) for e, d in zip(self.entries, self.datas, strict=True)]


class _Home:
    """The event loop that commits the store's appends itself (S46), and its group in flight."""

    __slots__ = ("loop", "ring", "syncing")

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: Ring) -> None:
        self.loop = loop
        self.ring = ring
        self.syncing: tuple[list[_Append], dict[int, BaseException]] | None = None
        """The committed group whose fdatasync the ring has, and its refused calls."""


class _WouldWait(Exception):
    """Another connection holds the write lock: the group is the worker's to wait for."""


def _record(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(id=row[0], parent_id=row[1], created_at=from_micros(row[2]))


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    # SQLITE_PROTOCOL: a read lost the race for the WAL's locks a hundred times; transient.
    return (name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PROTOCOL"))
            or "database is locked" in str(exc))


class SQLiteStore:
    """A ``CatalogStore`` in one SQLite file.

    ``path`` is the database file (created with its folder if missing, unless
    ``create=False``: then a missing file is a ``StoreError``).
    ``synchronous`` is ``"FULL"`` (default, survives power loss) or
    ``"NORMAL"``. ``busy_timeout`` is how many seconds an operation waits for
    another process's write lock before failing with ``StoreError``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 30.0,
        create: bool = True,
    ) -> None:
        sync = str(synchronous).upper()
        if sync not in ("FULL", "NORMAL"):
            raise ConfigError(f"SQLiteStore synchronous must be FULL or NORMAL, got "
                              f"{synchronous!r} (for {os.fspath(path)})")
        if not busy_timeout >= 0:
            raise ConfigError(f"SQLiteStore busy_timeout must be >= 0 seconds, got "
                              f"{busy_timeout!r} (for {os.fspath(path)})")
        self.path = os.fspath(path)
        self.synchronous = sync
        self.busy_timeout = float(busy_timeout)
        self._create = create
        self._conn: sqlite3.Connection | None = None
        self._poisoned: BaseException | None = None
        self._closed = False
        self._worker = _Worker()
        self._queued: list[_Append] = []  # appends not yet taken, in call order
        self._queued_guard = threading.Lock()
        # Who takes the queued appends now: the home loop, the worker, or no
        # one (the next append starts one). Changed under _queued_guard.
        self._busy: Literal["loop", "worker"] | None = None
        self._home: _Home | None = None
        self._closers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Set by the worker once its connection is open (S46): the database
        # file as SQLite names it, and the WAL, which the store fdatasyncs
        # itself after each commit when synchronous is FULL.
        self._db_file = self.path
        self._wal_fd = -1
        self._loop_possible = False
        self._loop_wanted = False
        self._ring_wanted = wanted()  # read once: S46's switch, for the stores made after it
        self._lconn: sqlite3.Connection | None = None  # the home loop's; opened by the worker
        self._shm_fd = -1
        self._restarting = False
        self._wakeups = Wakeups()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    async def __aenter__(self) -> SQLiteStore:
        await self._call(lambda conn: None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the worker thread ------------------------------------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError(f"{self.path}: store is closed")
        try:
            fut = self._worker.call(lambda: self._run(fn))
        except _Ended:
            raise StoreError(f"{self.path}: store is closed") from None
        return await fut

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._connection())

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        target = self.path
        try:
            if self._create:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            elif not os.path.isfile(self.path):
                raise StoreError(f"no SQLite store at {self.path}: the file does not exist")
            else:
                # mode=rw: if the file vanished since the check, fail rather than create it.
                target = Path(os.path.abspath(self.path)).as_uri() + "?mode=rw"
            # isolation_level=None: transactions are begun explicitly below.
            conn = sqlite3.connect(target, timeout=min(self.busy_timeout, _BUSY_SLICE),
                                   isolation_level=None, check_same_thread=False,
                                   uri=not self._create)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open SQLite database: {exc}") from exc
        try:
            mode = self._retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_FRAMES}")
            self._migrate(conn)
            if mode == ("wal",):
                self._own_sync(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._translate(exc, "opening the database") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _own_sync(self, conn: sqlite3.Connection) -> None:
        """FULL as NORMAL plus an fdatasync of the WAL by the store (see the module docstring).

        The WAL's name is SQLite's own (the database's full path, links
        resolved, plus ``-wal``); where it cannot be opened, or there is no
        fdatasync, SQLite syncs inside each commit as it did.
        """
        # The PRAGMA rather than its table-valued form, which older SQLite lacks.
        files = {name: file for _, name, file in conn.execute("PRAGMA database_list")}
        if not files.get("main"):
            return
        self._db_file = files["main"]
        if self.synchronous == "FULL":
            if not hasattr(os, "fdatasync"):
                return
            try:
                wal = os.open(self._db_file + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return
            try:
                conn.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                os.close(wal)
                raise
            self._wal_fd = wal
        with contextlib.suppress(OSError):  # the wal-index, read for _wal_frames
            self._shm_fd = os.open(self._db_file + "-shm", os.O_RDONLY | os.O_CLOEXEC)
        self._loop_possible = self._shm_fd >= 0

    def _migrate(self, conn: sqlite3.Connection) -> None:
        def current() -> int:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                         "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            return int(row[0] or 0)

        if self._retry_busy(current) >= MIGRATIONS[-1][0]:
            return

        def apply() -> None:
            # BEGIN IMMEDIATE: a second process opening at the same time waits
            # here, then sees the versions the first one recorded.
            for version, script in MIGRATIONS:
                if version > current():
                    if callable(script):
                        script(conn)
                    else:
                        for stmt in script.split(";"):
                            if stmt.strip():
                                conn.execute(stmt)
                    conn.execute("INSERT INTO schema_migrations VALUES (?, ?)",
                                 (version, datetime.now(UTC).isoformat()))

        self._write(conn, apply)

    def _retry_busy(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying ``SQLITE_BUSY`` until ``busy_timeout`` has passed.

        Every statement that can meet another process's lock goes through here:
        the connection's own busy timeout is only ``_BUSY_SLICE``."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            started = time.monotonic()
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                now = time.monotonic()
                if not _is_busy(exc) or now >= deadline:
                    raise
                if now - started < _BUSY_SLICE / 2:
                    time.sleep(0.001)  # busy without the handler sleeping: don't spin

    def _write(self, conn: sqlite3.Connection, body: Callable[[], T]) -> T:
        """Run ``body`` in a write transaction holding the database's write lock."""
        self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            result = body()
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            self._retry_busy(lambda: conn.execute("COMMIT"))
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def _write_one(self, conn: sqlite3.Connection, statement: Callable[[], T]) -> T:
        """``_write`` for a body of one statement: that statement in autocommit.

        The same transaction with two statements fewer: SQLite takes the write
        lock when the statement starts, before it reads anything (so a row's
        ``seq`` is still taken under the lock), commits it with the same fsync
        when it ends, and leaves nothing written when it fails."""
        try:
            return self._retry_busy(statement)
        except sqlite3.Error:
            if conn.in_transaction:  # not left open by SQLite, but never leave it open
                conn.execute("ROLLBACK")
            raise

    def _translate(self, exc: sqlite3.Error, what: str, session_id: str | None = None,
                   *, writing: bool = False) -> StoreError:
        name = getattr(exc, "sqlite_errorname", "")
        where = f"{self.path}: {what}" + (f" (session {session_id!r})" if session_id else "")
        if _is_busy(exc):
            return StoreError(f"{where}: database still locked after {self.busy_timeout:g}s "
                              f"busy timeout: {exc}", session_id=session_id)
        if writing and name.startswith(_DURABILITY_CODES):
            err = DurabilityError(f"{where}: write not durable ({name}: {exc}); this store "
                                  f"refuses further appends", session_id=session_id)
            self._poisoned = err
            return err
        return StoreError(f"{where}: {name or type(exc).__name__}: {exc}",
                          session_id=session_id)

    def _check_writable(self, session_id: str) -> None:
        if self._poisoned is not None:
            raise self._refusal(session_id)

    def _refusal(self, session_id: str) -> DurabilityError:
        err = DurabilityError(f"{self.path}: an earlier write failed to be durable; this "
                              f"store refuses writes, reopen it", session_id=session_id)
        err.__cause__ = self._poisoned
        return err

    # -- the Store contract -----------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        sid = check_record(record)
        self._check_writable(sid)
        created = to_micros(record.created_at)

        def op(conn: sqlite3.Connection) -> None:
            try:
                self._write_one(conn, lambda: conn.execute(
                    "INSERT INTO sessions (id, parent_id, created_at) VALUES (?, ?, ?)",
                    (sid, record.parent_id, created)))
            except sqlite3.IntegrityError as exc:
                raise SessionExists(sid, self.path) from exc
            except sqlite3.Error as exc:
                raise self._translate(exc, "create_session", sid, writing=True) from exc
            self._durable("create_session", sid)

        await self._call(op)

    async def load_entries(self, session_id: str) -> EntryLog:
        sid = check_session_id(session_id)

        def op(conn: sqlite3.Connection) -> list[tuple[Any, Any]]:
            try:
                # One statement, so one snapshot: existence and entries agree.
                return self._retry_busy(lambda: conn.execute(
                    f"SELECT {_ROW} FROM sessions s LEFT JOIN entries e "
                    "ON e.session = s.key WHERE s.id = ? ORDER BY e.seq", (sid,)).fetchall())
            except sqlite3.Error as exc:
                raise self._translate(exc, "load_entries", sid) from exc

        rows = await self._call(op)
        if not rows:
            raise SessionNotFound(sid, self.path)
        return decode_compact(rows, sid, self.path)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        sid = check_session_id(session_id)
        self._check_writable(sid)
        # Encode first: a non-entry or an entry that cannot be stored is
        # InvalidEntry before any of its attributes are read for the row.
        datas = [encode_entry(e, session_id=sid) for e in entries]
        rows = [compact(e, data) for e, data in zip(entries, datas, strict=True)]

        if not rows:
            await self.load_session(sid)  # an empty append still requires the session
            return
        loop = asyncio.get_running_loop()
        append = _Append(sid, entries, datas, rows, loop, loop.create_future())
        now = None
        with self._queued_guard:
            # Under the guard: once close() has seen no one busy, no append
            # may start the loop or the worker again.
            if self._closed:
                raise StoreError(f"{self.path}: store is closed", session_id=sid)
            self._queued.append(append)
            if self._busy is None:
                now = self._start_locked(loop, append)
            elif (self._busy == "loop" and self._home is not None
                  and self._home.loop.is_closed()):
                self._abandon_locked()
        if now is not None:
            self._loop_group(now)
        await append.done
        self._wakeups.ring(sid)

    # -- who commits the queued appends (S42, S46) ---------------------------------

    def _start_locked(self, loop: asyncio.AbstractEventLoop, append: _Append) -> _Home | None:
        """Hand the queue to this loop, where it has a ring, or else to the worker.

        The home to commit on at once, once the guard is let go, if nothing
        else is due on the loop before it waits: no other task could join
        the group a turn later.
        """
        home = self._home
        if home is not None and home.loop is not loop and home.loop.is_closed():
            home = self._home = None  # nothing of its loop is in flight: no one is busy
        if home is None:
            ring = ring_for(loop) if self._ring_wanted else None
            if ring is not None:
                if self._lconn is None:
                    self._loop_wanted = True  # the worker opens it after this append
                else:
                    home = self._home = _Home(loop, ring)
        if home is not None and home.loop is loop:
            self._busy = "loop"
            if alone(loop):
                return home
            # Started once the tasks running now have queued their appends
            # too, so that one transaction and one sync take them all (S42).
            loop.call_soon(self._loop_group, home)
            return None
        try:
            self._worker.post(self._drain)
        except _Ended:
            self._queued.remove(append)
            raise StoreError(f"{self.path}: store is closed",
                             session_id=append.session_id) from None
        self._busy = "worker"
        return None

    def _take_locked(self) -> list[_Append]:
        queued, self._queued = self._queued, []
        return [a for a in queued if not a.done.cancelled()]  # cancelled: never stored

    def _idle_locked(self) -> None:
        """No one is busy now; a close() that waited for that closes the store."""
        self._busy = None
        if self._closers:
            with contextlib.suppress(_Ended):  # another close() got there first
                self._worker.last(self._close_now)

    def _to_worker(self, group: list[_Append]) -> None:
        """Leave ``group`` and what queued behind it to the worker thread."""
        with self._queued_guard:
            self._queued[:0] = group
            self._busy = "worker"
            # Never _Ended: close() posts its last call only once no one is busy.
            self._worker.post(self._drain)

    def _abandon_locked(self) -> None:
        """Take the queue from a home loop that closed: nothing will run on it again.

        Its group in flight (if any) is committed and its sync submitted; its
        callers are gone with their loop, and a retry of those appends is
        safe (S25).
        """
        assert self._home is not None
        self._home.syncing = None
        self._home = None
        self._busy = "worker"
        self._worker.post(self._drain)

    def _drain(self) -> None:
        """Worker: commit one group of queued appends; post itself again while more queue."""
        with self._queued_guard:
            group = self._take_locked()
        outcomes: list[_Outcome] = []
        if group:
            if self._loop_wanted and self._lconn is None:
                # Before the group's callers hear back: their next appends find it open.
                self._open_loop_connection()
            outcomes = self._commit_group(group)
            self._wal_frames()  # a RESTART checkpoint next, if the WAL is too long
        with self._queued_guard:
            if self._queued:
                # A job of its own per group: calls queued meanwhile run in between.
                self._worker.post(self._drain)
            else:
                self._idle_locked()
        # Told only now: a caller's next append finds no one busy and may
        # start the loop, rather than queue behind this thread's last look.
        _deliver_all(outcomes, None)

    def _commit_group(self, appends: list[_Append]) -> list[_Outcome]:
        """Store the appends of one group on the worker thread: what to tell each caller.

        Appends that queued up while the thread or the loop was busy (several
        tasks of this process) share one transaction, so one sync: each in a
        savepoint of its own, so each is whole or absent and a refused one
        (a conflicting id, a missing session) fails only its caller. An error
        of the transaction itself fails them all, none of them stored.
        """
        try:
            conn = self._connection()
        except BaseException as exc:
            return self._outcomes(appends, {}, exc, None)
        if self._poisoned is not None:
            return [(a, self._refusal(a.session_id)) for a in appends]
        if len(appends) == 1:
            try:
                self._commit_one(conn, appends[0])
            except BaseException as exc:
                return [(appends[0], exc)]
            return [(appends[0], None)]
        refused: dict[int, BaseException] = {}
        try:
            self._write(conn, lambda: self._insert_each(conn, appends, refused))
            self._sync()
        except BaseException as exc:
            return self._outcomes(appends, {}, exc, None)
        return self._outcomes(appends, refused, None, None)

    def _outcomes(self, appends: list[_Append], refused: dict[int, BaseException],
                  error: BaseException | None, here: asyncio.AbstractEventLoop | None
                  ) -> list[_Outcome]:
        """What to tell each caller of a group; ``error`` is the whole group's.

        A call refused for a repeated id is checked after the commit, as a
        call made alone would be: an append of this same group may have
        stored these entries (S25). On the worker (``here`` None) that is
        done at once; from the loop it is posted to the worker, which tells
        that caller itself (it is left out of what is returned).
        """
        outcomes: list[_Outcome] = []
        for n, a in enumerate(appends):
            failure = error
            if isinstance(error, sqlite3.Error):
                failure = self._translate(error, "append_entries", a.session_id, writing=True)
                failure.__cause__ = error
            elif isinstance(error, OSError):  # the WAL's fdatasync
                failure = self._not_durable("append_entries", a.session_id, error)
            elif error is None:
                failure = refused.get(n)
            if not isinstance(failure, sqlite3.IntegrityError):
                outcomes.append((a, failure))
            elif here is None:
                try:
                    self._check_stored(a)
                except BaseException as exc:
                    outcomes.append((a, exc))
                else:
                    outcomes.append((a, None))
            else:
                try:
                    self._worker.post(partial(_answer_after, a, partial(self._check_stored, a)))
                except _Ended:  # not while a group is in flight; never left waiting
                    outcomes.append((a, StoreError(f"{self.path}: store is closed",
                                                   session_id=a.session_id)))
        return outcomes

    def _check_stored(self, a: _Append) -> None:
        self._refuse_unless_stored(self._connection(), a.session_id, a.batch(), "append_entries")

    def _commit_one(self, conn: sqlite3.Connection, a: _Append) -> None:
        try:
            if len(a.rows) == 1:
                self._write_one(conn, lambda: self._insert(conn, a.session_id, a.rows))
            else:
                self._write(conn, lambda: self._insert(conn, a.session_id, a.rows))
        except sqlite3.IntegrityError:
            pass  # an id already stored: a retry of a stored append, or a conflict
        except sqlite3.Error as exc:
            raise self._translate(exc, "append_entries", a.session_id, writing=True) from exc
        else:
            self._durable("append_entries", a.session_id)
            return
        self._refuse_unless_stored(conn, a.session_id, a.batch(), "append_entries")

    def _insert_each(self, conn: sqlite3.Connection, appends: list[_Append],
                     refused: dict[int, BaseException]) -> None:
        for n, a in enumerate(appends):
            conn.execute("SAVEPOINT one_append")
            try:
                self._insert(conn, a.session_id, a.rows)
            except (sqlite3.IntegrityError, SessionNotFound) as exc:
                conn.execute("ROLLBACK TO one_append")
                refused[n] = exc
            conn.execute("RELEASE one_append")

    # -- appends committed on the event loop (S46) ----------------------------------

    def _loop_group(self, home: _Home) -> None:
        """Commit what queued, on the home loop; its fdatasync goes to the ring.

        A loop callback, no task (a task's steps cost a turn of the loop
        each). Only what cannot wait runs here: the loop's connection has no
        busy timeout, so a write lock held by another connection is
        SQLITE_BUSY at once and the group goes to the worker, which waits
        for it; so do a group from another loop, a big one, and the first
        commit after a checkpoint emptied the WAL (SQLite syncs the new WAL
        header inside that commit).
        """
        with self._queued_guard:
            if self._home is not home:
                return  # the worker took the queue over
            group = self._take_locked()
            if not group:
                self._idle_locked()
                return
        if self._poisoned is not None:  # queued behind a sync that failed: none is stored
            _deliver_all([(a, self._refusal(a.session_id)) for a in group], home.loop)
            self._loop_next(home)
            return
        conn = self._lconn
        if (conn is None or any(a.loop is not home.loop for a in group)
                or sum(len(d) for a in group for d in a.datas) > _LOOP_MAX_BYTES
                or not self._wal_allows_loop_commit()):
            self._to_worker(group)
            return
        refused: dict[int, BaseException] = {}
        try:
            self._commit_on_loop(conn, group, refused)
        except _WouldWait:
            # Measured: trying again on the loop a millisecond later (its
            # selector sleeps whole milliseconds) lost rate and p50 against
            # the worker waiting in SQLite's busy handler.
            self._to_worker(group)
            return
        except Exception as exc:
            _deliver_all(self._outcomes(group, {}, exc, home.loop), home.loop)
            self._loop_next(home)
            return
        if self._wal_fd < 0:  # synchronous=NORMAL: committed is all that was asked
            _deliver_all(self._outcomes(group, refused, None, home.loop), home.loop)
            self._loop_next(home)
            return
        home.syncing = (group, refused)
        try:
            home.ring.fdatasync(self._wal_fd, partial(self._loop_synced, home))
        except OSError:
            # A ring that does not take it: the worker makes the sync, then
            # answers, and goes on with the queue.
            home.syncing = None
            with self._queued_guard:
                self._busy = "worker"
                self._worker.post(partial(self._sync_then_drain, group, refused))

    def _commit_on_loop(self, conn: sqlite3.Connection, group: list[_Append],
                        refused: dict[int, BaseException]) -> None:
        """The group's transaction on the loop's connection; _WouldWait if it must wait."""
        try:
            if len(group) == 1 and len(group[0].rows) == 1:
                try:  # one statement: its own transaction, as _write_one
                    self._insert(conn, group[0].session_id, group[0].rows)
                except (sqlite3.IntegrityError, SessionNotFound) as exc:
                    refused[0] = exc
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._insert_each(conn, group, refused)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _WouldWait from exc
            raise

    def _loop_synced(self, home: _Home, result: int) -> None:
        """The ring's report of a group's fdatasync, on the loop: settle it, go on."""
        if home.syncing is None:
            return  # taken over by the worker: its callers' loop had closed
        (group, refused), home.syncing = home.syncing, None
        error: OSError | None = None
        try:
            self._after_sync(result)
        except OSError as exc:
            error = exc
        _deliver_all(self._outcomes(group, refused, error, home.loop), home.loop)
        self._loop_next(home)

    def _loop_next(self, home: _Home) -> None:
        with self._queued_guard:
            queued = bool(self._queued)
        if queued:
            self._loop_group(home)
        else:
            # The callers just settled run first, and what they append next
            # goes in one group.
            home.loop.call_soon(self._loop_group, home)

    def _sync_then_drain(self, group: list[_Append], refused: dict[int, BaseException]) -> None:
        try:
            self._sync()
        except OSError as exc:
            _deliver_all(self._outcomes(group, {}, exc, None), None)
        else:
            _deliver_all(self._outcomes(group, refused, None, None), None)
        self._drain()

    def _wal_frames(self) -> tuple[int, int] | None:
        """The WAL's frames and how many are copied into the database; None if unknown.

        Read from the wal-index without a lock, so possibly stale. Asks the
        worker for a RESTART checkpoint once the WAL is _WAL_MAX_FRAMES long
        (any caller holds a group, so close() has not queued its last call).
        """
        try:
            head = os.pread(self._shm_fd, _SHM_HEAD, 0)
        except OSError:
            return None
        if len(head) < _SHM_HEAD or _U32.unpack_from(head, 0)[0] != _SHM_VERSION or not head[12]:
            return None
        frames: int = _U32.unpack_from(head, 16)[0]
        if frames >= _WAL_MAX_FRAMES and not self._restarting:
            self._restarting = True
            self._worker.post(self._restart_wal)
        return frames, _U32.unpack_from(head, 96)[0]

    def _wal_allows_loop_commit(self) -> bool:
        """Whether a commit now only writes frames: no WAL header, no checkpoint.

        A stale answer costs at most one header sync on the loop, or one
        group on the worker.
        """
        wal = self._wal_frames()
        if wal is None:
            return False
        frames, copied = wal
        # Every frame copied (or none yet): the next commit starts the WAL
        # over and syncs its new header. Many frames not copied: the next
        # commit copies them into the database (the worker's connection
        # checkpoints after its commit, in that thread, so no commit of this
        # store lands in between; alone, the copy completes and the commit
        # after starts the WAL over). Counted from the last copy, not from
        # the WAL's start, up to _WAL_MAX_FRAMES: where other processes keep
        # writing a copy seldom completes, and the WAL's length alone sent
        # most commits here (8 processes: 30% of groups on the loop, against
        # 55-58%).
        return frames != copied and frames - copied < _CHECKPOINT_FRAMES

    def _restart_wal(self) -> None:
        """Worker: copy the whole WAL into the database, so the next commit starts it over."""
        try:
            # Within the connection's busy slice, or it reports busy and
            # copies what it can; the WAL's length asks again later.
            self._connection().execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "").startswith(_DURABILITY_CODES):
                self._translate(exc, "checkpoint", writing=True)  # poisons the store
        finally:
            self._restarting = False

    def _open_loop_connection(self) -> None:
        """Worker: the home loop's connection, ready before the loop first uses it.

        Opening it reads the WAL's index (after a crash, rebuilds it from the
        WAL), which must not happen on the loop. No busy timeout and no
        auto-checkpoint: a commit on the loop never waits and never copies
        the WAL.
        """
        self._loop_wanted = False
        try:
            self._connection()  # decides _loop_possible
        except BaseException:
            return  # the group's commit reports it
        if not self._loop_possible:
            return
        try:
            conn = sqlite3.connect(self._db_file, timeout=0, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute("SELECT 1 FROM sessions LIMIT 1").fetchall()
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error:
            self._loop_possible = False  # the worker commits every append, as before
            return
        self._lconn = conn

    # -- durability ---------------------------------------------------------------

    def _sync(self) -> None:
        """Make what this store committed durable: an fdatasync of the WAL (S46)."""
        if self._wal_fd >= 0:
            os.fdatasync(self._wal_fd)
            self._after_sync(0)

    def _after_sync(self, result: int) -> None:
        """Raise the OSError a sync's ``result`` (0 or -errno) stands for.

        Once one sync failed, none that follows proves anything: the kernel
        reports a writeback error once per open file, so a later sync of the
        same descriptor may succeed with the pages lost.
        """
        if result < 0:
            raise OSError(-result, os.strerror(-result))
        if self._poisoned is not None:
            raise OSError(errno.EIO, "an earlier write or sync of this store failed")

    def _durable(self, what: str, session_id: str | None) -> None:
        try:
            self._sync()
        except OSError as exc:
            raise self._not_durable(what, session_id, exc) from exc

    def _not_durable(self, what: str, session_id: str | None, exc: OSError) -> DurabilityError:
        where = f"{self._db_file}-wal: {what}" + (
            f" (session {session_id!r})" if session_id else "")
        err = DurabilityError(f"{where}: fdatasync failed ({exc}); this store refuses further "
                              f"writes", session_id=session_id)
        err.__cause__ = exc
        if self._poisoned is None:
            self._poisoned = err
        return err

    # -- beyond the contract ----------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        sid = check_session_id(session_id)

        def op(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            try:
                row: tuple[Any, ...] | None = self._retry_busy(lambda: conn.execute(
                    "SELECT id, parent_id, created_at FROM sessions WHERE id = ?",
                    (sid,)).fetchone())
                return row
            except sqlite3.Error as exc:
                raise self._translate(exc, "load_session", sid) from exc

        row = await self._call(op)
        if row is None:
            raise SessionNotFound(sid, self.path)
        return _record(row)

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        check_limit(limit)
        after = None if cursor is None else decode_cursor(cursor)

        def op(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if after is None:
                sql = ("SELECT id, parent_id, created_at FROM sessions "
                       "ORDER BY created_at DESC, id DESC LIMIT ?")
                args: tuple[Any, ...] = (limit + 1,)
            else:
                sql = ("SELECT id, parent_id, created_at FROM sessions "
                       "WHERE (created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT ?")
                args = (to_micros(after[0]), after[1], limit + 1)
            try:
                return self._retry_busy(lambda: conn.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise self._translate(exc, "list_sessions") from exc

        rows = await self._call(op)
        return page_fetched([_record(r) for r in rows], limit)

    async def delete_session(self, session_id: str) -> None:
        sid = check_session_id(session_id)
        self._check_writable(sid)

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute("DELETE FROM sessions WHERE id = ? RETURNING key",
                               (sid,)).fetchone()
            if row is None:
                raise SessionNotFound(sid, self.path)
            conn.execute("DELETE FROM entries WHERE session = ?", (row[0],))

        def op(conn: sqlite3.Connection) -> None:
            try:
                self._write(conn, lambda: body(conn))
            except sqlite3.Error as exc:
                raise self._translate(exc, "delete_session", sid, writing=True) from exc
            self._durable("delete_session", sid)

        await self._call(op)

    async def close(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        with self._queued_guard:
            self._closed = True  # no append may start after this
            self._closers.append((loop, closed))
            if self._busy is None:
                self._idle_locked()  # queues the last call
            elif (self._busy == "loop" and self._home is not None
                  and self._home.loop.is_closed()):
                self._abandon_locked()
        # Shielded: a cancelled close() still closes once the appends in
        # flight are done (the last call is queued when they are).
        await asyncio.shield(closed)

    def _close_now(self) -> Callable[[], None]:
        """Worker, last call: close the connections and the WAL's descriptors.

        Returns what tells the close() callers, called once the thread is released."""
        error: BaseException | None = None
        for conn in (self._lconn, self._conn):
            try:
                if conn is not None:
                    conn.close()
            except BaseException as exc:  # handed to each close() caller
                error = error or exc
        self._lconn = self._conn = None
        for fd in (self._shm_fd, self._wal_fd):
            if fd >= 0:
                os.close(fd)
        self._shm_fd = self._wal_fd = -1
        with self._queued_guard:
            closers, self._closers = self._closers, []

        def tell() -> None:
            for loop, closed in closers:
                _answer(loop, closed, None, error)

        return tell

    watch_interval: float = 0.05
    """Seconds between two reads of a watched session that had nothing new."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session (S26) by polling every ``watch_interval`` seconds.

        SQLite has no notification between processes, so a watcher reads
        ``seq > last`` again; the read is one index range scan.
        """
        sid = check_session_id(session_id)

        def start(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT key, (SELECT seq FROM entries WHERE session = key AND id = ?) "
                "FROM sessions WHERE id = ?",
                (None if after is None else id_key(after), sid)).fetchone()
            if row is None:
                raise SessionNotFound(sid, self.path)
            if after is None:
                return 0
            if row[1] is None:
                raise unknown_after(sid, after, self.path)
            return int(row[1])

        def read(conn: sqlite3.Connection, position: int) -> tuple[list[Entry], int]:
            rows = self._retry_busy(lambda: conn.execute(
                f"SELECT {_ROW} FROM sessions s JOIN entries e ON e.session = s.key "
                "WHERE s.id = ? AND e.seq > ? ORDER BY e.seq LIMIT 1000",
                (sid, position)).fetchall())
            return decode_compact(rows, sid, self.path), (rows[-1][0] if rows else position)

        async def call(fn: Callable[[sqlite3.Connection], T]) -> T:
            try:
                return await self._call(fn)
            except sqlite3.Error as exc:
                raise self._translate(exc, "watch", sid) from exc

        return follow(sid, lambda: call(start),
                      lambda position: call(lambda conn: read(conn, position)),
                      self._wakeups, self.watch_interval)
    # -- the linear capability (S32) ----------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        sid = check_session_id(session_id)
        stored: list[Entry] = list(entries)

        def body(conn: sqlite3.Connection) -> None:
            # Inside BEGIN IMMEDIATE: the last entry cannot change before the insert.
            # A retry (S25) keeps the parent its first entry was stored with.
            row = conn.execute(
                "SELECT (SELECT e.parent FROM entries e WHERE e.session = s.key AND e.id = ?), "
                "(SELECT e.id FROM entries e WHERE e.session = s.key ORDER BY e.seq DESC "
                "LIMIT 1), (SELECT 1 FROM entries e WHERE e.session = s.key AND e.id = ?) "
                "FROM sessions s WHERE s.id = ?",
                (id_key(entries[0].id), id_key(entries[0].id), sid)).fetchone()
            if row is None:
                raise SessionNotFound(sid, self.path)
            parent = row[0] if row[2] is not None else row[1]
            stored[:] = chain_after(entries, None if parent is None else id_text(parent))
            self._insert(conn, sid, [compact(e, encode_entry(e, session_id=sid))
                                     for e in stored])

        self._check_writable(sid)
        if not entries:
            await self.load_session(sid)
            return []

        def op(conn: sqlite3.Connection) -> None:
            try:
                self._write(conn, lambda: body(conn))
            except sqlite3.IntegrityError:
                pass  # an id already stored: a retry of a stored append, or a conflict
            except sqlite3.Error as exc:
                raise self._translate(exc, "append_linear", sid, writing=True) from exc
            else:
                self._durable("append_linear", sid)
                return
            self._refuse_unless_stored(conn, sid, [(e.id, encode_entry(e)) for e in stored],
                                       "append_linear")

        await self._call(op)
        self._wakeups.ring(sid)
        return stored

    def _refuse_unless_stored(self, conn: sqlite3.Connection, sid: str,
                              batch: list[tuple[str, bytes]], what: str) -> None:
        """Return if ``batch`` (id, bytes) is stored already as one run (S25); else refuse it.

        Stored is not yet durable when another call's sync is still in flight
        (S46), so a retry is acknowledged after a sync of its own."""
        marks = ",".join("?" * len(batch))
        try:
            stored = self._retry_busy(lambda: conn.execute(
                f"SELECT {_ROW} FROM sessions s JOIN entries e ON e.session = s.key "
                f"WHERE s.id = ? AND e.id IN ({marks})",
                (sid, *(id_key(i) for i, _ in batch))).fetchall())
        except sqlite3.Error as exc:
            raise self._translate(exc, what, sid) from exc
        check_retried_batch(sid, batch, {
            id_text(r[2]): (r[0], row_line(r, sid, self.path)) for r in stored},
            str(self.path))
        self._durable(what, sid)

    def _insert(self, conn: sqlite3.Connection, sid: str, rows: Sequence[Row]) -> None:
        """Insert ``rows`` after the session's last entry (inside a write transaction)."""
        # One statement per row, the session's key looked up in it: the
        # fewer statements under the write lock, the sooner the next writer has it.
        insert = ("INSERT INTO entries (session, kind, id, parent, ts, data) "
                  "SELECT key, ?, ?, ?, ?, ? FROM sessions WHERE id = ?")
        if len(rows) == 1:
            added = conn.execute(insert, (*rows[0], sid)).rowcount
        else:
            added = conn.executemany(insert, [(*r, sid) for r in rows]).rowcount
        if added == 0:
            raise SessionNotFound(sid, self.path)

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        sid = check_session_id(session_id)
        if entry_id is None:
            return list(await self.load_entries(sid))

        def op(conn: sqlite3.Connection) -> tuple[Any, list[tuple[Any, Any]]]:
            try:
                return self._retry_busy(lambda: self._read_after(conn, sid, entry_id))
            except sqlite3.Error as exc:
                raise self._translate(exc, "load_entries_after", sid) from exc

        seq, rows = await self._call(op)
        if seq is None:
            await self.load_session(sid)  # SessionNotFound if that is what it is
            raise entry_not_found(sid, entry_id, self.path)
        return list(decode_compact(rows, sid, self.path))

    def _read_after(self, conn: sqlite3.Connection, sid: str,
                    entry_id: str) -> tuple[Any, list[tuple[Any, Any]]]:
        # One read transaction, so the position and the rows agree.
        conn.execute("BEGIN")
        try:
            row = conn.execute("SELECT s.key, e.seq FROM sessions s JOIN entries e "
                               "ON e.session = s.key WHERE s.id = ? AND e.id = ?",
                               (sid, id_key(entry_id))).fetchone()
            if row is None:
                return None, []
            key, seq = row
            rows = conn.execute(f"SELECT {_ROW} FROM entries e WHERE e.session = ? "
                                "AND e.seq > ? ORDER BY e.seq", (key, seq)).fetchall()
            return seq, rows
        finally:
            conn.execute("COMMIT")

