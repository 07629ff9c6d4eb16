"""PostgreSQL store: many processes and machines share one database.

psycopg 3 (async) over a psycopg-pool ``AsyncConnectionPool``. The tables live
in their own schema (``threadline`` unless told otherwise) and every primary
key and unique key starts with ``session_id``, so the tables can be
distributed by ``session_id`` (Citus-style) without a change. The one other
index, ``sessions_newest`` on ``(created_at DESC, session_id DESC)``, serves
``list_sessions``: on a distributed table every shard has it, answers the
keyset query for its own sessions, and the coordinator merges the shards'
first pages (``bench/pg_listing.py`` measures it at 100,000 sessions).

Append order across processes: each session row carries a ``next_seq``
counter. An append bumps it and inserts its entries numbered below the new
value in one statement; the row lock taken by the ``UPDATE`` makes concurrent
appenders to one session queue up, so sequence numbers follow commit order and
no append is lost. Appenders to different sessions never wait for each other.
The counter is bookkeeping: the record fields (id, parent_id, created_at) are
still written once and never changed (S6).

Entries are compact rows (``session/_rows.py``, schema version 4): ids as
16-byte ``bytea`` keys, the timestamp as microseconds, and only the rest of
the codec's line in ``data`` (``bytea``: measured in ``bench/sql_stores.py``
against ``jsonb``, it is smaller on disk, loads faster, and round-trips byte
for byte, which ``jsonb`` does not). A line that would not come back byte for
byte from that is kept whole. ``session_id`` stays a column of ``entries``
rather than an integer key: it is the shard key, and for short session ids
it costs no more than a ``bigint`` would after alignment.

An append of up to 8 entries on a pool the store made skips psycopg's
execute: ``_Wire`` sends it through psycopg's libpq binding with the
parameters already in binary and waits for the reply on one reader the
connection keeps on the event loop (S47); everything else goes through
psycopg. Both name their prepared statements per connection after
``prepare_threshold`` runs, and neither does with ``None``.

Behind PgBouncer 1.21 or later in transaction pooling, with its
``max_prepared_statements`` set, the default threshold works: PgBouncer
prepares each statement on whichever server connection runs it (S49).
Behind an older PgBouncer, or with that setting at 0, pass
``prepare_threshold=None`` so no server-side prepared statement outlives a
transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import re
import struct
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC
from typing import Any, Self, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from threadline.errors import (
    ConfigError,
    CorruptLog,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    missing_extra,
)
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._rows import (
    Row,
    compact,
    decode_compact,
    id_key,
    id_text,
    row_line,
)
from threadline.session._store import (
    EntryLog,
    SessionPage,
    chain_after,
    decode_cursor,
    entry_not_found,
)
from threadline.session._storekit import (
    aware,
    check_limit,
    check_record,
    check_retried_batch,
    check_session_id,
    page_fetched,
)
from threadline.session._watch import Wakeups, follow, unknown_after

try:
    import psycopg
    import psycopg_pool
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("postgres", "PostgresStore", exc) from exc

__all__ = ["PostgresStore"]

log = logging.getLogger("threadline.session")

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

# Append-only: a released version is never edited, a change is a new version.
# ``{s}`` is the schema. COLLATE "C" orders ids by code point, as the other
# stores do, whatever the database's locale.
async def _compact_rows(conn: Conn, s: sql.Identifier) -> None:
    """Version 4: version 3's entries moved into compact rows (``session/_rows.py``).

    It also drops version 3's NOTIFY trigger: a transaction that notifies
    holds PostgreSQL's one notify lock through its commit, WAL flush
    included, so appends to different sessions could no longer share a
    flush (measured in ``bench/sql_stores.py``). The store notifies after the
    commit instead (``PostgresStore._notify``).

    Runs in the migration's transaction under its advisory lock, so a second
    process waits, then finds version 4 recorded.
    """
    for stmt in _V4.split(";\n"):
        if stmt.strip():
            await conn.execute(sql.SQL(stmt).format(s=s))
    insert = sql.SQL("INSERT INTO {s}.entries_v4 (seq, ts, kind, session_id, entry_id, "
                     "parent_id, data) VALUES (%s, %s, %s, %s, %s, %s, %s)").format(s=s)
    async with conn.cursor(name="threadline_v4") as old:
        await old.execute(sql.SQL("SELECT session_id, seq, entry_id, parent_id, data "
                                  "FROM {s}.entries").format(s=s))
        while batch := await old.fetchmany(1000):
            async with conn.cursor() as cur:
                await cur.executemany(insert, [(seq, *_v4_row(sid, entry_id, parent, data))
                                               for sid, seq, entry_id, parent, data in batch])
    for stmt in _V4_SWAP.split(";\n"):
        if stmt.strip():
            await conn.execute(sql.SQL(stmt).format(s=s))


def _v4_row(sid: str, entry_id: str, parent_id: str | None, data: bytes) -> tuple[Any, ...]:
    """(ts, kind, session_id, id, parent, data) for a version 3 row."""
    try:
        kind, key, parent, ts, rest = compact(decode_entry(data), bytes(data))
    except CorruptLog:  # kept as it was, to be reported when loaded
        kind, key, parent, ts, rest = (0, id_key(entry_id), None if parent_id is None
                                       else id_key(parent_id), None, data)
    return ts, kind, sid, key, parent, rest


# Fixed-width columns first, so no row pays for alignment padding.
_V4 = """
CREATE TABLE {s}.entries_v4 (
    seq bigint NOT NULL,
    ts bigint,
    kind smallint NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    entry_id bytea NOT NULL,
    parent_id bytea,
    data bytea NOT NULL
)
"""

_V4_SWAP = """
DROP TABLE {s}.entries;
DROP FUNCTION {s}.notify_append();
ALTER TABLE {s}.entries_v4 RENAME TO entries;
ALTER TABLE {s}.entries ADD CONSTRAINT entries_pkey PRIMARY KEY (session_id, seq);
ALTER TABLE {s}.entries ADD CONSTRAINT entries_session_id_entry_id_key UNIQUE (session_id, entry_id)
"""

MIGRATIONS: tuple[tuple[int, str | Callable[[Conn, sql.Identifier], Awaitable[None]]], ...] = (
    (
        1,
        """
        CREATE TABLE {s}.sessions (
            session_id text COLLATE "C" PRIMARY KEY,
            parent_id text COLLATE "C",
            created_at timestamptz NOT NULL,
            next_seq bigint NOT NULL DEFAULT 0
        );
        CREATE TABLE {s}.entries (
            session_id text COLLATE "C" NOT NULL,
            seq bigint NOT NULL,
            entry_id text COLLATE "C" NOT NULL,
            parent_id text COLLATE "C",
            type text NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (session_id, seq),
            UNIQUE (session_id, entry_id)
        );
        """,
    ),
    (
        2,
        # list_sessions reads the newest records in key order from here
        # instead of sorting the whole table. Not unique, so it need not
        # start with session_id: on a table distributed by session_id each
        # shard keeps its own copy and answers "newest n" from it.
        """
        CREATE INDEX sessions_newest ON {s}.sessions (created_at DESC, session_id DESC);
        """,
    ),
    (
        3,
        # S26: every committed append tells listeners which session grew (an
        # md5, so any session id fits a NOTIFY payload). The runner splits a
        # script at a semicolon that ends a line, so the function body, whose
        # semicolons do not, stays on one line and reaches the server whole.
        """
        CREATE FUNCTION {s}.notify_append() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('threadline_' || left(md5(TG_TABLE_SCHEMA), 16), md5(n.session_id)) FROM (SELECT DISTINCT session_id FROM new_entries) AS n; RETURN NULL; END $$;
        CREATE TRIGGER entries_notify AFTER INSERT ON {s}.entries
            REFERENCING NEW TABLE AS new_entries
            FOR EACH STATEMENT EXECUTE FUNCTION {s}.notify_append();
        """,  # noqa: E501
    ),
    (4, _compact_rows),
)

_APPEND_INSERT = ("INSERT INTO {s}.entries (seq, ts, kind, session_id, entry_id, parent_id, "
                  "data) SELECT s.base + e.ord, e.ts, e.kind, s.session_id, e.entry_id, "
                  "e.parent_id, e.data FROM s, ")
# Up to this many entries an append lists them in VALUES: one entry costs the
# server ~1.15x a bare INSERT's round trip that way, against ~2.5x through
# unnest's arrays; from about 16 entries the arrays cost less per entry
# (bench/sql_stores.py, the append statement table).
_VALUES_MAX = 8


def _append_values(n: int) -> str:
    """The append statement for ``n`` entries (``n <= _VALUES_MAX``) as a VALUES list."""
    row = "(%s::smallint, %s::bytea, %s::bytea, %s::bigint, %s::bytea, {})"
    return (f"WITH s AS (UPDATE {{s}}.sessions SET next_seq = next_seq + {n} "
            f"WHERE session_id = %s RETURNING session_id, next_seq - {n} AS base) "
            + _APPEND_INSERT + "(VALUES " + ", ".join(row.format(i) for i in range(1, n + 1))
            + ") AS e(kind, entry_id, parent_id, ts, data, ord)")


_Q = {
    # Fails with UndefinedTable until the first migration has run.
    "version": "SELECT coalesce(max(version), 0), to_regclass(%s) FROM {s}.schema_migrations",
    "create": "INSERT INTO {s}.sessions (session_id, parent_id, created_at) "
              "VALUES (%s, %s, %s) ON CONFLICT (session_id) DO NOTHING",
    # One statement: the UPDATE's row lock orders appenders to one session and
    # its RETURNING numbers the new entries. Arrays in binary (``%b``): as text,
    # every bytea would be hex-escaped by the driver and parsed by the server.
    "append": "WITH s AS (UPDATE {s}.sessions SET next_seq = next_seq + %s "
              "WHERE session_id = %s RETURNING session_id, next_seq - %s AS base) "
              + _APPEND_INSERT + "unnest(%b::smallint[], %b::bytea[], %b::bytea[], "
              "%b::bigint[], %b::bytea[]) WITH ORDINALITY AS e(kind, entry_id, parent_id, ts, "
              "data, ord)",
    "load": "SELECT e.seq, e.kind, e.entry_id, e.parent_id, e.ts, e.data "
            "FROM {s}.sessions s LEFT JOIN {s}.entries e "
            "ON e.session_id = s.session_id WHERE s.session_id = %s ORDER BY e.seq",
    "session": "SELECT session_id, parent_id, created_at FROM {s}.sessions "
               "WHERE session_id = %s",
    "list_first": "SELECT session_id, parent_id, created_at FROM {s}.sessions "
                  "ORDER BY created_at DESC, session_id DESC LIMIT %s",
    "list_after": "SELECT session_id, parent_id, created_at FROM {s}.sessions "
                  "WHERE (created_at, session_id) < (%s, %s) "
                  "ORDER BY created_at DESC, session_id DESC LIMIT %s",
    # Delete the record first: its row lock waits out a running append, and the
    # second statement's fresh snapshot then sees every entry that append wrote.
    "delete_session": "DELETE FROM {s}.sessions WHERE session_id = %s",
    "delete_entries": "DELETE FROM {s}.entries WHERE session_id = %s",
    "watch_start": "SELECT (SELECT 1 FROM {s}.sessions WHERE session_id = %(sid)s), "
                   "(SELECT seq FROM {s}.entries WHERE session_id = %(sid)s "
                   "AND entry_id = %(after)s)",
    "watch_read": "SELECT seq, kind, entry_id, parent_id, ts, data FROM {s}.entries "
                  "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT 1000",
    # After an append has committed, in a transaction of its own that need not
    # wait for its WAL flush (losing a notification in a crash is harmless:
    # watchers also poll), so the notify lock is held for microseconds.
    # It also says whether any store's LISTEN connection (named by its
    # application_name) is still there.
    "notify": "SELECT set_config('synchronous_commit', 'off', true), pg_notify(%s, %s), "
              "EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s)",
    "stored_batch": "SELECT seq, kind, entry_id, parent_id, ts, data FROM {s}.entries "
                    "WHERE session_id = %s AND entry_id = ANY(%s::bytea[])",
    # The last entry is numbered next_seq (an append of n takes base+1 .. base+n).
    "lock_session": "SELECT next_seq FROM {s}.sessions WHERE session_id = %s FOR UPDATE",
    "entry_at": "SELECT entry_id FROM {s}.entries WHERE session_id = %s AND seq = %s",
    "parent_of": "SELECT parent_id FROM {s}.entries WHERE session_id = %s AND entry_id = %s",
    # The entry's own row first (so an empty result means it is not there), then those after it.
    "after": "SELECT e.seq, e.kind, e.entry_id, e.parent_id, e.ts, e.data "
             "FROM {s}.entries e, {s}.entries a "
             "WHERE a.session_id = %s AND a.entry_id = %s "
             "AND e.session_id = a.session_id AND e.seq >= a.seq ORDER BY e.seq",
}


# Longest a LISTEN connection waits before it checks whether its store closed.
_LISTEN_TICK = 1.0
# Seconds an appender that saw no listener waits before it looks again.
_QUIET = 0.25


class _Repeated(Exception):
    """An append met an id already stored: check whether it is a retry (S25)."""


def redact(url: str) -> str:
    """``url`` with any password replaced, for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore:
    """A ``CatalogStore`` in PostgreSQL.

    ``url_or_pool`` is a libpq URL/conninfo string, or an
    ``AsyncConnectionPool`` the application already owns (the store then
    neither opens nor closes it, and the pool options below are ignored).
    ``schema`` holds the tables; it is created, and migrated under an advisory
    lock, on first use. ``prepare_threshold=None`` disables server-side
    prepared statements (needed behind PgBouncer's transaction pooling before
    1.21, or with its ``max_prepared_statements`` at 0; S49). ``min_size``,
    ``max_size``, ``timeout`` (seconds to wait for a pooled connection) and
    ``connect_timeout`` shape the pool the store creates. The first use makes
    one plain connection before starting the pool, so a wrong host, database or
    password fails at once with the server's own reason instead of pool retries;
    that connection checks (or migrates) the schema and then becomes the pool's
    first, so a cold open connects once (S43).
    With ``create=False`` a schema that does not exist is a ``StoreError``
    rather than being created.

    ``listen_url`` is where ``watch`` opens its ``LISTEN`` connection
    (default: the store's URL); behind PgBouncer in transaction mode it must
    reach PostgreSQL directly or through a session-mode pool.

    A lost connection, a server that is down, or no pooled connection in
    time raise ``StoreUnavailable``: the outcome of a write is unknown, and
    retrying the same append is safe (S25, ``check_retried_batch`` in
    ``session/_storekit.py``).
    """

    def __init__(
        self,
        url_or_pool: str | AsyncConnectionPool[Any],
        *,
        schema: str = "threadline",
        prepare_threshold: int | None = 5,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        create: bool = True,
        listen_url: str | None = None,
    ) -> None:
        if not isinstance(schema, str) or not schema or "\x00" in schema:
            raise ConfigError(f"PostgresStore schema must be a non-empty name, got {schema!r}")
        if max_size < 1 or not 0 <= min_size <= max_size:
            raise ConfigError(f"PostgresStore pool sizes need 0 <= min_size <= max_size and "
                              f"max_size >= 1, got min_size={min_size}, max_size={max_size}")
        self.schema = schema
        self._connect_timeout = connect_timeout
        self._spare: list[Conn] = []  # the first pool's (see _taking_from)
        self._create = create
        if isinstance(url_or_pool, AsyncConnectionPool):
            self._pool: AsyncConnectionPool[Any] = url_or_pool
            self._owns_pool = False
            self._where = f"postgres pool {url_or_pool.name!r}, schema {schema!r}"
        elif isinstance(url_or_pool, str):
            self._owns_pool = True
            self._where = f"{redact(url_or_pool)}, schema {schema!r}"
            url = url_or_pool

            def new_pool(spare: list[Conn]) -> AsyncConnectionPool[Any]:
                return AsyncConnectionPool(
                    url, open=False, min_size=min_size, max_size=max_size, timeout=timeout,
                    connection_class=_taking_from(spare),
                    kwargs={"autocommit": True, "prepare_threshold": prepare_threshold,
                            "connect_timeout": max(1, round(connect_timeout))},
                )

            self._new_pool = new_pool
            self._pool = new_pool(self._spare)
        else:
            raise ConfigError(f"PostgresStore needs a URL or an AsyncConnectionPool, got "
                              f"{type(url_or_pool).__name__}")
        ident = sql.Identifier(schema)
        queries = {**_Q, **{f"append{n}": _append_values(n) for n in range(1, _VALUES_MAX + 1)}}
        self._q = {k: sql.SQL(v).format(s=ident).as_string(None) for k, v in queries.items()}
        self._wire = _statements(self._q, schema)
        self._ready = False
        self._closed = False
        conninfo = url_or_pool if isinstance(url_or_pool, str) else self._pool.conninfo
        self._listen_url = listen_url or (conninfo if isinstance(conninfo, str) else None)
        self._channel = "threadline_" + hashlib.md5(schema.encode()).hexdigest()[:16]
        self._wakeups = Wakeups()
        self._listener_name = "threadline-listen-" + self._channel
        # Whether some process listens on the channel, and when that was learnt.
        self._listened = True
        self._listened_at = -1e9
        # A psycopg pool belongs to the event loop that opened it. A store
        # that made its own pool makes one per loop it is used from (S33);
        # the first loop gets ``self._pool``.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPool] = (
            weakref.WeakKeyDictionary())
        self._loops_guard = threading.Lock()

    def __repr__(self) -> str:
        return f"PostgresStore({self._where})"

    async def __aenter__(self) -> PostgresStore:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    # -- plumbing ---------------------------------------------------------------

    def _here(self) -> _LoopPool:
        """This event loop's pool (made on first use from the loop)."""
        loop = asyncio.get_running_loop()
        here = self._loops.get(loop)  # a loop's entry, once made, never changes
        if here is not None:
            return here
        with self._loops_guard:
            here = self._loops.get(loop)
            if here is None:
                if self._loops and not self._owns_pool:
                    raise StoreError(
                        f"{self._where}: the AsyncConnectionPool passed in belongs to another "
                        f"event loop; pass a URL to have the store make a pool per loop")
                if self._loops and self._owns_pool:
                    self._drop_ended_loops_locked()
                    spare: list[Conn] = []
                    here = _LoopPool(self._new_pool(spare), spare)
                else:
                    here = _LoopPool(self._pool, self._spare)
                self._loops[loop] = here
        return here

    def _drop_ended_loops_locked(self) -> None:
        """Close the connections of the pools whose event loop has closed.

        Nothing can run on such a loop again, so its pool's workers are gone
        and ``close`` could not reach it: left alone, its connections stay
        open on the server until the loop is collected, and a thread that
        runs ``asyncio.run`` per call would hold one per loop it ever ran.
        """
        for loop, here in list(self._loops.items()):
            if not loop.is_closed():
                continue
            del self._loops[loop]
            idle = getattr(here.pool, "_pool", ())  # psycopg_pool keeps none public
            for conn in [*here.spare, *idle]:
                with contextlib.suppress(Exception):
                    conn.pgconn.finish()
            here.spare.clear()

    async def _start(self, session_id: str | None = None) -> None:
        if self._closed:
            raise StoreError(f"{self._where}: store is closed")
        here = self._here()
        if here.ready:
            return
        async with here.lock:
            if here.ready:
                return
            if self._owns_pool:
                # One direct connection first: with the server down it fails
                # within connect_timeout with the server's own reason and
                # leaves the pool unopened, to be tried again by the next call.
                # (A pool whose first wait times out closes itself for good.)
                # It checks the schema, then becomes the pool's first
                # connection, so a cold open connects once.
                conn = await self._connect("connecting", session_id, here)
                here.down = False
                try:
                    if not self._ready:
                        with self._errors("migrating the schema", session_id, here):
                            await self._migrate(conn)
                        self._ready = True
                except BaseException:
                    await conn.close()
                    raise
                if here.pool.closed:
                    here.spare.append(conn)
                    await here.pool.open()
                    await _taken(here)
                else:  # the application opened it already (``store.pool``)
                    await conn.close()
            if not self._ready:
                await self._with_conn("migrating the schema", session_id, self._migrate)
            self._ready = True  # once per store, whichever loop comes first
            here.ready = True

    async def _migrate(self, conn: Conn) -> None:
        ident = sql.Identifier(self.schema)
        # The common open finds the schema current in one read, without the
        # lock or DDL (a cold open's round trips are most of its cost). A
        # schema not there yet fails that read, which only means "migrate";
        # anything but a current schema is decided again below, under the lock.
        try:
            if conn.autocommit:
                row = await self._stored_version(conn)
            else:  # a savepoint, so the failed read leaves the caller's transaction usable
                async with conn.transaction():
                    row = await self._stored_version(conn)
        except psycopg.errors.UndefinedTable as exc:
            if not self._create:
                raise self._no_store() from exc
        else:
            if not self._create and row[1] is None:
                raise self._no_store()
            if row[0] >= MIGRATIONS[-1][0]:
                return
        # A lock id per schema: processes migrating other schemas do not wait.
        key = int.from_bytes(
            hashlib.blake2b(f"threadline:{self.schema}".encode(), digest_size=8).digest(),
            "big", signed=True)
        # Seen once in CI, four stores opening a new schema through PgBouncer:
        # one that had waited for the lock met the schema another had just
        # committed as a UniqueViolation on its CREATE SCHEMA IF NOT EXISTS.
        # The cause is not pinned down; a new transaction sees the committed
        # schema, so the migration is tried again.
        for attempt in range(3):
            try:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                    await _apply_migrations(conn, ident)
                return
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema,
                    psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject):
                if attempt == 2:
                    raise

    async def _stored_version(self, conn: Conn) -> tuple[int, str | None]:
        """The schema's migration version, and whether its ``sessions`` table exists."""
        cur = await conn.execute(self._q["version"], (
            sql.Identifier(self.schema, "sessions").as_string(None),))
        row = await cur.fetchone()
        assert row is not None  # an aggregate gives one row
        return int(row[0]), row[1]

    def _no_store(self) -> StoreError:
        return StoreError(f"no threadline store in {self._where}: "
                          f"the schema or its tables do not exist")

    @contextlib.contextmanager
    def _errors(self, what: str, session_id: str | None, here: _LoopPool) -> Iterator[None]:
        """psycopg's and the pool's errors as the store's, naming it and ``what``."""
        try:
            yield
        except psycopg.Error as exc:
            raise self._failure(exc, what, session_id, here) from exc

    def _failure(self, exc: psycopg.Error, what: str, session_id: str | None,
                 here: _LoopPool) -> StoreError:
        """The store's error for psycopg's or the pool's ``exc``."""
        if isinstance(exc, PoolTimeout):
            return StoreUnavailable(f"{self._where}: no connection for {what} within the pool "
                                    f"timeout: {exc}", session_id=session_id)
        sess = f" (session {session_id!r})" if session_id else ""
        if isinstance(exc, psycopg.OperationalError):
            # A lost connection (sqlstate None, class 08, or the server shutting
            # down) may hide more dead ones in the pool.
            if exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P")):
                here.down = True
            return StoreUnavailable(f"{self._where}: {what}{sess} failed; the outcome of a "
                                    f"write is unknown, retrying is safe: "
                                    f"{type(exc).__name__}: {exc}", session_id=session_id)
        return StoreError(f"{self._where}: {what}{sess} failed: "
                          f"{type(exc).__name__}: {exc}", session_id=session_id)

    async def _with_conn(self, what: str, session_id: str | None,
                         fn: Callable[[Conn], Awaitable[T]]) -> T:
        if self._closed:
            raise StoreError(f"{self._where}: store is closed", session_id=session_id)
        here = self._here()
        if here.down:
            await self._probe(what, session_id, here)
        pool = here.pool
        try:
            # getconn/putconn rather than pool.connection(): the context
            # manager adds a commit() call (a no-op in autocommit) and its own
            # generator frame, ~35 us of CPU per call under load
            # (docs/benchmarks.md). putconn rolls back or replaces a
            # connection left in a transaction or broken, as the manager would.
            conn = await pool.getconn()
            try:
                if conn.autocommit:
                    return await fn(conn)
                # A pool the application passed in may hand out connections
                # outside autocommit: commit here, or the pool rolls back.
                async with conn.transaction():
                    return await fn(conn)
            finally:
                await pool.putconn(conn)
        except psycopg.Error as exc:
            raise self._failure(exc, what, session_id, here) from exc

    async def _connect(self, what: str, session_id: str | None, here: _LoopPool) -> Conn:
        """A connection made as the pool makes them, or ``StoreUnavailable`` saying why not.

        The pool would wait its whole ``timeout`` for a connection it cannot
        make; one direct attempt fails within ``connect_timeout`` and gives
        the server's reason (wrong host, database or password).
        """
        conninfo, kwargs = here.pool.conninfo, here.pool.kwargs or {}
        assert isinstance(conninfo, str) and isinstance(kwargs, dict)  # _fixed(here.pool)
        kwargs = {**kwargs, "autocommit": True,
                  "connect_timeout": max(1, round(self._connect_timeout))}
        try:
            return await _Connection.connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            # libpq repeats the reason once per address it tried; the first line says it.
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise StoreUnavailable(f"{self._where}: {what}: cannot connect: {reason}",
                                   session_id=session_id) from exc

    async def _probe(self, what: str, session_id: str | None, here: _LoopPool) -> None:
        """Fail fast while the server is down; once it answers, renew the pool."""
        if _fixed(here.pool):  # else computed per connection: only the pool can try
            await (await self._connect(what, session_id, here)).close()
        here.down = False
        if not here.pool.closed:
            await here.pool.check()  # drop the pooled connections that died

    async def _run(self, what: str, session_id: str | None,
                   fn: Callable[[Conn], Awaitable[T]]) -> T:
        await self._start(session_id)
        return await self._with_conn(what, session_id, fn)

    def _record(self, row: tuple[Any, ...]) -> SessionRecord:
        return SessionRecord(id=row[0], parent_id=row[1], created_at=row[2].astimezone(UTC))

    # -- the Store contract -----------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        sid = check_record(record)
        created = aware(record.created_at)

        async def op(conn: Conn) -> int:
            cur = await conn.execute(self._q["create"], (sid, record.parent_id, created))
            return cur.rowcount

        if await self._run("create_session", sid, op) == 0:
            raise SessionExists(sid, self._where)

    async def load_entries(self, session_id: str) -> EntryLog:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute(self._q["load"], (sid,), binary=True)
            return await cur.fetchall()

        rows = await self._run("load_entries", sid, op)
        if not rows:
            raise SessionNotFound(sid, self._where)
        return decode_compact(rows, sid, self._where + ",")

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        sid = check_session_id(session_id)
        if not entries:
            await self.load_session(sid)  # an empty append still requires the session
            return
        datas = [encode_entry(e, session_id=sid) for e in entries]
        rows = [compact(e, d) for e, d in zip(entries, datas, strict=True)]
        here = self._loops.get(asyncio.get_running_loop())  # None: this loop's first call
        statement = self._wire.get(len(rows))
        try:
            if (here is None or not here.ready or here.down or self._closed or statement is None
                    or not self._owns_pool):
                # The first call from this loop, a pool to probe, a closed store,
                # a pool passed in, or more than 8 entries: through psycopg.
                stored = await self._append(sid, rows)
            else:
                stored = await self._wire_append(here, statement, sid, rows)
            if stored == 0:
                raise SessionNotFound(sid, self._where)
        except _Repeated:
            await self._check_retried(sid, [e.id for e in entries], datas)

    async def _append(self, sid: str, rows: list[Row]) -> int:
        """Store ``rows`` after the session's last entry; how many were stored (0: no session)."""
        name, params = _append_args(sid, rows)
        query = self._q[name]

        async def op(conn: Conn) -> int:
            try:
                stored = (await _cursor(conn).execute(query, params)).rowcount
            except psycopg.errors.UniqueViolation as exc:
                raise _Repeated() from exc
            if stored:
                await self._notify(conn, sid)
            return stored

        return await self._run("append_entries", sid, op)

    async def _wire_append(self, here: _LoopPool, statement: _Statement, sid: str,
                           rows: list[Row]) -> int:
        """``_append`` on the store's own pool, its statement sent on the wire (S47)."""
        pool = here.pool
        try:
            conn = (here.quick and _take(pool)) or await pool.getconn()
            try:
                own = cast(_Connection, conn)  # the store's pool makes only these
                wire = own.wire or _Wire(own)
                own.wire = wire
                values: list[bytes | None] = [sid.encode(wire.encoding)]
                for kind, key, parent, ts, data in rows:
                    values += (_int2(kind), key, parent, None if ts is None else _int8(ts), data)
                stored = int((await wire.run(statement, values)).command_tuples or 0)
                if stored and (self._listened or time.monotonic() - self._listened_at >= _QUIET):
                    await self._notify(conn, sid)
            finally:
                if not (here.quick and _give(pool, conn)):
                    await pool.putconn(conn)
        except psycopg.errors.UniqueViolation as exc:
            raise _Repeated() from exc
        except psycopg.Error as exc:
            raise self._failure(exc, "append_entries", sid, here) from exc
        return stored

    async def _notify(self, conn: Conn, sid: str) -> None:
        """Wake the watchers of ``sid`` in every process (S26), once the append is committed."""
        if not conn.autocommit:
            # A pool's own transaction: notify inside it (its commit stays synchronous).
            await conn.execute("SELECT pg_notify(%s, %s)", (self._channel, _payload(sid)))
            return
        # With nobody listening, skip the round trip; look again every
        # _QUIET seconds. A watcher that starts meanwhile still gets the entry
        # from its next read, at most watch_interval later.
        if not self._listened and time.monotonic() - self._listened_at < _QUIET:
            return
        payload = _payload(sid)
        try:
            if isinstance(conn, _Connection) and conn.wire is not None:
                # As the append went: psycopg would take the wire's reader off.
                result = await conn.wire.run(self._wire["notify"], [
                    self._channel.encode(), payload.encode(), self._listener_name.encode()])
                listened = result.get_value(0, 2) == b"t"
            else:
                cur = await conn.execute(self._q["notify"],
                                         (self._channel, payload, self._listener_name))
                row = await cur.fetchone()
                listened = bool(row and row[2])
        except psycopg.Error as exc:  # the append is stored; watchers' polls will see it
            log.debug("%s: NOTIFY for session %r failed: %s", self._where, sid, exc)
            return
        self._listened = listened
        self._listened_at = time.monotonic()

    async def _check_retried(self, sid: str, ids: list[str], datas: list[bytes]) -> None:
        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute(self._q["stored_batch"], (sid, [id_key(i) for i in ids]),
                                     binary=True)
            return await cur.fetchall()

        rows = await self._run("append_entries (checking stored ids)", sid, op)
        check_retried_batch(sid, list(zip(ids, datas, strict=True)),
                            {id_text(r[2]): (r[0], row_line(r, sid, self._where + ","))
                             for r in rows}, self._where)

    # -- beyond the contract ----------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> tuple[Any, ...] | None:
            cur = await conn.execute(self._q["session"], (sid,))
            return await cur.fetchone()

        row = await self._run("load_session", sid, op)
        if row is None:
            raise SessionNotFound(sid, self._where)
        return self._record(row)

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        check_limit(limit)
        after = None if cursor is None else decode_cursor(cursor)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            if after is None:
                cur = await conn.execute(self._q["list_first"], (limit + 1,))
            else:
                cur = await conn.execute(self._q["list_after"],
                                         (aware(after[0]), after[1], limit + 1))
            return await cur.fetchall()

        rows = await self._run("list_sessions", None, op)
        return page_fetched([self._record(r) for r in rows], limit)

    async def delete_session(self, session_id: str) -> None:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> None:
            async with conn.transaction():
                cur = await conn.execute(self._q["delete_session"], (sid,))
                if cur.rowcount == 0:
                    raise SessionNotFound(sid, self._where)
                await conn.execute(self._q["delete_entries"], (sid,))

        await self._run("delete_session", sid, op)

    async def close(self) -> None:
        """Close the pool if the store created it; a pool passed in stays open."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        with self._loops_guard:
            pools = list(self._loops.items())
        for owner, here in pools:  # every loop's LISTEN connection (watch)
            if here.listener is None:
                continue
            if owner is loop:
                _stop_listener(here)
                with contextlib.suppress(asyncio.CancelledError):
                    await here.listener
            elif owner.is_running():
                owner.call_soon_threadsafe(_stop_listener, here)
        if not self._owns_pool:
            return
        if not pools:
            await self._pool.close()
        for owner, here in pools:
            if owner is loop:
                await _close_pool(here)
            elif owner.is_running():
                asyncio.run_coroutine_threadsafe(_close_pool(here), owner)
            # A pool whose loop has ended has no workers left; its connections
            # close when it is collected.

    watch_interval: float = 1.0
    """Seconds between reads of a watched session when no notification came.

    Notifications make delivery prompt; this read is the safety net for the
    moments the listening connection is down (and the only source of news
    when there is no ``listen_url``)."""

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session (S26): ``LISTEN`` for appends, then read ``seq > last``.

        Every store NOTIFYs after each append it commits while some store
        listens (rows written by other means, and appends made in the 0.25 s
        before an appender notices a new listener, are found by the
        ``watch_interval`` read). The listening connection
        is the store's own, opened on ``listen_url`` (default: the store's
        URL). It must be a session connection: behind PgBouncer in
        transaction mode, point ``listen_url`` at PostgreSQL itself or at a
        session-mode pool (docs/scaling.md). Reads go through the pool.
        """
        sid = check_session_id(session_id)

        async def start() -> int:
            here = self._here()
            if self._listen_url is not None and (here.listener is None
                                                 or here.listener.done()):
                here.listener = asyncio.create_task(self._listen(self._listen_url, here))

            async def op(conn: Conn) -> tuple[Any, ...] | None:
                cur = await conn.execute(self._q["watch_start"], {
                    "sid": sid, "after": None if after is None else id_key(after)})
                return await cur.fetchone()

            row = await self._run("watch", sid, op)
            if row is None or row[0] is None:
                raise SessionNotFound(sid, self._where)
            if after is None:
                return 0
            if row[1] is None:
                raise unknown_after(sid, after, self._where)
            return int(row[1])

        async def read(position: int) -> tuple[list[Entry], int]:
            async def op(conn: Conn) -> list[tuple[Any, ...]]:
                cur = await conn.execute(self._q["watch_read"], (sid, position), binary=True)
                return await cur.fetchall()

            rows = await self._run("watch", sid, op)
            return (decode_compact(rows, sid, self._where + ","),
                    int(rows[-1][0]) if rows else position)

        return follow(_payload(sid), start, read, self._wakeups, self.watch_interval)

    async def _listen(self, url: str, here: _LoopPool) -> None:
        """Hold a ``LISTEN`` connection while the store lives; reconnect when it drops.

        close() cancels this task only while it is idle (``here.waiting``):
        a connect or LISTEN cut by a cancel could leave its socket to the
        garbage collector. Busy, it sees the closed flag within one step.
        """
        delay = 0.05
        while not self._closed:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)),
                    application_name=self._listener_name)  # how appenders see a listener
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._listened, self._listened_at = True, time.monotonic()
                    delay = 0.05
                    # Appends made while nobody listened: every watcher reads again.
                    # (Notifications that arrive before the generator runs wait on
                    # the socket or in psycopg's backlog; none is lost.)
                    self._wakeups.ring()
                    # Bounded waits, because CPython 3.11's wait_for (inside
                    # psycopg's) can swallow the cancel; the closed flag then ends
                    # the task within one tick instead of never.
                    while not self._closed:
                        here.waiting = True
                        try:
                            async for note in conn.notifies(timeout=_LISTEN_TICK):
                                self._wakeups.ring(note.payload)
                        finally:
                            here.waiting = False
                return
            except psycopg.Error as exc:
                log.debug("%s: LISTEN connection lost, reconnecting: %s", self._where, exc)
            here.waiting = True
            try:
                await asyncio.sleep(delay)
            finally:
                here.waiting = False
            delay = min(delay * 2, 2.0)

    # -- the linear capability (S32) ----------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        sid = check_session_id(session_id)
        if not entries:
            await self.load_session(sid)
            return []
        stored: list[Entry] = list(entries)

        async def op(conn: Conn) -> int:
            async with conn.transaction():
                # The session row's lock is the one every appender takes, so no
                # append can land between reading the last entry and this one.
                cur = await conn.execute(self._q["lock_session"], (sid,))
                row = await cur.fetchone()
                if row is None:
                    raise SessionNotFound(sid, self._where)
                # A statement of its own: its snapshot, taken after the lock
                # was granted, sees the entries of the append that held it.
                # A retry (S25) keeps the parent its first entry was stored with.
                cur = await conn.execute(self._q["parent_of"], (sid, id_key(entries[0].id)))
                last = await cur.fetchone()
                if last is None:
                    cur = await conn.execute(self._q["entry_at"], (sid, row[0]))
                    last = await cur.fetchone()
                parent = None if last is None or last[0] is None else id_text(bytes(last[0]))
                stored[:] = chain_after(entries, parent)
                try:
                    query, params = _append_args(sid, [compact(e, encode_entry(e, session_id=sid))
                                                       for e in stored])
                    cur = await conn.execute(self._q[query], params)
                except psycopg.errors.UniqueViolation as exc:
                    raise _Repeated() from exc
            await self._notify(conn, sid)
            return cur.rowcount

        try:
            await self._run("append_linear", sid, op)
        except _Repeated:
            await self._check_retried(sid, [e.id for e in stored],
                                      [encode_entry(e) for e in stored])
        return stored

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        sid = check_session_id(session_id)

        if entry_id is None:
            return list(await self.load_entries(sid))

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            # One statement: the position and the rows after it come from one snapshot.
            cur = await conn.execute(self._q["after"], (sid, id_key(entry_id)), binary=True)
            return await cur.fetchall()

        rows = await self._run("load_entries_after", sid, op)
        if not rows:
            await self.load_session(sid)  # SessionNotFound if that is what it is
            raise entry_not_found(sid, entry_id, self._where)
        return list(decode_compact(rows[1:], sid, self._where + ","))


