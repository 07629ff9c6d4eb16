"""Tenants in PostgreSQL (S72, S73): a store opened for one tenant reads and
writes nothing of another, through its API and through raw SQL on its own
connections, directly and through PgBouncer in transaction pooling.

The store connects as a role made here (``NOSUPERUSER NOBYPASSRLS``), as a
multi-tenant deployment must: row-level security does not apply to a
superuser, and the store refuses one unless told it is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from conftest import require_or_skip
from support.pgbouncer import PgBouncer, prepared_pgbouncer
from threadline.ai._messages import UserMessage
from threadline.errors import (
    BlobNotFound,
    ConfigError,
    EntryNotFound,
    SessionNotFound,
    StoreError,
)
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import PostgresStore, Store, attach, collect_garbage
from threadline.testing import StoreConformance
from threadline.testing._conformance import StoreOpener

_HOSTILE = "acme\u202e<b>\"'; DROP TABLE x; --"


def _entry(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage.of(text))


def _as(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def _sql(url: str, *statements: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _make_role(url: str, schema: str, *, bypass: bool = False) -> str:
    """A login role (no superuser, no BYPASSRLS unless asked) that may use ``schema``."""
    role = f"tl_role_{secrets.token_hex(4)}"
    r, s = sql.Identifier(role), sql.Identifier(schema)
    _sql(url,
         sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER {}").format(
             r, sql.SQL("BYPASSRLS" if bypass else "NOBYPASSRLS")),
         sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r),
         sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}")
         .format(s, r))
    return role


def _drop_role(url: str, role: str) -> None:
    r = sql.Identifier(role)
    _sql(url, sql.SQL("DROP OWNED BY {}").format(r), sql.SQL("DROP ROLE {}").format(r))


async def _open(url: str, schema: str) -> None:
    async with PostgresStore(url, schema=schema, max_size=1):
        pass


def _migrated(url: str, schema: str) -> None:
    asyncio.run(_open(url, schema))


@pytest.fixture
def rls_role(pg_url: str, pg_schema: str) -> Iterator[str]:
    """The schema migrated (by its owner), and a role without RLS bypass granted on it."""
    _migrated(pg_url, pg_schema)
    role = _make_role(pg_url, pg_schema)
    yield role
    _drop_role(pg_url, role)


@pytest.fixture
def rls_url(pg_url: str, rls_role: str) -> str:
    return _as(pg_url, rls_role)


def _bouncer(pg_url: str, role: str, binary: str | None) -> PgBouncer:
    parts = urlsplit(pg_url)
    b = PgBouncer(server_host=parts.hostname or "127.0.0.1", server_port=parts.port or 5432,
                  dbname=parts.path.lstrip("/") or "test", user=role, pool_size=1,
                  binary=binary, max_prepared_statements=200 if binary else 0)
    b.start()
    return b


@pytest.fixture
def bouncer(pg_url: str, rls_role: str) -> Iterator[PgBouncer]:
    """PgBouncer 1.21+ in transaction pooling for the role, on ONE server connection,
    so the transactions of both tenants' stores (and raw clients) take turns on it."""
    binary = prepared_pgbouncer()
    if binary is None:
        require_or_skip("no pgbouncer 1.21 or later here (.ci/run builds 1.24 into /opt)")
    b = _bouncer(pg_url, rls_role, binary)
    yield b
    b.close()


@pytest.fixture
def old_bouncer(pg_url: str, rls_role: str) -> Iterator[PgBouncer]:
    """The system's PgBouncer (1.18 on Debian 12): no prepared statements kept."""
    if shutil.which("pgbouncer") is None:
        require_or_skip("pgbouncer is not installed (apt-get install pgbouncer)")
    b = _bouncer(pg_url, rls_role, None)
    yield b
    b.close()


@pytest.fixture(params=["direct", "pgbouncer", "pgbouncer-unprepared"])
def route(request: pytest.FixtureRequest, rls_url: str) -> tuple[str, str]:
    """(the URL the stores use, the URL their LISTEN connections use)."""
    if request.param == "direct":
        return rls_url, rls_url
    if request.param == "pgbouncer":
        return request.getfixturevalue("bouncer").url, rls_url
    return request.getfixturevalue("old_bouncer").url + "?prepare_threshold=none", rls_url


