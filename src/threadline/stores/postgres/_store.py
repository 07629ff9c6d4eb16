"""The PostgreSQL store: many processes and machines share one database.

psycopg 3 over psycopg-pool, the tables in a schema of their own. Every key
starts with ``session_id``, so the tables can be distributed by it. Each
session row holds a ``next_seq`` counter that an append bumps in the
statement that inserts its entries: appenders to one session queue on that
row, appenders to different sessions never wait for each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from threadline.errors import (
    BlobNotFound,
    ConfigError,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    missing_extra,
)
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry, SessionRecord
from threadline.session._metadata import MetadataChange
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
from threadline.stores._listing import check_listing, page_fetched_infos, touch_of
from threadline.stores._rows import Row, compact, decode_compact, id_key, id_text, row_line
from threadline.stores._rules import (
    aware,
    check_blob_key,
    check_blob_keys,
    check_entries,
    check_entry_id,
    check_record,
    check_retried_batch,
    check_session_id,
    check_tenant,
    to_micros,
)
from threadline.stores._search import check_search
from threadline.stores._watch import follow, unknown_after

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("postgres", "PostgresStore", exc) from exc

from threadline.stores.postgres import _catalog
from threadline.stores.postgres._pool import LoopPool, Pools, taking_from
from threadline.stores.postgres._queries import QUERIES, SET_TENANT, append_args
from threadline.stores.postgres._schema import migrate
from threadline.stores.postgres._search import active_paths, path_sql, search_args, search_sql
from threadline.stores.postgres._search import run_search as search_hits
from threadline.stores.postgres._watch import Notifier, payload
from threadline.stores.postgres._wire import (
    Connection,
    Statement,
    Wire,
    statements,
    values,
)

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

# Pipeline mode needs libpq 14 or later (psycopg-binary bundles one).
_PIPELINES = psycopg.Pipeline.is_supported()


class _Repeated(Exception):
    """An append met an id already stored: check whether it is a retry."""


def _repeats_an_id(exc: psycopg.errors.UniqueViolation) -> bool:
    """Whether the key ``exc`` names is the entry ids' own, the one a retry meets.

    Any other key (a number taken twice, an index's row) is a failure to report as
    it is, never a repeated append to check.
    """
    # An error the wire or a pipeline raised may carry no diagnostics: then the
    # server's message names the key.
    name = exc.diag.constraint_name
    if name is None:
        found = re.search(r'unique constraint "([^"]+)"', str(exc))
        name = found.group(1) if found else None
    return name in (None, "entries_session_id_entry_id_key")


# A connection lost or refused, or the server shutting down (admin or crash
# shutdown, starting up, an idle session ended): the outcome of a write in
# flight is unknown, and the same call can succeed once the server answers.
# Any other error is the server's answer to this call, and a retry would get it again.
_SHUTTING_DOWN = frozenset({"57P01", "57P02", "57P03", "57P05"})


def _lost(exc: psycopg.Error) -> bool:
    state = exc.sqlstate
    return isinstance(exc, psycopg.OperationalError) and (
        state is None or state.startswith("08") or state in _SHUTTING_DOWN)


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
    """A ``CatalogStore`` in PostgreSQL, usable as ``async with PostgresStore(...)``.

    ``url_or_pool`` is a libpq URL/conninfo string, or an
    ``AsyncConnectionPool`` the application already owns (the store then
    neither opens nor closes it, the pool options below are ignored, and it
    serves only the event loop it belongs to). ``schema`` holds the tables;
    it is created, and migrated under an advisory lock, on first use; with
    ``create=False`` a schema that does not exist is a ``StoreError``.
    ``prepare_threshold=None`` disables server-side prepared statements
    (needed behind PgBouncer's transaction pooling before 1.21, or with its
    ``max_prepared_statements`` at 0). ``min_size``, ``max_size``,
    ``timeout`` (seconds to wait for a pooled connection) and
    ``connect_timeout`` shape the pools the store makes: one per event loop
    it is used from, each closed when the store closes or its loop ends.
    The first use from a loop makes one plain connection before starting the
    pool, so a wrong host, database or password fails at once with the
    server's own reason; that connection then becomes the pool's first.

    ``listen_url`` is where ``watch`` opens its ``LISTEN`` connection
    (default: the store's URL); behind PgBouncer in transaction mode it must
    reach PostgreSQL directly or through a session-mode pool.

    ``tenant`` confines the store to one tenant's sessions: every
    statement names it, and row-level security, forced on every table, holds
    the rows to the tenant that each transaction sets with a transaction-local
    ``set_config`` sent in the same round trip as its statement (so it
    survives PgBouncer's transaction pooling). Such a store refuses to start
    as a role that bypasses row-level security (a superuser, or ``BYPASSRLS``)
    with a ``ConfigError`` naming the role, unless ``trusted=True``.
    Without a tenant the store serves the default tenant, ``''``.

    A lost connection, a server that is down or shutting down, or no pooled
    connection in time raise ``StoreUnavailable``: the outcome of a write is
    unknown, and retrying the same append is safe. Any other error from the
    server is a ``StoreError`` that names it.
    """

    watch_interval: float = 1.0
    """Seconds between reads of a watched session when no notification came.

    Notifications make delivery prompt; this read is the safety net for the
    moments the listening connection is down (and the only source of news
    when there is no ``listen_url``)."""

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
        tenant: str | None = None,
        trusted: bool = False,
    ) -> None:
        if not isinstance(schema, str) or not schema or "\x00" in schema:
            raise ConfigError(f"PostgresStore schema must be a non-empty name, got {schema!r}")
        self.tenant = None if tenant is None else check_tenant(tenant)
        self._t = self.tenant or ""
        self._trusted = trusted
        if max_size < 1 or not 0 <= min_size <= max_size:
            raise ConfigError(f"PostgresStore pool sizes need 0 <= min_size <= max_size and "
                              f"max_size >= 1, got min_size={min_size}, max_size={max_size}")
        self.schema = schema
        self._connect_timeout = connect_timeout
        self._create = create
        shown = "" if tenant is None else f", tenant {tenant!r}"
        spare: list[Conn] = []  # the first pool's (see taking_from)
        if isinstance(url_or_pool, AsyncConnectionPool):
            self._owns_pool = False
            self._where = f"postgres pool {url_or_pool.name!r}, schema {schema!r}{shown}"
            self._pools = Pools(url_or_pool, spare, None, self._where)
        elif isinstance(url_or_pool, str):
            self._owns_pool = True
            self._where = f"{redact(url_or_pool)}, schema {schema!r}{shown}"
            url = url_or_pool

            def new_pool(spare: list[Conn]) -> AsyncConnectionPool[Any]:
                return AsyncConnectionPool(
                    url, open=False, min_size=min_size, max_size=max_size, timeout=timeout,
                    connection_class=taking_from(spare),
                    kwargs={"autocommit": True, "prepare_threshold": prepare_threshold,
                            "connect_timeout": max(1, round(connect_timeout))},
                )

            self._pools = Pools(new_pool(spare), spare, new_pool, self._where)
        else:
            raise ConfigError(f"PostgresStore needs a URL or an AsyncConnectionPool, got "
                              f"{type(url_or_pool).__name__}")
        ident = sql.Identifier(schema)
        self._q = {k: sql.SQL(v).format(s=ident).as_string(None) for k, v in QUERIES.items()}
        self._schema_sql = ident.as_string(None)
        self._wire = statements(self._q, schema)
        self._set_tenant = Statement("threadline_set_tenant", SET_TENANT, [25])
        self._ready = False
        self._closed = False
        conninfo = url_or_pool if isinstance(url_or_pool, str) else self.pool.conninfo
        self._notifier = Notifier(schema, self._where, listen_url or (
            conninfo if isinstance(conninfo, str) else None), connect_timeout,
            self._wire["notify"], tenant=self.tenant)

    def __repr__(self) -> str:
        return f"PostgresStore({self._where})"

    async def __aenter__(self) -> PostgresStore:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The pool passed in, or the one the store made for the first loop it served."""
        return self._pools.first

    # -- plumbing ---------------------------------------------------------------

    async def _start(self, session_id: str | None = None) -> None:
        if self._closed:
            raise StoreError(f"{self._where}: store is closed", session_id=session_id)
        here = self._pools.here()
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
                    await here.taken()
                else:  # the application opened it already (``store.pool``)
                    await conn.close()
            if not self._ready:
                await self._with_conn("migrating the schema", session_id, self._migrate)
            self._ready = True  # once per store, whichever loop comes first
            here.ready = True

    async def _migrate(self, conn: Conn) -> None:
        await migrate(conn, self.schema, self._where, create=self._create)
        if self.tenant is None or self._trusted:
            return
        cur = await conn.execute("SELECT current_user, rolsuper, rolbypassrls FROM pg_roles "
                                 "WHERE rolname = current_user")
        row = await cur.fetchone()
        if row is None or row[1] or row[2]:
            what = "a superuser" if row is None or row[1] else "BYPASSRLS"
            role = row[0] if row else "the current role"
            raise ConfigError(
                f"{self._where}: role {role!r} is {what}, so row-level security does not "
                f"apply to it and tenant {self.tenant!r} would see every tenant's rows; "
                f"connect as a role with NOSUPERUSER NOBYPASSRLS, or pass trusted=True")

    async def _exec(self, conn: Conn, query: str, params: Any, *,
                    binary: bool = False) -> psycopg.AsyncCursor[Any]:
        """Run ``query`` as the store's tenant: in a transaction that sets it first.

        Not in psycopg's pipeline mode, which would save the round trips:
        leaving it sends a Flush after the Sync whenever the results have
        not arrived yet, and PgBouncer in transaction pooling then hands
        the client a server connection that no ReadyForQuery ever gives
        back, so other clients wait until its ``query_wait_timeout``. The
        appends' own pipeline (``_wire.py``) ends at its Sync.
        """
        if self.tenant is None:
            return await conn.execute(query, params, binary=binary)
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.execute(SET_TENANT, (self._t,))
            return await conn.execute(query, params, binary=binary)
        async with self._tx(conn):
            return await conn.execute(query, params, binary=binary)

    @contextlib.asynccontextmanager
    async def _tx(self, conn: Conn) -> AsyncIterator[None]:
        """A transaction that runs as the store's tenant."""
        deallocates = False
        try:
            async with conn.transaction():
                try:
                    if self.tenant is not None:
                        await conn.execute(SET_TENANT, (self._t,))
                    yield
                except BaseException:
                    deallocates = _psycopg_prepared(conn)
                    raise
        except BaseException:
            # psycopg follows a ROLLBACK with DEALLOCATE ALL when it has
            # statements of its own prepared (the rollback may have undone a
            # PREPARE); PgBouncer 1.22 and later apply it to the client's
            # statements too, and end the connection of a client that then
            # names one. The wire prepares its own again.
            if deallocates and isinstance(conn, Connection) and conn.wire is not None:
                conn.wire.prepared.clear()
            raise

    @contextlib.contextmanager
    def _errors(self, what: str, session_id: str | None, here: LoopPool) -> Iterator[None]:
        """psycopg's and the pool's errors as the store's, naming it and ``what``."""
        try:
            yield
        except psycopg.Error as exc:
            raise self._failure(exc, what, session_id, here) from exc

    def _failure(self, exc: psycopg.Error, what: str, session_id: str | None,
                 here: LoopPool) -> StoreError:
        """The store's error for psycopg's or the pool's ``exc``."""
        if isinstance(exc, PoolTimeout):
            return StoreUnavailable(f"{self._where}: no connection for {what} within the pool "
                                    f"timeout: {exc}", session_id=session_id)
        sess = f" (session {session_id!r})" if session_id else ""
        if _lost(exc):
            here.down = True  # a lost connection may hide more dead ones in the pool
            return StoreUnavailable(f"{self._where}: {what}{sess} failed; the outcome of a "
                                    f"write is unknown, retrying is safe: "
                                    f"{type(exc).__name__}: {exc}", session_id=session_id)
        return StoreError(f"{self._where}: {what}{sess} failed: "
                          f"{type(exc).__name__}: {exc}", session_id=session_id)

    async def _with_conn(self, what: str, session_id: str | None,
                         fn: Callable[[Conn], Awaitable[T]], *, scoped: bool = False) -> T:
        """``fn`` on a pooled connection, as the store's tenant.

        ``scoped``: ``fn`` sets the tenant itself (``_exec``, ``_tx``), in
        fewer round trips; otherwise it runs in a transaction that does.
        """
        if self._closed:
            raise StoreError(f"{self._where}: store is closed", session_id=session_id)
        here = self._pools.here()
        if here.down:
            await self._probe(what, session_id, here)
        pool = here.pool
        try:
            # getconn/putconn rather than pool.connection(): the context
            # manager adds a commit() call (a no-op in autocommit) and its own
            # generator frame. putconn rolls back or replaces a connection
            # left in a transaction or broken, as the manager would.
            conn = await pool.getconn()
            try:
                if conn.autocommit and (scoped or self.tenant is None):
                    return await fn(conn)
                # A pool the application passed in may hand out connections
                # outside autocommit: commit here, or the pool rolls back.
                async with self._tx(conn) if not scoped else conn.transaction():
                    return await fn(conn)
            finally:
                await pool.putconn(conn)
        except psycopg.Error as exc:
            raise self._failure(exc, what, session_id, here) from exc

    async def _connect(self, what: str, session_id: str | None, here: LoopPool) -> Conn:
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
            return await Connection.connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            # libpq repeats the reason once per address it tried; the first line says it.
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise StoreUnavailable(f"{self._where}: {what}: cannot connect: {reason}",
                                   session_id=session_id) from exc

    async def _probe(self, what: str, session_id: str | None, here: LoopPool) -> None:
        """Fail fast while the server is down; once it answers, renew the pool."""
        if _fixed(here.pool):  # else computed per connection: only the pool can try
            await (await self._connect(what, session_id, here)).close()
        here.down = False
        if not here.pool.closed:
            await here.pool.check()  # drop the pooled connections that died

    async def _run(self, what: str, session_id: str | None,
                   fn: Callable[[Conn], Awaitable[T]], *, scoped: bool = False) -> T:
        await self._start(session_id)
        return await self._with_conn(what, session_id, fn, scoped=scoped)

    def _record(self, row: tuple[Any, ...]) -> SessionRecord:
        return SessionRecord(id=row[0], parent_id=row[1], created_at=row[2].astimezone(UTC))

    # -- the Store contract -----------------------------------------------------

    async def create_session(self, record: SessionRecord) -> None:
        sid = check_record(record)
        created = aware(record.created_at)

        async def op(conn: Conn) -> int:
            cur = await self._exec(conn, self._q["create"],
                                   (self._t, sid, record.parent_id, created, to_micros(created)))
            return cur.rowcount

        if await self._run("create_session", sid, op, scoped=True) == 0:
            raise SessionExists(sid, self._where)

    async def load_entries(self, session_id: str) -> EntryLog:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await self._exec(conn, self._q["load"], (self._t, sid), binary=True)
            return await cur.fetchall()

        rows = await self._run("load_entries", sid, op, scoped=True)
        if not rows:
            raise SessionNotFound(sid, self._where)
        return decode_compact(rows, sid, self._where + ",")

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        sid = check_session_id(session_id)
        entries = check_entries(entries, sid, "append_entries")
        if not entries:
            await self.load_session(sid)  # an empty append still requires the session
            return
        datas = [encode_entry(e, session_id=sid) for e in entries]
        rows = [compact(e, d) for e, d in zip(entries, datas, strict=True)]
        newest, change = touch_of(entries)
        here = self._pools.get(asyncio.get_running_loop())  # None: this loop's first call
        statement = self._wire.get(len(rows))
        try:
            if (here is None or not here.ready or here.down or self._closed or statement is None
                    or not self._owns_pool or (self.tenant is not None and not _PIPELINES)
                    or change is not None):
                # The first call from this loop, a pool to probe, a closed store,
                # a pool passed in, more than VALUES_MAX entries, or metadata to
                # change in the same transaction: through psycopg.
                stored = await self._append(sid, rows, newest, change)
            else:
                stored = await self._wire_append(here, statement, sid, rows, newest)
            if stored == 0:
                raise SessionNotFound(sid, self._where)
        except _Repeated:
            await self._check_retried(sid, [e.id for e in entries], datas)

    async def _append(self, sid: str, rows: list[Row], newest: int | None,
                      change: MetadataChange | None) -> int:
        """Store ``rows`` after the session's last entry; how many were stored (0: no session)."""
        name, params = append_args(self._t, sid, rows, newest)
        query = self._q[name]

        async def op(conn: Conn) -> int:
            try:
                if change is None:
                    stored = (await self._exec(conn, query, params)).rowcount
                else:
                    async with self._tx(conn):
                        stored = (await conn.execute(query, params)).rowcount
                        await conn.execute(self._q["metadata"],
                                           _catalog.metadata_args(self._t, sid, change))
            except psycopg.errors.UniqueViolation as exc:
                if not _repeats_an_id(exc):
                    raise
                raise _Repeated() from exc
            if stored:
                await self._notifier.notify(conn, sid)
            return stored

        return await self._run("append_entries", sid, op, scoped=True)

    async def _wire_append(self, here: LoopPool, statement: Statement, sid: str,
                           rows: list[Row], newest: int | None) -> int:
        """``_append`` on the store's own pool, its statement sent on the wire."""
        pool = here.pool
        try:
            conn = cast(Connection, await pool.getconn())  # the store's pool makes only these
            try:
                wire = conn.wire or Wire(conn)
                conn.wire = wire
                params = values(self._t.encode(wire.encoding), sid.encode(wire.encoding), rows,
                                newest)
                if self.tenant is None:
                    result = await wire.run(statement, params)
                else:
                    result = await wire.run_after(
                        self._set_tenant, [params[1]], statement, params)
                stored = int(result.command_tuples or 0)
                if stored:
                    await self._notifier.notify(conn, sid)
            finally:
                await pool.putconn(conn)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.errors.UniqueViolation) and _repeats_an_id(exc):
                raise _Repeated() from exc
            raise self._failure(exc, "append_entries", sid, here) from exc
        return stored

    async def _check_retried(self, sid: str, ids: list[str], datas: list[bytes]) -> None:
        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await self._exec(conn, self._q["stored_batch"],
                                   (self._t, sid, [id_key(i) for i in ids]), binary=True)
            return await cur.fetchall()

        rows = await self._run("append_entries (checking stored ids)", sid, op, scoped=True)
        check_retried_batch(sid, list(zip(ids, datas, strict=True)),
                            {id_text(r[2]): (r[0], row_line(r, sid, self._where + ","))
                             for r in rows}, self._where)

    # -- beyond the contract ----------------------------------------------------

    async def load_session(self, session_id: str) -> SessionRecord:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> tuple[Any, ...] | None:
            cur = await self._exec(conn, self._q["session"], (self._t, sid))
            return await cur.fetchone()

        row = await self._run("load_session", sid, op, scoped=True)
        if row is None:
            raise SessionNotFound(sid, self._where)
        return self._record(row)

    async def search(self, query: str, *, owner: str | None = None, tenant: str | None = None,
                     active_path: bool = False, limit: int = 20) -> list[SearchHit]:
        """Full-text search across sessions (``SearchableStore``; GIN, docs/search.md)."""
        q = check_search(query, owner, tenant, limit, active_path)
        ident = sql.Identifier(self.schema)
        statement = search_sql(ident, q)
        args = search_args(self._t, q)

        async def op(conn: Conn) -> list[SearchHit]:
            if not active_path:  # one statement: one snapshot, no transaction to open
                return search_hits(await (await conn.execute(statement, args)).fetchall(),
                                   q, None)
            # One snapshot for the hits and the paths they are checked against.
            async with conn.transaction():
                if conn.autocommit:  # else a savepoint in the caller's transaction
                    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                rows = await (await conn.execute(statement, args)).fetchall()
                parents: dict[str, dict[bytes, bytes | None]] = {}
                for sid in dict.fromkeys(r[0] for r in rows):
                    cur = await conn.execute(path_sql(ident), (self._t, sid))
                    parents[sid] = {bytes(i): None if p is None else bytes(p)
                                    for i, p in await cur.fetchall()}
                return search_hits(rows, q, active_paths(parents))

        return await self._run("search", None, op)

    async def list_sessions(
        self, *, limit: int = 100, cursor: str | None = None, owner: str | None = None,
        tenant: str | None = None, labels: Mapping[str, str] | None = None,
        order: ListOrder = "created",
    ) -> SessionPage:
        after, filters = check_listing(limit, cursor, order, owner=owner, tenant=tenant,
                                       labels=labels)
        query, args = _catalog.list_query(self._t, limit, after, filters, order)
        # Built from fixed pieces and the schema quoted once, as the other queries are
        # (composing it per call cost a fifth of a listing).
        statement: Any = query.replace("{s}", self._schema_sql)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await self._exec(conn, statement, args)
            return await cur.fetchall()

        rows = await self._run("list_sessions", None, op, scoped=True)
        return page_fetched_infos([_catalog.info(r) for r in rows], limit, order)

    async def delete_session(self, session_id: str) -> None:
        sid = check_session_id(session_id)

        async def op(conn: Conn) -> None:
            async with self._tx(conn):
                cur = await conn.execute(self._q["delete_session"], (self._t, sid))
                if cur.rowcount == 0:
                    raise SessionNotFound(sid, self._where)
                await conn.execute(self._q["delete_entries"], (self._t, sid))

        await self._run("delete_session", sid, op, scoped=True)

    async def prune_session(self, session_id: str, choose: Choose, *,
                            batch: int = 1000) -> Cut:
        """Remove what ``choose`` picks, at most ``batch`` entries a transaction.

        Each transaction first locks the session's row, the lock every
        append's ``UPDATE`` takes, so no append to the session lands between
        the read ``choose`` sees and the delete; between two, appends go on,
        and the next asks ``choose`` again on what is stored then. A whole
        session goes in one transaction.
        """
        sid = check_session_id(session_id)
        if not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch is an integer of at least 1, got {batch!r}")
        removed: list[str] = []

        async def op(conn: Conn) -> tuple[Cut, bool]:
            async with self._tx(conn):
                cur = await conn.execute(self._q["prune_lock"], (self._t, sid))
                row = await cur.fetchone()
                if row is None:
                    if not removed:
                        raise SessionNotFound(sid, self._where)
                    return Cut(), False
                cur = await conn.execute(self._q["prune_load"], (self._t, sid), binary=True)
                entries = decode_compact(await cur.fetchall(), sid, self._where + ",")
                cut = choose(self._record(row), entries)
                if cut.session:
                    await conn.execute(self._q["delete_session"], (self._t, sid))
                    await conn.execute(self._q["delete_entries"], (self._t, sid))
                    return cut, False
                present = {e.id for e in entries}
                wanted = [i for i in dict.fromkeys(cut.entries) if i in present]
                now = wanted[:batch]
                if now:
                    await conn.execute(self._q["prune_delete"],
                                       (self._t, sid, [id_key(i) for i in now]))
                return Cut(entries=tuple(now)), len(wanted) > batch

        while True:
            cut, more = await self._run("prune_session", sid, op, scoped=True)
            if cut.session:
                return cut
            removed += cut.entries
            if not more:
                return Cut(entries=tuple(removed))

    # -- blobs, in the same schema (S57) ---------------------------------------------

    async def put_blob(self, key: str, data: bytes) -> None:
        check_blob_key(key)
        data = bytes(data)

        async def op(conn: Conn) -> None:
            # Stored already: only the touched time changes (the bytes are not sent).
            if (await conn.execute(self._q["blob_touch"], (self._t, key))).rowcount == 0:
                await conn.execute(self._q["blob_put"], (self._t, key, len(data), data))

        await self._run(f"put_blob {key}", None, op)

    async def get_blob(self, key: str) -> bytes:
        check_blob_key(key)

        async def op(conn: Conn) -> tuple[Any, ...] | None:
            cur = await conn.execute(self._q["blob_get"], (self._t, key), binary=True)
            return await cur.fetchone()

        row = await self._run(f"get_blob {key}", None, op)
        if row is None:
            raise BlobNotFound(key, self._where)
        return bytes(row[0])

    async def has_blobs(self, keys: Sequence[str]) -> set[str]:
        wanted = check_blob_keys(keys)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._q["blob_has"], (self._t, wanted))).fetchall()

        return {r[0] for r in await self._run("has_blobs", None, op)} if wanted else set()

    async def touch_blobs(self, keys: Sequence[str]) -> set[str]:
        """Refresh the touched time of those of ``keys`` that are stored; return them."""
        wanted = list(dict.fromkeys(check_blob_keys(keys)))

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute(self._q["blob_touch_many"], (self._t, wanted))
            return await cur.fetchall()

        return {r[0] for r in await self._run("touch_blobs", None, op)} if wanted else set()

    async def list_blobs(self) -> list[BlobInfo]:
        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._q["blob_list"], (self._t,))).fetchall()

        return [BlobInfo(key=k, size=n, touched_at=t.astimezone(UTC))
                for k, n, t in await self._run("list_blobs", None, op)]

    async def delete_blobs(self, keys: Sequence[str], *, older_than: datetime) -> list[str]:
        wanted = list(dict.fromkeys(check_blob_keys(keys)))
        cutoff = aware(older_than)

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute(self._q["blob_delete"], (self._t, wanted, cutoff))
            return await cur.fetchall()

        return [r[0] for r in await self._run("delete_blobs", None, op)] if wanted else []

    async def close(self) -> None:
        """Close the pools the store made and its LISTEN connections; a pool passed in
        stays open."""
        if self._closed:
            return
        self._closed = self._notifier.closed = True
        await self._pools.close()

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow a session: ``LISTEN`` for appends, then read ``seq > last``.

        Every store NOTIFYs after each append it commits while some store
        listens (rows written by other means, and appends made just before
        an appender notices a new listener, are found by the
        ``watch_interval`` read). The listening connection is the store's
        own, opened on ``listen_url`` (default: the store's URL). It must be
        a session connection: behind PgBouncer in transaction mode, point
        ``listen_url`` at PostgreSQL itself or at a session-mode pool
        (docs/scaling.md). Reads go through the pool.
        """
        sid = check_session_id(session_id)
        after = check_entry_id(after, sid, "watch")

        async def start() -> int:
            self._notifier.listen(self._pools.here())

            async def op(conn: Conn) -> tuple[Any, ...] | None:
                cur = await self._exec(conn, self._q["watch_start"], {
                    "t": self._t, "sid": sid, "after": None if after is None else id_key(after)})
                return await cur.fetchone()

            row = await self._run("watch", sid, op, scoped=True)
            if row is None or row[0] is None:
                raise SessionNotFound(sid, self._where)
            if after is None:
                return 0
            if row[1] is None:
                raise unknown_after(sid, after, self._where)
            return int(row[1])

        async def read(position: int) -> tuple[list[Entry], int]:
            async def op(conn: Conn) -> list[tuple[Any, ...]]:
                cur = await self._exec(conn, self._q["watch_read"], (self._t, sid, position),
                                       binary=True)
                return await cur.fetchall()

            rows = await self._run("watch", sid, op, scoped=True)
            return (decode_compact(rows, sid, self._where + ","),
                    int(rows[-1][0]) if rows else position)

        return follow(payload(sid), start, read, self._notifier.wakeups, self.watch_interval)

    # -- the linear capability ------------------------------------------------------

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        sid = check_session_id(session_id)
        entries = check_entries(entries, sid, "append_linear")
        if not entries:
            await self.load_session(sid)
            return []
        for entry in entries:  # InvalidEntry before anything is read
            encode_entry(entry, session_id=sid)
        stored: list[Entry] = list(entries)

        async def op(conn: Conn) -> int:
            async with self._tx(conn):
                # The session row's lock is the one every appender takes, so no
                # append can land between reading the last entry and this one.
                cur = await conn.execute(self._q["lock_session"], (self._t, sid))
                row = await cur.fetchone()
                if row is None:
                    raise SessionNotFound(sid, self._where)
                # A statement of its own: its snapshot, taken after the lock
                # was granted, sees the entries of the append that held it.
                # A retry (S25) keeps the parent its first entry was stored with.
                cur = await conn.execute(self._q["parent_of"],
                                         (self._t, sid, id_key(entries[0].id)))
                last = await cur.fetchone()
                if last is None:
                    cur = await conn.execute(self._q["entry_at"], (self._t, sid, row[0]))
                    last = await cur.fetchone()
                parent = None if last is None or last[0] is None else id_text(bytes(last[0]))
                stored[:] = chain_after(entries, parent)
                newest, change = touch_of(stored)
                try:
                    query, params = append_args(
                        self._t, sid, [compact(e, encode_entry(e, session_id=sid))
                                       for e in stored], newest)
                    cur = await conn.execute(self._q[query], params)
                    if change is not None and cur.rowcount:
                        await conn.execute(self._q["metadata"],
                                           _catalog.metadata_args(self._t, sid, change))
                except psycopg.errors.UniqueViolation as exc:
                    if not _repeats_an_id(exc):
                        raise
                    raise _Repeated() from exc
            await self._notifier.notify(conn, sid)
            return cur.rowcount

        try:
            await self._run("append_linear", sid, op, scoped=True)
        except _Repeated:
            await self._check_retried(sid, [e.id for e in stored],
                                      [encode_entry(e) for e in stored])
        return stored

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        sid = check_session_id(session_id)
        after = check_entry_id(entry_id, sid, "load_entries_after")
        if after is None:
            return list(await self.load_entries(sid))

        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            # One statement: the position and the rows after it come from one snapshot.
            cur = await self._exec(conn, self._q["after"],
                                   {"t": self._t, "sid": sid, "after": id_key(after)},
                                   binary=True)
            return await cur.fetchall()

        rows = await self._run("load_entries_after", sid, op, scoped=True)
        if not rows:
            await self.load_session(sid)  # SessionNotFound if that is what it is
            raise entry_not_found(sid, after, self._where)
        return list(decode_compact(rows[1:], sid, self._where + ","))


def _psycopg_prepared(conn: Conn) -> bool:
    """Whether psycopg holds statements it prepared on ``conn`` (it deallocates them
    all after a ROLLBACK). Read from its private state; False when that is not there."""
    names = getattr(getattr(conn, "_prepared", None), "_names", None)
    return False if names is None else bool(names)


def _fixed(pool: AsyncConnectionPool[Any]) -> bool:
    """Whether ``pool`` connects with one conninfo string and keyword dict (a store's own does)."""
    return isinstance(pool.conninfo, str) and isinstance(pool.kwargs or {}, dict)