def _payload(sid: str) -> str:
    """The NOTIFY payload for session ``sid``: an md5, so any session id fits."""
    return hashlib.md5(sid.encode()).hexdigest()


class _Connection(psycopg.AsyncConnection[Any]):
    """A connection the store made: the one cursor it keeps, and its append's wire (S47)."""

    kept: psycopg.AsyncCursor[Any] | None = None
    wire: _Wire | None = None

    async def wait(self, *args: Any, **kwargs: Any) -> Any:
        # Every psycopg operation waits here: it reads the socket itself, so
        # the wire's reader steps aside (libpq may close the socket under it).
        if self.wire is not None:
            self.wire.unwatch()
        return await super().wait(*args, **kwargs)

    async def close(self) -> None:
        if self.wire is not None:
            self.wire.unwatch()
        await super().close()


class _Statement:
    """A statement as the wire sends it (S47): ``$n`` placeholders, its
    parameters' types given, all of them sent in binary."""

    __slots__ = ("formats", "name", "query", "types")

    def __init__(self, name: str, query: str, types: list[int]) -> None:
        placeholders = iter(range(1, len(types) + 1))
        self.query = re.sub("%s", lambda _: f"${next(placeholders)}", query).encode()
        self.name = name.encode()
        self.types = types
        self.formats = [1] * len(types)