@contextlib.asynccontextmanager
async def _stores(url: str, listen: str, schema: str,
                  *tenants: str) -> AsyncIterator[list[PostgresStore]]:
    url, _, query = url.partition("?")
    threshold = None if query == "prepare_threshold=none" else 5
    stores = [PostgresStore(url, schema=schema, tenant=t, listen_url=listen, max_size=2,
                            prepare_threshold=threshold) for t in tenants]
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()


async def _fill_b(b: Store) -> dict[str, list[str]]:
    """Tenant B's sessions: one of its own, one whose id tenant A also uses."""
    ids: dict[str, list[str]] = {}
    for sid in ("b-only", "shared"):
        await b.create_session(SessionRecord(id=sid))
        batch1 = [_entry(f"B {sid} {n}") for n in range(3)]
        batch2 = [_entry(f"B {sid} big {n}") for n in range(12)]  # the unnest form
        for batch in (batch1, batch2):
            await b.append_entries(sid, batch)
        ids[sid] = [e.id for e in batch1 + batch2]
    return ids


async def test_s72_a_tenant_lists_loads_appends_watches_nothing_of_another(
    route: tuple[str, str], pg_schema: str
) -> None:
    url, listen = route
    async with _stores(url, listen, pg_schema, "tenant-a", "tenant-b") as (a, b):
        a.watch_interval = b.watch_interval = 0.05
        b_ids = await _fill_b(b)
        await a.create_session(SessionRecord(id="shared"))  # the same id: another session
        await a.append_entries("shared", [_entry("A shared")])

        assert [r.id for r in (await a.list_sessions()).sessions] == ["shared"]
        assert [e.message.text for e in await a.load_entries("shared")  # type: ignore[attr-defined]
                ] == ["A shared"]
        for call in (a.load_entries("b-only"), a.load_session("b-only"),
                     a.append_entries("b-only", [_entry("A into B")]),
                     a.append_entries("b-only", [_entry(f"A into B {n}") for n in range(10)]),
                     a.append_linear("b-only", [_entry("A linear into B")]),
                     a.delete_session("b-only"), a.load_entries_after("b-only", None)):
            with pytest.raises(SessionNotFound):
                await call
        with pytest.raises(SessionNotFound):
            await anext(aiter(a.watch("b-only")))
        # B's entry ids name nothing in A's session of the same id.
        with pytest.raises(EntryNotFound):
            await a.load_entries_after("shared", b_ids["shared"][0])
        with pytest.raises(StoreError):
            await anext(aiter(a.watch("shared", after=b_ids["shared"][0])))
        # A's own id repeated in B's session is no retry of anything of A's.
        await a.append_entries("shared", [MessageEntry(id=b_ids["shared"][0],
                                                       message=UserMessage.of("A again"))])

        # Watching A's "shared" while both tenants append to their "shared":
        # only A's entries come, every one of them.
        seen: list[str] = []

        async def follow() -> None:
            async for e in a.watch("shared"):
                seen.append(e.message.text)  # type: ignore[attr-defined]
                if len(seen) == 5:
                    return

        task = asyncio.create_task(follow())
        for n in range(3):
            await b.append_entries("shared", [_entry(f"B late {n}")])
            await a.append_entries("shared", [_entry(f"A late {n}")])
        await asyncio.wait_for(task, 30)
        assert seen == ["A shared", "A again", "A late 0", "A late 1", "A late 2"]

        # B saw none of it, and lost nothing.
        assert [r.id for r in (await b.list_sessions()).sessions] == ["shared", "b-only"]
        for sid, ids in b_ids.items():
            got = [e.id for e in await b.load_entries(sid)]
            assert got[:len(ids)] == ids
            assert all(e.message.text.startswith("B ")  # type: ignore[attr-defined]
                       for e in await b.load_entries(sid))
        await a.delete_session("shared")
        assert len(await b.load_entries("shared")) == len(b_ids["shared"]) + 3


