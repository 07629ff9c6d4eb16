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

Entries are stored as ``bytea`` holding the codec's exact bytes (measured in
``bench/sql_stores.py`` against ``jsonb``: bytea is smaller on disk for these
small documents, loads faster, and round-trips byte for byte, which ``jsonb``
does not since it reorders keys and drops whitespace).

Behind PgBouncer (transaction pooling) pass ``prepare_threshold=None`` so no
server-side prepared statement outlives a transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from threadline.errors import (
    ConfigError,
    SessionExists,
    SessionNotFound,
    StoreError,
    missing_extra,
)
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._store import EntryLog, SessionPage, decode_cursor
from threadline.session._storekit import (
    aware,
    check_limit,
    check_record,
    check_session_id,
    decode_rows,
    entry_type,
    page_fetched,
)

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("postgres", "PostgresStore", exc) from exc

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

# Append-only: a released version is never edited, a change is a new version.
# ``{s}`` is the schema. COLLATE "C" orders ids by code point, as the other
# stores do, whatever the database's locale.
MIGRATIONS: tuple[tuple[int, str], ...] = (
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
)

_Q = {
    "create": "INSERT INTO {s}.sessions (session_id, parent_id, created_at) "
              "VALUES (%s, %s, %s) ON CONFLICT (session_id) DO NOTHING",
    # One statement: the UPDATE's row lock orders appenders to one session and
    # its RETURNING numbers the new entries.
    "append": "WITH s AS (UPDATE {s}.sessions SET next_seq = next_seq + %(n)s "
              "WHERE session_id = %(sid)s RETURNING next_seq - %(n)s AS base) "
              "INSERT INTO {s}.entries (session_id, seq, entry_id, parent_id, type, data) "
              "SELECT %(sid)s, s.base + e.ord, e.entry_id, e.parent_id, e.type, e.data "
              "FROM s, unnest(%(ids)s::text[], %(parents)s::text[], %(types)s::text[], "
              "%(datas)s::bytea[]) WITH ORDINALITY AS e(entry_id, parent_id, type, data, ord)",
    "load": "SELECT e.seq, e.data FROM {s}.sessions s LEFT JOIN {s}.entries e "
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
}


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
    prepared statements (PgBouncer transaction pooling). ``min_size``,
    ``max_size``, ``timeout`` (seconds to wait for a pooled connection) and
    ``connect_timeout`` shape the pool the store creates. The first use makes
    one plain connection before starting the pool, so a wrong host, database or
    password fails at once with the server's own reason instead of pool retries.
    With ``create=False`` a schema that does not exist is a ``StoreError``
    rather than being created.
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
    ) -> None:
        if not isinstance(schema, str) or not schema or "\x00" in schema:
            raise ConfigError(f"PostgresStore schema must be a non-empty name, got {schema!r}")
        if max_size < 1 or not 0 <= min_size <= max_size:
            raise ConfigError(f"PostgresStore pool sizes need 0 <= min_size <= max_size and "
                              f"max_size >= 1, got min_size={min_size}, max_size={max_size}")
        self.schema = schema
        self._connect_timeout = connect_timeout
        self._create = create
        self._url = url_or_pool if isinstance(url_or_pool, str) else None
        if isinstance(url_or_pool, AsyncConnectionPool):
            self._pool: AsyncConnectionPool[Any] = url_or_pool
            self._owns_pool = False
            self._where = f"postgres pool {url_or_pool.name!r}, schema {schema!r}"
        elif isinstance(url_or_pool, str):
            self._owns_pool = True
            self._where = f"{redact(url_or_pool)}, schema {schema!r}"
            self._pool = AsyncConnectionPool(
                url_or_pool, open=False, min_size=min_size, max_size=max_size,
                timeout=timeout,
                kwargs={"autocommit": True, "prepare_threshold": prepare_threshold,
                        "connect_timeout": max(1, round(connect_timeout))},
            )
        else:
            raise ConfigError(f"PostgresStore needs a URL or an AsyncConnectionPool, got "
                              f"{type(url_or_pool).__name__}")
        ident = sql.Identifier(schema)
        self._q = {k: sql.SQL(v).format(s=ident).as_string(None) for k, v in _Q.items()}
        self._ready = False
        self._ready_lock: asyncio.Lock | None = None
        self._closed = False

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

    async def _start(self, session_id: str | None = None) -> None:
        if self._closed:
            raise StoreError(f"{self._where}: store is closed")
        if self._ready:
            return
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if self._ready:
                return
            if self._url is not None:
                await self._probe(self._url, session_id)
                try:
                    await self._pool.open(wait=True, timeout=self._connect_timeout)
                except (PoolTimeout, psycopg.Error) as exc:
                    await self._pool.close()
                    raise StoreError(f"{self._where}: cannot connect within "
                                     f"{self._connect_timeout:g}s: {exc}",
                                     session_id=session_id) from exc
            await self._with_conn("migrating the schema", None, self._migrate)
            self._ready = True

    async def _probe(self, url: str, session_id: str | None) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)))
        except psycopg.Error as exc:
            # libpq repeats the reason once per address it tried; the first line says it.
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise StoreError(f"{self._where}: cannot connect: {reason}",
                             session_id=session_id) from exc
        async with conn:
            if self._create:
                return
            cur = await conn.execute("SELECT to_regclass(%s)",
                                     (sql.Identifier(self.schema, "sessions").as_string(None),))
            row = await cur.fetchone()
            if row is None or row[0] is None:
                raise StoreError(f"no threadline store in {self._where}: "
                                 f"the schema or its tables do not exist",
                                 session_id=session_id)

    async def _migrate(self, conn: Conn) -> None:
        ident = sql.Identifier(self.schema)
        # A lock id per schema: processes migrating other schemas do not wait.
        key = int.from_bytes(
            hashlib.blake2b(f"threadline:{self.schema}".encode(), digest_size=8).digest(),
            "big", signed=True)
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            await conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_migrations (version int PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())").format(ident))
            cur = await conn.execute(
                sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations")
                .format(ident))
            row = await cur.fetchone()
            current = int(row[0]) if row else 0
            for version, script in MIGRATIONS:
                if version > current:
                    for stmt in script.split(";"):
                        if stmt.strip():
                            await conn.execute(sql.SQL(stmt).format(s=ident))
                    await conn.execute(sql.SQL(
                        "INSERT INTO {}.schema_migrations (version) VALUES (%s)").format(ident),
                        (version,))

    async def _with_conn(self, what: str, session_id: str | None,
                         fn: Callable[[Conn], Awaitable[T]]) -> T:
        if self._closed:
            raise StoreError(f"{self._where}: store is closed", session_id=session_id)
        try:
            async with self._pool.connection() as conn:
                if conn.autocommit:
                    return await fn(conn)
                # A pool the application passed in may hand out connections
                # outside autocommit: commit here, or the pool rolls back.
                async with conn.transaction():
                    return await fn(conn)
        except PoolTimeout as exc:
            raise StoreError(f"{self._where}: no connection for {what} within the pool "
                             f"timeout: {exc}", session_id=session_id) from exc
        except psycopg.Error as exc:
            sess = f" (session {session_id!r})" if session_id else ""
            raise StoreError(f"{self._where}: {what}{sess} failed: "
                             f"{type(exc).__name__}: {exc}", session_id=session_id) from exc

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
        return decode_rows(rows, sid, self._where + ",")

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        sid = check_session_id(session_id)
        datas = [encode_entry(e, session_id=sid) for e in entries]
        if not entries:
            await self.load_session(sid)  # an empty append still requires the session
            return
        params = {
            "sid": sid, "n": len(entries),
            "ids": [e.id for e in entries], "parents": [e.parent_id for e in entries],
            "types": [entry_type(e) for e in entries],
            "datas": datas,
        }

        async def op(conn: Conn) -> int:
            try:
                cur = await conn.execute(self._q["append"], params)
            except psycopg.errors.UniqueViolation as exc:
                raise StoreError(f"{self._where}: append to session {sid!r} repeats an entry "
                                 f"id already in the session: {exc}", session_id=sid) from exc
            return cur.rowcount

        if await self._run("append_entries", sid, op) == 0:
            raise SessionNotFound(sid, self._where)

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
        if self._owns_pool:
            await self._pool.close()