def _statements(q: dict[str, str], schema: str) -> dict[str | int, _Statement]:
    """The wire's statements for a store's queries ``q``: the append of each
    size up to ``_VALUES_MAX`` by its size, and ``"notify"``."""
    prefix = f"threadline_{hashlib.md5(schema.encode()).hexdigest()[:16]}_"
    row = [_INT2_OID, _BYTEA_OID, _BYTEA_OID, _INT8_OID, _BYTEA_OID]
    out: dict[str | int, _Statement] = {
        n: _Statement(f"{prefix}append{n}", q[f"append{n}"], [_TEXT_OID, *row * n])
        for n in range(1, _VALUES_MAX + 1)}
    out["notify"] = _Statement(f"{prefix}notify", q["notify"], [_TEXT_OID] * 3)
    return out


_TEXT_OID, _INT2_OID, _BYTEA_OID, _INT8_OID = 25, 21, 17, 20
_int2 = struct.Struct("!h").pack
_int8 = struct.Struct("!q").pack
_ACTIVE = psycopg.pq.TransactionStatus.ACTIVE
_DONE = (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK)
_CONN_OK = psycopg.pq.ConnStatus.OK


class _Wire:
    """One store connection's append, and the NOTIFY after it, straight through libpq (S47).

    psycopg's execute adapts each parameter, keeps its prepared-statement
    bookkeeping, and waits through a generator that adds a reader to the
    event loop and removes it again: that pair alone is ~80k instructions
    (callgrind), three quarters of a whole blocking psycopg INSERT. The
    append knows its parameters' types, so it encodes them in binary itself,
    and the connection's socket keeps one reader on the loop from one append
    to the next. The reader reads only while an append waits: anything else
    that makes the socket readable (another operation's reply, the server
    closing an idle connection) makes it step aside, and every psycopg
    operation (``_Connection.wait``) and ``close`` take it off first.

    ``send`` and ``step`` never wait: ``run`` awaits what ``step`` gives
    until it gives None.
    """

    __slots__ = ("conn", "encoding", "fd", "last", "loop", "next", "pgconn", "prepared",
                 "result", "runs", "sent", "waiter", "watched", "writing")

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self.prepared: set[bytes] = set()
        self.runs: dict[bytes, int] = {}
        """How often each statement ran unprepared."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fd = -1
        self.watched = False
        self.waiter: asyncio.Future[None] | None = None
        self.writing = False
        self.result: psycopg.pq.abc.PGresult | None = None
        self.next: tuple[_Statement, list[bytes | None]] | None = None
        """The statement to send once its preparation succeeds."""
        self.sent: tuple[_Statement, list[bytes | None]] | None = None
        """The statement sent prepared, until its reply."""
        self.last: psycopg.pq.abc.PGresult | None = None

    async def run(self, statement: _Statement,
                  values: list[bytes | None]) -> psycopg.pq.abc.PGresult:
        """Send ``statement`` with ``values``; its result, or its error raised."""
        self.send(statement, values)
        while (waiter := self.step()) is not None:
            try:
                await waiter
            except BaseException as exc:
                self.waited()
                if isinstance(exc, asyncio.CancelledError):
                    await self.cancel()
                else:  # the reader's: the connection is lost
                    self.failed()
                raise
            self.waited()
        result, self.last = self.last, None
        assert result is not None
        return result

    def send(self, statement: _Statement, values: list[bytes | None]) -> None:
        """Send ``statement``; ``step`` then tells when its result is in."""
        name, pgconn = statement.name, self.pgconn
        try:
            if name in self.prepared:
                pgconn.send_query_prepared(name, values, statement.formats)
                self.sent = (statement, values)
                return
            # As psycopg does: prepared (one more round trip, once) after
            # ``prepare_threshold`` runs on this connection; never with None.
            threshold, runs = self.conn.prepare_threshold, self.runs.get(name, 0)
            if threshold is None or runs < threshold:
                self.runs[name] = runs + 1
                pgconn.send_query_params(statement.query, values, statement.types,
                                         statement.formats)
                return
            pgconn.send_prepare(name, statement.query, statement.types)
            self.next = (statement, values)
        except psycopg.Error:
            self.failed()
            raise

    def step(self) -> asyncio.Future[None] | None:
        """A future to await before the next step, or None once ``last`` is set.

        Raises the statement's error (psycopg's class for its SQLSTATE).
        """
        pgconn = self.pgconn
        try:
            while True:
                if pgconn.flush():  # rare: the socket's buffer is full
                    return self._wait(writing=True)
                if pgconn.is_busy():
                    return self._wait()
                got = pgconn.get_result()
                if got is not None:
                    if self.result is None or self.result.status in _DONE:
                        self.result = got  # the first error wins
                    continue
                result, self.result = self.result, None  # the reply has ended
                if result is None:
                    raise psycopg.InternalError("got no result from the query")
                sent, self.sent = self.sent, None
                if result.status not in _DONE:
                    error = psycopg.errors.error_from_result(result, encoding=self.encoding)
                    if (isinstance(error, psycopg.errors.InvalidSqlStatementName)
                            and sent is not None):
                        # The statement is gone from the server (DEALLOCATE,
                        # DISCARD ALL): nothing ran, so prepare it and send again.
                        self.prepared.discard(sent[0].name)
                        pgconn.send_prepare(sent[0].name, sent[0].query, sent[0].types)
                        self.next = sent
                        continue
                    if not (isinstance(error, psycopg.errors.DuplicatePreparedStatement)
                            and self.next is not None):
                        self.next = None
                        raise error
                    # Prepared already, by a preparation whose append was
                    # cancelled (``cancel``): use it.
                if self.next is None:
                    self.last = result
                    return None
                statement, values = self.next  # prepared: now the append itself
                self.next = None
                self.prepared.add(statement.name)
                pgconn.send_query_prepared(statement.name, values, statement.formats)
        except psycopg.Error:
            self.failed()
            raise

    def _wait(self, *, writing: bool = False) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        if writing:
            loop.add_writer(self.pgconn.socket, _settle, waiter)
            self.writing = True
        elif not self.watched:
            self.fd = self.pgconn.socket
            loop.add_reader(self.fd, self.readable)
            self.loop, self.watched = loop, True
        return waiter

    def waited(self) -> None:
        """After a future from ``step`` was awaited, settled or not."""
        self.waiter = None
        if self.writing:
            self.writing = False
            asyncio.get_running_loop().remove_writer(self.pgconn.socket)

    def readable(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # not an append's reply: leave it to its reader
            self.unwatch()
            return
        try:
            self.pgconn.consume_input()
        except psycopg.Error as exc:
            self.unwatch()  # at EOF the socket stays readable
            waiter.set_exception(exc)
            return
        if not self.pgconn.is_busy():
            waiter.set_result(None)

    def unwatch(self) -> None:
        if self.watched:
            self.watched = False
            assert self.loop is not None
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)

    def failed(self) -> None:
        """After an error: a connection libpq dropped has closed its socket."""
        self.result = self.next = self.sent = None
        if self.pgconn.status != _CONN_OK:
            self.unwatch()

    async def cancel(self) -> None:
        """Cancel the statement in flight and read its reply (as psycopg does), so
        the connection goes back to the pool idle (S45); else close the connection."""
        self.next = None  # a statement cancelled while being prepared is never sent
        if self.pgconn.transaction_status != _ACTIVE:
            return
        try:
            await self.conn.cancel_safe(timeout=5.0)
            async with asyncio.timeout(5.0):
                # QueryCanceled, or whatever the statement came to first:
                # either way its reply is read and the connection is idle.
                with contextlib.suppress(psycopg.DatabaseError):
                    while (waiter := self.step()) is not None:
                        try:
                            await waiter
                        finally:
                            self.waited()
            if self.pgconn.transaction_status == _IDLE:
                return
            problem = "its reply did not end the statement"
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.close()
                raise
            problem = type(exc).__name__
        log.warning("cancelling an append failed (%s): closing its connection", problem)
        self.close()

    def close(self) -> None:
        self.unwatch()
        self.pgconn.finish()


# _take and _give read and write psycopg_pool's own state as its getconn and
# putconn do, so only with the versions they were written against and tested
# with (pyproject allows 3.2 on); any other takes the pool's way.
_QUICK_POOL = tuple(int(p) for p in psycopg_pool.__version__.split(".")[:2]) in {(3, 2), (3, 3)}
# What they touch; a pool lacking any of it (a patch release that renamed
# one) takes the pool's way instead of failing an append. (Its ``_lock`` is
# made when it opens: looked up on each call.)
_POOL_STATE = ("_closed", "_waiting", "_check", "_pool", "_nconns_min", "_stats",
               "_REQUESTS_NUM", "_reset", "_pool_full_event")


def _quick(pool: Any) -> bool:
    return _QUICK_POOL and all(hasattr(pool, name) for name in _POOL_STATE)
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _take(pool: Any) -> Conn | None:
    """An idle connection from ``pool`` as ``getconn`` would hand it out, or None.

    ``getconn`` and ``putconn`` run a dozen coroutines, the pool's lock and
    its logging, ~40k instructions a pair (callgrind). When a connection is
    idle and nobody waits for one, taking it is a ``popleft``; anything
    else (no idle connection, waiters, a check to run, the lock held) is
    left to the pool.
    """
    lock = getattr(pool, "_lock", None)
    if (pool._closed or pool._waiting or pool._check or not pool._pool or lock is None
            or lock.locked()):
        return None
    conn: Conn = pool._pool.popleft()
    pool._nconns_min = min(pool._nconns_min, len(pool._pool))  # the pool shrinks by this
    pool._stats[pool._REQUESTS_NUM] += 1
    conn._pool = pool
    return conn


def _give(pool: Any, conn: Conn) -> bool:
    """Put ``conn`` back as ``putconn`` would for an idle, unexpired connection, or say no."""
    drained = getattr(pool, "_drained_at", None)  # psycopg_pool 3.3's drain()
    lock = getattr(pool, "_lock", None)
    if (pool._closed or pool._waiting or pool._reset or pool._pool_full_event is not None
            or lock is None or lock.locked() or conn.pgconn.transaction_status != _IDLE
            or conn._expire_at <= time.monotonic()
            or (drained is not None and getattr(conn, "_created_at", drained) <= drained)):
        return False
    conn._pool = None
    pool._pool.append(conn)
    return True


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _cursor(conn: Conn) -> psycopg.AsyncCursor[Any]:
    """A cursor for one statement whose result is read before the connection goes back.

    The store's own connections keep theirs: ``conn.execute`` makes a new
    cursor per statement, which cost an append ~35 us of CPU under load
    (docs/benchmarks.md). A pool passed in may hand out any connection class.
    """
    if isinstance(conn, _Connection):
        if conn.kept is None:
            conn.kept = conn.cursor()
        return conn.kept
    return conn.cursor()


def _taking_from(spare: list[Conn]) -> type[Conn]:
    """A connection class for a pool whose next connect takes one from ``spare``, if any.

    The store's first connection checks the server and the schema before the
    pool opens; given to the pool this way (psycopg_pool has no call to adopt
    a connection), it is the pool's first, and a cold open connects once.
    """

    class Connection(_Connection):
        @classmethod
        async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            if spare:
                return cast(Self, spare.pop())
            return await super().connect(conninfo, **kwargs)

    return Connection


class _LoopPool:
    __slots__ = ("down", "listener", "lock", "pool", "quick", "ready", "spare", "waiting")

    def __init__(self, pool: AsyncConnectionPool[Any], spare: list[Conn]) -> None:
        self.pool = pool
        self.quick = _quick(pool)
        """Whether appends may take and give its connections without its lock (_take)."""
        self.spare = spare
        """The connection ``_start`` made, until the pool takes it (``_taking_from``)."""
        self.lock = asyncio.Lock()  # made and used in the one loop this pool serves
        self.ready = False
        self.down = False
        """A connection failed: probe the server before trusting this pool again."""
        self.listener: asyncio.Task[None] | None = None
        """This loop's LISTEN connection task (watch), if one was started."""
        self.waiting = False
        """The listener is idle (waiting for news or to reconnect), where a cancel is safe."""


