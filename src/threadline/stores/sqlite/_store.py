"""The SQLite store: every session in one database file, shared by threads and processes.

Each store has one connection and one worker thread that runs every call in
order, so the event loop never waits for the disk. Appends queue per database
(``stores/_group.py``): the calls made while a transaction is in flight share
the next one, each in a savepoint of its own. The database is in WAL mode and
``synchronous`` is SQLite's own setting; docs/design.md ("Durability of the
SQLite store") says what each promises, and what the store does after a
commit whose sync failed and for a retry found stored.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from threadline.errors import (
    BlobNotFound,
    ConfigError,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import encode_entry
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
    entry_not_found,
)
from threadline.stores._group import GroupCommit, Outcome
from threadline.stores._listing import Touch, check_listing, page_fetched_infos, touch_of
from threadline.stores._rows import Row, compact, decode_compact, id_key, id_text, row_line
from threadline.stores._rules import (
    check_blob_key,
    check_blob_keys,
    check_entries,
    check_entry_id,
    check_record,
    check_retried_batch,
    check_session_id,
    from_micros,
    tenant_folder,
    to_micros,
)
from threadline.stores._search import check_search, indexed_text
from threadline.stores._watch import Wakeups, follow, unknown_after
from threadline.stores.sqlite import _catalog
from threadline.stores.sqlite._schema import migrate
from threadline.stores.sqlite._search import forget as search_forget
from threadline.stores.sqlite._search import index as search_index
from threadline.stores.sqlite._search import search as run_search

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_BUSY_SLICE = 0.005
"""Longest single wait in SQLite's busy handler (it checks after 1, 3 and 5 ms)."""
_ENCODE_INLINE = 64
"""Appends of up to this many entries are checked on the event loop; bigger ones on a thread."""

# An entry row as decode_compact reads it.
_ROW = "e.seq, e.kind, e.id, e.parent, e.ts, e.data"

_INHERITED: list[sqlite3.Connection] = []
"""Connections a forked child inherited: never used, never closed."""

# Extended result codes that mean the write did not reach stable storage.
_DURABILITY_CODES = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CORRUPT", "SQLITE_NOTADB")