_SSL_REQUEST, _GSSENC_REQUEST = (80877103).to_bytes(4), (80877104).to_bytes(4)


class _FrontendRecorder:
    """A TCP relay to PostgreSQL that records each client's message types, in order.

    Only the client's side is parsed (the startup packet, then a type byte
    and a length per message); the bytes go through unchanged. It runs its
    own event loop on a thread, so a client that blocks the test's loop
    while it connects is still answered.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.streams: list[list[str]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.relays: set[asyncio.Task[None]] = set()

    def start(self) -> int:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result(10)
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        server = self.server
        assert server is not None

        async def shut() -> None:
            server.close()
            for w in self.writers:
                w.close()
            await asyncio.gather(*self.relays, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]
        this = asyncio.current_task()
        assert this is not None
        self.relays.add(this)
        types: list[str] = []
        self.streams.append(types)

        async def down() -> None:
            with contextlib.suppress(ConnectionError):
                while chunk := await up_reader.read(65536):
                    writer.write(chunk)
                    await writer.drain()
            writer.close()

        relay = asyncio.create_task(down())
        try:
            while True:  # the startup packet has no type byte
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head) - 4)
                if body[:4] not in (_SSL_REQUEST, _GSSENC_REQUEST):
                    break
                writer.write(b"N")  # no encryption, so the messages stay readable
            up_writer.write(head + body)
            while True:
                kind = await reader.readexactly(1)
                size = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(size) - 4)
                types.append(kind.decode())
                up_writer.write(kind + size + body)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            up_writer.close()
            await relay


async def test_s73_a_tenants_calls_send_nothing_after_their_sync(
    rls_url: str, pg_schema: str
) -> None:
    """PgBouncer in transaction pooling gives the server connection back at the
    ReadyForQuery that answers a Sync: a message after it (such as psycopg's
    Flush on leaving pipeline mode) takes a server connection that nothing then
    returns, and the other clients wait for it. Every call of a tenant's store,
    recorded on the wire: no Flush after a Sync, and each call's last message is
    a Sync or a simple Query."""
    parts = urlsplit(rls_url)
    relay = _FrontendRecorder(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = relay.start()
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
    direct = urlunsplit(parts._replace(netloc=netloc))
    try:
        await test_s72_a_tenant_lists_loads_appends_watches_nothing_of_another(
            (direct, rls_url), pg_schema)
    finally:
        relay.close()
    streams = [t for t in relay.streams if t]
    assert sum(len(t) for t in streams) > 100  # the relay saw the calls
    for types in streams:
        flushed = [n for n in range(1, len(types)) if types[n] == "H" and types[n - 1] == "S"]
        assert not flushed, f"a Flush after a Sync at {flushed} in {''.join(types)}"
        calls = [t for t in types if t != "X"]  # X: the client's Terminate
        assert not calls or calls[-1] in "SQ", "".join(types)


async def test_s72_a_tenants_blobs_are_its_own(rls_url: str, pg_schema: str) -> None:
    async with _stores(rls_url, rls_url, pg_schema, "tenant-a", "tenant-b") as (a, b):
        await b.create_session(SessionRecord(id="s"))
        part = await attach(b, "s", b"B's picture", media_type="image/png")
        await b.append_entries("s", [MessageEntry(message=UserMessage(content=(part,)))])
        assert await a.has_blobs([part.sha256]) == set()
        assert await a.list_blobs() == []
        with pytest.raises(BlobNotFound):
            await a.get_blob(part.sha256)
        # A's collection, with no grace, sees none of B's blobs and so deletes none.
        await a.create_session(SessionRecord(id="s"))
        await collect_garbage(a, grace=timedelta(0))
        assert await b.get_blob(part.sha256) == b"B's picture"
        # The same bytes attached by A are A's own copy: deleting it leaves B's.
        mine = await attach(a, "s", b"B's picture", media_type="image/png")
        later = datetime.now(UTC) + timedelta(days=1)
        assert await a.delete_blobs([mine.sha256], older_than=later) == [mine.sha256]
        assert await b.get_blob(part.sha256) == b"B's picture"
        assert [i.key for i in await b.list_blobs()] == [part.sha256]


async def test_s72_raw_sql_on_the_stores_connection_reaches_no_other_tenant(
    route: tuple[str, str], pg_schema: str
) -> None:
    url, listen = route
    s = sql.Identifier(pg_schema)
    async with _stores(url, listen, pg_schema, "tenant-a", "tenant-b") as (a, b):
        b_ids = await _fill_b(b)
        before = {sid: [e.id for e in await b.load_entries(sid)] for sid in b_ids}
        await a.create_session(SessionRecord(id="a-own"))
        await a.append_entries("a-own", [_entry("A")])
        async with a.pool.connection() as conn:
            # What the store's transactions set is gone once each ends.
            row = await (await conn.execute(
                "SELECT coalesce(current_setting('threadline.tenant', true), '')")).fetchone()
            assert row == ("",)
            for tenant in (None, "tenant-a"):  # as left by the store, and as the store sets it
                async with conn.transaction():
                    if tenant is not None:
                        await conn.execute("SELECT set_config('threadline.tenant', %s, true)",
                                           (tenant,))
                    for query in ("SELECT count(*) FROM {s}.sessions WHERE session_id = 'b-only'",
                                  "SELECT count(*) FROM {s}.entries WHERE tenant = 'tenant-b'",
                                  "SELECT count(*) FROM {s}.entries WHERE session_id = 'b-only'"):
                        cur = await conn.execute(sql.SQL(query).format(s=s))
                        assert await cur.fetchone() == (0,), query
                    for query in ("UPDATE {s}.sessions SET next_seq = 0 "
                                  "WHERE session_id IN ('b-only', 'shared')",
                                  "UPDATE {s}.entries SET data = 'x' WHERE session_id = 'b-only'",
                                  "DELETE FROM {s}.entries WHERE tenant = 'tenant-b'",
                                  "DELETE FROM {s}.sessions WHERE session_id = 'shared'"):
                        cur = await conn.execute(sql.SQL(query).format(s=s))
                        assert cur.rowcount == 0, query
            # Rows written as tenant B, or moved to it, are refused.
            for tenant, query in (
                ("tenant-a", "INSERT INTO {s}.sessions (tenant, session_id, created_at, "
                             "last_activity) VALUES ('tenant-b', 'planted', now(), 0)"),
                ("tenant-a", "INSERT INTO {s}.entries (tenant, session_id, seq, kind, entry_id, "
                             "data) VALUES ('tenant-b', 'b-only', 99, 0, '\\x00ff', 'x')"),
                ("tenant-a", "UPDATE {s}.sessions SET tenant = 'tenant-b'"),
                (None, "INSERT INTO {s}.sessions (tenant, session_id, created_at, "
                       "last_activity) VALUES ('tenant-b', 'planted', now(), 0)"),
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege,
                                   match="row-level security"):
                    async with conn.transaction():
                        if tenant is not None:
                            await conn.execute("SELECT set_config('threadline.tenant', %s, "
                                               "true)", (tenant,))
                        await conn.execute(sql.SQL(query).format(s=s))
            # Without tenant (default) the row is A's own: B's session of that id is untouched.
            async with conn.transaction():
                await conn.execute("SELECT set_config('threadline.tenant', 'tenant-a', true)")
                await conn.execute(sql.SQL(
                    "INSERT INTO {s}.sessions (session_id, created_at, last_activity) "
                    "VALUES ('b-only', now(), 0)").format(s=s))
        assert {sid: [e.id for e in await b.load_entries(sid)] for sid in b_ids} == before
        assert sorted(r.id for r in (await a.list_sessions()).sessions) == ["a-own", "b-only"]
        assert list(await a.load_entries("b-only")) == []


async def test_s72_stores_of_two_tenants_take_turns_on_one_server_connection(
    bouncer: PgBouncer, rls_url: str, pg_schema: str
) -> None:
    """Through PgBouncer with one server connection, the tenants' transactions
    alternate on it: each sees only its own rows, and nothing set for one
    outlives its transaction into the other's."""
    async with _stores(bouncer.url, rls_url, pg_schema, "t1", "t2", _HOSTILE) as stores:

        async def work(n: int, store: PostgresStore) -> None:
            for k in range(15):
                sid = f"s{k % 3}"
                with contextlib.suppress(StoreError):
                    await store.create_session(SessionRecord(id=sid))
                await store.append_entries(sid, [_entry(f"{n}:{k}:{j}")
                                                 for j in range(1 + k % 10)])
                page = await store.list_sessions()
                assert {r.id for r in page.sessions} <= {"s0", "s1", "s2"}
                for e in await store.load_entries(sid):
                    assert e.message.text.startswith(f"{n}:")  # type: ignore[attr-defined]

        await asyncio.gather(*(work(n, s) for n, s in enumerate(stores)))
        counts = [sum([len(await s.load_entries(f"s{k}")) for k in range(3)]) for s in stores]
        assert counts == [sum(1 + k % 10 for k in range(15))] * 3
    async with await psycopg.AsyncConnection.connect(bouncer.url, autocommit=True) as raw:
        cur = await raw.execute(sql.SQL("SELECT count(*) FROM {}.entries").format(
            sql.Identifier(pg_schema)))
        assert await cur.fetchone() == (0,)  # no tenant set: none of theirs