async def _apply_migrations(conn: Conn, ident: sql.Identifier) -> None:
    """Bring the schema to the latest version (in a transaction holding its lock)."""
    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    await conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {}.schema_migrations (version int PRIMARY KEY, "
        "applied_at timestamptz NOT NULL DEFAULT now())").format(ident))
    cur = await conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations").format(ident))
    row = await cur.fetchone()
    current = int(row[0]) if row else 0
    for version, script in MIGRATIONS:
        if version > current:
            if callable(script):
                await script(conn, ident)
            else:
                for stmt in script.split(";\n"):
                    if stmt.strip():
                        await conn.execute(sql.SQL(stmt).format(s=ident))
            await conn.execute(sql.SQL(
                "INSERT INTO {}.schema_migrations (version) VALUES (%s)").format(ident),
                (version,))


def _fixed(pool: AsyncConnectionPool[Any]) -> bool:
    """Whether ``pool`` connects with one conninfo string and keyword dict (a store's own does)."""
    return isinstance(pool.conninfo, str) and isinstance(pool.kwargs or {}, dict)


async def _taken(here: _LoopPool) -> None:
    """Give a pool that just opened the loop turns its first fill takes to take ``here.spare``.

    A call that found the pool empty meanwhile would grow it by one more
    connection. A pool with no min_size takes it when the first call grows it.
    """
    for _ in range(100):
        if not here.spare or not here.pool.min_size:
            return
        await asyncio.sleep(0)


async def _close_pool(here: _LoopPool) -> None:
    await here.pool.close()
    while here.spare:  # closed before a worker took it
        await here.spare.pop().close()


def _stop_listener(here: _LoopPool) -> None:
    """Cancel a loop's listener if it is idle; busy, it stops on the closed flag."""
    if here.listener is not None and here.waiting:
        here.listener.cancel()


def _append_args(sid: str, rows: Sequence[Row]) -> tuple[str, list[Any]]:
    """The name of the append statement for ``rows`` in ``_q``, and its parameters."""
    if len(rows) <= _VALUES_MAX:
        return f"append{len(rows)}", [sid, *itertools.chain.from_iterable(rows)]
    n = len(rows)
    return "append", [n, sid, n, *map(list, zip(*rows, strict=True))]