class _Append(NamedTuple):
    """One ``append_entries`` call, checked."""

    session_id: str
    ids: list[str]
    lines: list[bytes]
    rows: list[Row]
    texts: list[str | None]  # what search indexes of each entry (stores/_search.py)
    touch: Touch  # what the append changes in the session's catalog row (_catalog.py)


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
    ``synchronous`` is SQLite's setting: ``"FULL"`` (default, survives power
    loss) or ``"NORMAL"`` (may lose the last commits on power loss).
    ``busy_timeout`` is how many seconds an operation waits for another
    process's write lock before failing with ``StoreError``.
    ``tenant`` gives each tenant its own database file,
    ``<folder>/tenants/<name>/<file name>`` beside ``path``
    (``tenant_folder`` in ``stores/_rules.py``); a store without one uses
    ``path`` and sees no tenant's sessions.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 30.0,
        create: bool = True,
        tenant: str | None = None,
    ) -> None:
        sync = str(synchronous).upper()
        if sync not in ("FULL", "NORMAL"):
            raise ConfigError(f"SQLiteStore synchronous must be FULL or NORMAL, got "
                              f"{synchronous!r} (for {os.fspath(path)})")
        if not busy_timeout >= 0:
            raise ConfigError(f"SQLiteStore busy_timeout must be >= 0 seconds, got "
                              f"{busy_timeout!r} (for {os.fspath(path)})")
        self.tenant = tenant
        if tenant is not None:
            if os.fspath(path) == ":memory:":
                raise ConfigError("SQLiteStore(':memory:') takes no tenant: a tenant is a file")
            # One database file per tenant, named as the store's own file.
            path = os.path.join(tenant_folder(os.path.dirname(os.fspath(path)), tenant),
                                os.path.basename(os.fspath(path)))
        self.path = os.fspath(path)
        self.synchronous = sync
        self.busy_timeout = float(busy_timeout)
        self._create = create
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._guard = threading.Lock()  # orders every call against close()
        self._group: GroupCommit[None, _Append] = GroupCommit(
            self._write_group, label=f"SQLiteStore ({self.path})", threads=1,
            after_fork=self._forget_connection)
        self._wakeups = Wakeups()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    async def __aenter__(self) -> SQLiteStore:
        await self._call(lambda conn: None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the worker thread ------------------------------------------------------

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn`` with the connection on the store's thread."""
        with self._guard:
            if self._closed:
                raise StoreError(f"{self.path}: store is closed")
            return self._group.run(lambda: fn(self._connection()))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _forget_connection(self) -> None:
        # A forked child must not use the connection it inherited, nor close
        # it (dropping the last reference would): a close may checkpoint and
        # remove the WAL under the parent. It is kept, unused, for good.
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None

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
            self._retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            migrate(conn, self._retry_busy, self._write)
        except sqlite3.Error as exc:
            conn.close()
            raise self._translate(exc, "opening the database") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _retry_busy(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying ``SQLITE_BUSY`` until ``busy_timeout`` has passed.

        SQLite's busy handler sleeps longer each time (up to 100 ms), so a
        waiter that has backed off sleeps through many hand-offs of the write
        lock while other processes keep taking it. The connection's own busy
        timeout is only ``_BUSY_SLICE``; every statement that can meet
        another process's lock goes through here."""
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
            self._retry_busy(lambda: conn.execute("COMMIT"))
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if (isinstance(exc, sqlite3.Error)
                    and getattr(exc, "sqlite_errorname", "").startswith(_DURABILITY_CODES)):
                self._forget_failed_commit(conn)
            raise
        return result

    def _forget_failed_commit(self, conn: sqlite3.Connection) -> None:
        """After a commit failed to be durable: make sure its frames can never be recovered.

        SQLite does not publish a commit whose WAL sync failed, but its frames
        stay in the WAL, and a recovery of the WAL (after every connection
        closed, or a crash) would find them. A commit of its own writes its
        frames from the last valid frame on, and recovery stops at the first
        frame whose checksum does not follow (https://sqlite.org/walformat.html).
        If that fails too, the store is poisoned all the same.
        """
        try:
            self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                _touch(conn)
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _translate(self, exc: sqlite3.Error, what: str, session_id: str | None = None,
                   *, writing: bool = False) -> StoreError:
        """The error to raise for ``exc`` (chained to it); a failed write poisons the store."""
        name = getattr(exc, "sqlite_errorname", "")
        where = f"{self.path}: {what}" + (f" (session {session_id!r})" if session_id else "")
        if writing and name.startswith(_DURABILITY_CODES):
            return self._group.poison(f"{where}: write not durable ({name})", exc, session_id)
        if _is_busy(exc):
            error = StoreError(f"{where}: database still locked after {self.busy_timeout:g}s "
                               f"busy timeout: {exc}", session_id=session_id)
        else:
            error = StoreError(f"{where}: {name or type(exc).__name__}: {exc}",
                               session_id=session_id)
        error.__cause__ = exc
        return error

    def _writing(self, what: str, sid: str | None, body: Callable[[sqlite3.Connection], T]
                 ) -> asyncio.Future[T]:
        """Run ``body`` in a write transaction on the store's thread, errors translated."""
        self._group.check_writable(sid)

        def op(conn: sqlite3.Connection) -> T:
            self._group.check_writable(sid)  # a sync may have failed since
            try:
                return self._write(conn, lambda: body(conn))
            except sqlite3.Error as exc:
                raise self._translate(exc, what, sid, writing=True) from exc

        return self._call(op)

    # -- the Store contract -----------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        sid = check_record(record)
        created = to_micros(record.created_at)

        def body(conn: sqlite3.Connection) -> None:
            try:
                conn.execute("INSERT INTO sessions (id, parent_id, created_at, last_activity) "
                             "VALUES (?, ?, ?, ?)", (sid, record.parent_id, created, created))
            except sqlite3.IntegrityError as exc:
                raise SessionExists(sid, self.path) from exc

        await self._writing("create_session", sid, body)

    async def load_entries(self, session_id: str) -> EntryLog:
        sid = check_session_id(session_id)

        def op(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
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
        check_entries(entries, sid, "append_entries")
        self._group.check_writable(sid)
        if not entries:
            await self.load_session(sid)  # an empty append still requires the session
            return
        call = await self._checked(sid, entries)
        with self._guard:
            # Under the guard: once close() has begun, no append is queued.
            if self._closed:
                raise StoreError(f"{self.path}: store is closed", session_id=sid)
            done = self._group.enqueue(None, call, sid)
        await done
        self._wakeups.ring(sid)

    async def _checked(self, sid: str, entries: Sequence[Entry]) -> _Append:
        """The call's lines and rows, each entry checked (``InvalidEntry``) first."""
        def encode() -> _Append:
            lines = [encode_entry(e, session_id=sid) for e in entries]
            rows = [compact(e, line) for e, line in zip(entries, lines, strict=True)]
            return _Append(sid, [e.id for e in entries], lines, rows,
                           [indexed_text(e) for e in entries], touch_of(entries))

        return encode() if len(entries) <= _ENCODE_INLINE else await asyncio.to_thread(encode)

    def _write_group(self, key: None, calls: list[_Append]) -> list[Outcome]:
        """Worker: the calls of one group in one transaction, each in a savepoint.

        A refused call (a conflicting id, a missing session) fails alone; a
        failure of the transaction fails them all, none stored.
        """
        outcomes: list[Outcome] = []
        try:
            conn = self._connection()
            self._write(conn, lambda: self._insert_each(conn, calls, outcomes))
        except sqlite3.Error as exc:
            return [self._translate(exc, "append_entries", c.session_id, writing=True)
                    for c in calls]
        return outcomes

    def _insert_each(self, conn: sqlite3.Connection, calls: list[_Append],
                     outcomes: list[Outcome]) -> None:
        """Insert each call in a savepoint; a retry found stored succeeds.

        Under ``FULL`` a committed row was synced by its committer, except
        where the committer died during its sync and a recovery of the WAL
        found its frames: a group of retries only is committed with a frame
        of its own, so that the WAL is synced before the calls return.
        """
        inserted = retried = False
        for call in calls:
            conn.execute("SAVEPOINT one_append")
            try:
                self._insert(conn, call.session_id, call.rows, call.texts)
                _catalog.catalogue(conn, call.session_id, call.touch)
                outcome: Outcome = None
                inserted = True
            except sqlite3.IntegrityError:  # an id already stored: a retry, or a conflict
                conn.execute("ROLLBACK TO one_append")
                outcome = self._refusal_unless_stored(conn, call.session_id,
                                                      list(zip(call.ids, call.lines,
                                                               strict=True)))
                retried = retried or outcome is None
            except SessionNotFound as exc:
                conn.execute("ROLLBACK TO one_append")
                outcome = exc
            conn.execute("RELEASE one_append")
            outcomes.append(outcome)
        if retried and not inserted and self.synchronous == "FULL":
            _touch(conn)

    def _refusal_unless_stored(self, conn: sqlite3.Connection, sid: str,
                               batch: list[tuple[str, bytes]]) -> StoreError | None:
        """None if ``batch`` (id, bytes) is stored already as one run."""
        marks = ",".join("?" * len(batch))
        stored = conn.execute(
            f"SELECT {_ROW} FROM sessions s JOIN entries e ON e.session = s.key "
            f"WHERE s.id = ? AND e.id IN ({marks})",
            (sid, *(id_key(i) for i, _ in batch))).fetchall()
        try:
            check_retried_batch(sid, batch, {
                id_text(r[2]): (r[0], row_line(r, sid, self.path)) for r in stored},
                str(self.path))
        except StoreError as exc:
            return exc
        return None

    def _insert(self, conn: sqlite3.Connection, sid: str, rows: Sequence[Row],
                texts: Sequence[str | None]) -> None:
        """Insert ``rows`` after the session's last entry, and index ``texts``
        (inside a write transaction)."""
        insert = ("INSERT INTO entries (session, kind, id, parent, ts, data) "
                  "SELECT key, ?, ?, ?, ?, ? FROM sessions WHERE id = ?")
        added = conn.executemany(insert, [(*r, sid) for r in rows]).rowcount
        if added == 0:
            raise SessionNotFound(sid, self.path)
        search_index(conn, texts)

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

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None, owner: str | None = None,
        tenant: str | None = None, labels: Mapping[str, str] | None = None,
        order: ListOrder = "created",
    ) -> SessionPage:
        after, filters = check_listing(limit, cursor, order, owner=owner, tenant=tenant,
                                       labels=labels)
        sql, args = _catalog.list_query(limit, after, filters, order)

        def op(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            try:
                return self._retry_busy(lambda: conn.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise self._translate(exc, "list_sessions") from exc

        rows = await self._call(op)
        return page_fetched_infos([_catalog.info(r) for r in rows], limit, order)

    async def delete_session(self, session_id: str) -> None:
        sid = check_session_id(session_id)

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute("DELETE FROM sessions WHERE id = ? RETURNING key",
                               (sid,)).fetchone()
            if row is None:
                raise SessionNotFound(sid, self.path)
            search_forget(conn, row[0])
            _catalog.forget(conn, row[0])
            conn.execute("DELETE FROM entries WHERE session = ?", (row[0],))

        await self._writing("delete_session", sid, body)

    async def prune_session(self, session_id: str, choose: Choose, *,
                            batch: int = 1000) -> Cut:
        """Remove what ``choose`` picks, at most ``batch`` entries a transaction.

        Each transaction holds the database's write lock (``BEGIN
        IMMEDIATE``), so no append lands between the read ``choose`` sees
        and the delete; between two, appends go on, and the next asks
        ``choose`` again on what is stored then. A whole session goes in one.
        """
        sid = check_session_id(session_id)
        if not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch is an integer of at least 1, got {batch!r}")
        removed: list[str] = []
        while True:
            first = not removed

            def step(conn: sqlite3.Connection, first: bool = first) -> tuple[Cut, bool]:
                return self._prune_step(conn, sid, choose, batch, first=first)

            cut, more = await self._writing("prune_session", sid, step)
            if cut.session:
                return cut
            removed += cut.entries
            if not more:
                return Cut(entries=tuple(removed))

    def _prune_step(self, conn: sqlite3.Connection, sid: str, choose: Choose, batch: int,
                    *, first: bool) -> tuple[Cut, bool]:
        """One transaction's worth: what it removed, and whether ``choose`` wants more."""
        row = conn.execute("SELECT key, id, parent_id, created_at FROM sessions WHERE id = ?",
                           (sid,)).fetchone()
        if row is None:
            if first:
                raise SessionNotFound(sid, self.path)
            return Cut(), False
        key = row[0]
        rows = conn.execute(f"SELECT {_ROW} FROM entries e WHERE e.session = ? ORDER BY e.seq",
                            (key,)).fetchall()
        entries = decode_compact(rows, sid, self.path)
        cut = choose(_record(row[1:]), entries)
        if cut.session:
            conn.execute("DELETE FROM sessions WHERE key = ?", (key,))
            conn.execute("DELETE FROM entries WHERE session = ?", (key,))
            return cut, False
        present = {e.id for e in entries}
        wanted = [i for i in dict.fromkeys(cut.entries) if i in present]
        now = wanted[:batch]
        conn.executemany("DELETE FROM entries WHERE session = ? AND id = ?",
                         [(key, id_key(i)) for i in now])
        return Cut(entries=tuple(now)), len(wanted) > batch

    # -- blobs, in the same database (S57) -------------------------------------------

    async def put_blob(self, key: str, data: bytes) -> None:
        check_blob_key(key)
        data = bytes(data)

        def body(conn: sqlite3.Connection) -> None:
            now = time.time_ns() // 1000
            # Stored already: only the touched time changes (no megabytes rewritten).
            if conn.execute("UPDATE blobs SET touched_at = ? WHERE key = ?",
                            (now, key)).rowcount == 0:
                conn.execute("INSERT INTO blobs (key, size, touched_at, data) VALUES (?, ?, ?, ?)",
                             (key, len(data), now, data))

        await self._writing(f"put_blob {key}", None, body)

    async def get_blob(self, key: str) -> bytes:
        check_blob_key(key)
        row = await self._reading(f"get_blob {key}", "SELECT data FROM blobs WHERE key = ?",
                                  (key,))
        if not row:
            raise BlobNotFound(key, self.path)
        return bytes(row[0][0])

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        wanted = check_blob_keys(keys)
        found: set[str] = set()
        for start in range(0, len(wanted), 500):  # SQLite's bound on parameters
            part = wanted[start:start + 500]
            rows = await self._reading("has_blobs", "SELECT key FROM blobs WHERE key IN "
                                       f"({','.join('?' * len(part))})", part)
            found.update(r[0] for r in rows)
        return found

    async def touch_blobs(self, keys: Sequence[str]) -> set[str]:
        """Refresh the touched time of those of ``keys`` that are stored; return them."""
        wanted = list(dict.fromkeys(check_blob_keys(keys)))

        def body(conn: sqlite3.Connection) -> set[str]:
            now = time.time_ns() // 1000
            return {k for k in wanted if conn.execute(
                "UPDATE blobs SET touched_at = ? WHERE key = ?", (now, k)).rowcount}

        return await self._writing("touch_blobs", None, body) if wanted else set()

    async def list_blobs(self) -> list[BlobInfo]:
        rows = await self._reading("list_blobs", "SELECT key, size, touched_at FROM blobs", ())
        return [BlobInfo(key=k, size=n, touched_at=from_micros(t)) for k, n, t in rows]

    async def delete_blobs(self, keys: Sequence[str], *, older_than: datetime) -> list[str]:
        wanted = list(dict.fromkeys(check_blob_keys(keys)))
        cutoff = to_micros(older_than)

        def body(conn: sqlite3.Connection) -> list[str]:
            # Check and delete in one statement, inside the write lock a put also takes.
            return [k for k in wanted if conn.execute(
                "DELETE FROM blobs WHERE key = ? AND touched_at < ?", (k, cutoff)).rowcount]

        return await self._writing("delete_blobs", None, body) if wanted else []

    def _reading(self, what: str, sql: str, args: Sequence[Any]
                 ) -> asyncio.Future[list[tuple[Any, ...]]]:
        def op(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            try:
                return self._retry_busy(lambda: conn.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise self._translate(exc, what) from exc

        return self._call(op)

    async def close(self) -> None:
        """Wait for the calls in flight, then close the connection; later calls are refused."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
        await self._group.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)

    async def search(self, query: str, *, owner: str | None = None, tenant: str | None = None,
                     active_path: bool = False, limit: int = 20) -> list[SearchHit]:
        """Full-text search across sessions (``SearchableStore``; FTS5, docs/search.md)."""
        q = check_search(query, owner, tenant, limit, active_path)

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            try:
                return self._retry_busy(lambda: run_search(conn, q))
            except sqlite3.Error as exc:
                raise self._translate(exc, "search") from exc

        return await self._call(op)

    watch_interval: float = 0.05
    """Seconds between two reads of a watched session that had nothing new."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session by polling every ``watch_interval`` seconds.

        SQLite has no notification between processes, so a watcher reads
        ``seq > last`` again; the read is one index range scan.
        """
        sid = check_session_id(session_id)
        check_entry_id(after, sid, "watch")

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
        check_entries(entries, sid, "append_linear")
        self._group.check_writable(sid)
        if not entries:
            await self.load_session(sid)
            return []
        await self._checked(sid, entries)  # InvalidEntry before anything is read
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
            lines = [encode_entry(e, session_id=sid) for e in stored]
            rows = [compact(e, line) for e, line in zip(stored, lines, strict=True)]
            outcomes: list[Outcome] = []
            self._insert_each(conn, [_Append(sid, [e.id for e in stored], lines, rows,
                                             [indexed_text(e) for e in stored],
                                             touch_of(stored))], outcomes)
            if outcomes[0] is not None:
                raise outcomes[0]

        await self._writing("append_linear", sid, body)
        self._wakeups.ring(sid)
        return stored

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        sid = check_session_id(session_id)
        check_entry_id(entry_id, sid, "load_entries_after")
        if entry_id is None:
            return list(await self.load_entries(sid))
        after = entry_id

        def op(conn: sqlite3.Connection) -> tuple[Any, list[tuple[Any, Any]]]:
            try:
                return self._retry_busy(lambda: self._read_after(conn, sid, after))
            except sqlite3.Error as exc:
                raise self._translate(exc, "load_entries_after", sid) from exc

        seq, rows = await self._call(op)
        if seq is None:
            await self.load_session(sid)  # SessionNotFound if that is what it is
            raise entry_not_found(sid, after, self.path)
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


def _touch(conn: sqlite3.Connection) -> None:
    """Give the open write transaction a page to commit, changing nothing.

    Writing the header's user version, unchanged, makes the commit write a
    frame, so SQLite syncs the WAL under ``FULL`` and a new frame follows
    the last valid one.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute(f"PRAGMA user_version = {int(version)}")