async def test_s73_a_role_that_bypasses_rls_is_refused_unless_trusted(
    pg_url: str, pg_schema: str
) -> None:
    await _open(pg_url, pg_schema)
    with pytest.raises(ConfigError, match="role 'postgres' is a superuser") as caught:
        async with PostgresStore(pg_url, schema=pg_schema, tenant="t"):
            pass
    assert "trusted=True" in str(caught.value)
    with pytest.raises(ConfigError) as hostile:  # the tenant named, but never raw
        async with PostgresStore(pg_url, schema=pg_schema, tenant=_HOSTILE):
            pass
    assert "\u202e" not in str(hostile.value) and "\\u202e" in str(hostile.value)
    bypass = _make_role(pg_url, pg_schema, bypass=True)
    try:
        with pytest.raises(ConfigError, match=f"role '{bypass}' is BYPASSRLS"):
            async with PostgresStore(_as(pg_url, bypass), schema=pg_schema, tenant="t") as st:
                await st.list_sessions()
        # Trusted: it works, and its statements still name its tenant.
        async with PostgresStore(pg_url, schema=pg_schema, tenant="t", trusted=True) as t, \
                PostgresStore(pg_url, schema=pg_schema, tenant="u", trusted=True) as u:
            await t.create_session(SessionRecord(id="x"))
            await t.append_entries("x", [_entry("t")])
            assert (await u.list_sessions()).sessions == []
            with pytest.raises(SessionNotFound):
                await u.load_entries("x")
        async with PostgresStore(pg_url, schema=pg_schema) as default:  # the default tenant
            assert (await default.list_sessions()).sessions == []
    finally:
        _drop_role(pg_url, bypass)


@pytest.mark.parametrize("bad", ["", "a\x00b", "a\nb", "x" * 201, 5])
def test_s72_a_bad_tenant_name_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="tenant"):
        PostgresStore("postgresql://x@127.0.0.1/test", tenant=bad)


def test_s72_watchers_of_each_tenant_have_their_own_channel() -> None:
    channels = {PostgresStore("postgresql://x@127.0.0.1/test", schema="s",
                              tenant=t)._notifier.channel for t in (None, "a", "b")}
    assert len(channels) == 3


async def test_s73_every_table_with_a_session_id_gets_the_tenant_and_forced_rls(
    pg_url: str, pg_schema: str
) -> None:
    """Migration 8 is generic: tables that migrations before it made (here two
    stand-ins for 5-7, one referring to the other) get the column, their keys,
    foreign keys and btree indexes with tenant first, and the policy."""
    s = sql.Identifier(pg_schema)
    # The schema as version 4 left it, then tables as 5-7 might make them.
    from threadline.stores.postgres import _schema

    saved = _schema.MIGRATIONS
    _schema.MIGRATIONS = tuple(m for m in saved if m[0] <= 4)
    try:
        await _open(pg_url, pg_schema)
    finally:
        _schema.MIGRATIONS = saved
    _sql(pg_url,
         sql.SQL("CREATE TABLE {s}.meta (session_id text NOT NULL, k text NOT NULL, v text, "
                 "PRIMARY KEY (session_id, k), UNIQUE (k, v))").format(s=s),
         sql.SQL("CREATE TABLE {s}.notes (id bigint PRIMARY KEY, session_id text NOT NULL, "
                 "k text NOT NULL, FOREIGN KEY (session_id, k) REFERENCES {s}.meta "
                 "(session_id, k) ON DELETE CASCADE)").format(s=s),
         sql.SQL("CREATE INDEX notes_k ON {s}.notes (k)").format(s=s),
         sql.SQL("INSERT INTO {s}.meta VALUES ('old', 'a', '1')").format(s=s),
         sql.SQL("INSERT INTO {s}.schema_migrations VALUES (5), (6), (7)").format(s=s))
    await _open(pg_url, pg_schema)
    await _open(pg_url, pg_schema)  # again: nothing more to do
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
            "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) FROM pg_class c "
            "WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r' ORDER BY 1",
            (pg_schema,)).fetchall()
        assert rows == [("entries", True, True, 1), ("meta", True, True, 1),
                        ("notes", True, True, 1), ("schema_migrations", False, False, 0),
                        ("sessions", True, True, 1)]
        defs = sorted(r[0] for r in conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid IN "
            "(%s::regclass, %s::regclass)", (f"{pg_schema}.meta", f"{pg_schema}.notes")))
        assert defs == sorted([
            "PRIMARY KEY (tenant, session_id, k)", "UNIQUE (tenant, k, v)",
            "PRIMARY KEY (tenant, id)",
            f"FOREIGN KEY (tenant, session_id, k) REFERENCES {pg_schema}.meta(tenant, "
            f"session_id, k) ON DELETE CASCADE"])
        index = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
                             "AND indexname = 'notes_k'", (pg_schema,)).fetchone()
        assert index is not None and "(tenant, k)" in index[0]
        # Old rows belong to the default tenant; a default INSERT takes the transaction's.
        assert conn.execute(sql.SQL("SELECT tenant FROM {}.meta").format(s)).fetchall() == [
            ("",)]
    role = _make_role(pg_url, pg_schema)
    try:
        with psycopg.connect(_as(pg_url, role)) as conn:
            conn.execute("SELECT set_config('threadline.tenant', 'acme', true)")
            conn.execute(sql.SQL("INSERT INTO {}.meta (session_id, k) VALUES ('n', 'b')")
                         .format(s))
            assert conn.execute(sql.SQL("SELECT tenant, session_id FROM {}.meta").format(s)
                                ).fetchall() == [("acme", "n")]
            conn.commit()
            assert conn.execute(sql.SQL("SELECT session_id FROM {}.meta").format(s)
                                ).fetchall() == [("old",)]
    finally:
        _drop_role(pg_url, role)


class TestTenantPostgresStore(StoreConformance):
    """The whole store contract, as one tenant, on a role that RLS applies to."""

    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    @pytest.fixture(autouse=True)
    def _url(self, rls_url: str, pg_schema: str) -> Iterator[None]:
        self.url, self.pg_schema = rls_url, pg_schema
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        return PostgresStore(self.url, schema=self.pg_schema, tenant=_HOSTILE, max_size=4)

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        return functools.partial(PostgresStore, self.url, schema=self.pg_schema,
                                 tenant=_HOSTILE, max_size=2)


async def test_s73_without_pipeline_mode_each_call_sets_its_tenant_in_a_transaction(
    rls_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libpq before 14 has no pipeline mode: the tenant is then set in a
    transaction around each statement, and nothing else changes."""
    from threadline.stores.postgres import _store

    monkeypatch.setattr(_store, "_PIPELINES", False)
    await test_s72_a_tenant_lists_loads_appends_watches_nothing_of_another(
        (rls_url, rls_url), pg_schema)
