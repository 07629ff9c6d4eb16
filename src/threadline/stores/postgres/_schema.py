"""The PostgreSQL store's tables and their migrations.

``MIGRATIONS`` is append-only: a released version is never edited, a change
is a new version. ``migrate`` brings a schema to the latest version under an
advisory lock per schema, so processes opening one schema at once apply each
version once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from threadline.errors import CorruptLog, StoreError
from threadline.session._codec import decode_entry
from threadline.stores._rows import compact, id_key
from threadline.stores.postgres._catalog import MIGRATION as CATALOG
from threadline.stores.postgres._search import MIGRATION as SEARCH

__all__ = ["MIGRATIONS", "TENANT", "migrate", "tenant_tables"]

Conn = psycopg.AsyncConnection[Any]


async def _compact_rows(conn: Conn, s: sql.Identifier) -> None:
    """Version 4: version 3's entries moved into compact rows (``stores/_rows.py``).

    It also drops version 3's NOTIFY trigger: a transaction that notifies
    holds PostgreSQL's one notify lock through its commit, WAL flush
    included, so appends to different sessions could no longer share a
    flush. The store notifies after the
    commit instead (``Notifier.notify`` in ``_watch.py``).

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

TENANT = "coalesce(current_setting('threadline.tenant', true), '')"
"""The tenant a statement runs for: the transaction's ``threadline.tenant``, or
the default tenant ``''`` when it is not set (also after a transaction that set
it locally has ended, when PostgreSQL reads it as ``''``)."""

_POLICY = "threadline_tenant"


async def tenant_tables(conn: Conn, s: sql.Identifier) -> None:
    """Version 8: a tenant before ``session_id`` in every key, enforced by forced RLS.

    Generic over the schema, so it covers every table an earlier migration
    made: each table but ``schema_migrations`` (sessions and what hangs off
    them, and the blobs, which a tenant shares with no other) gets a
    ``tenant`` column whose default is
    ``TENANT``, so INSERTs that do not name it store the transaction's
    tenant. Its primary key, unique constraints and btree indexes are rebuilt
    with ``tenant`` first (foreign keys between such tables with it on both
    sides), so rows of one session still share one key prefix and a table
    distributed by ``tenant`` or ``session_id`` keeps a session on one shard.
    Then row-level security, forced so that the tables' owner obeys it too,
    with one policy whose ``USING`` and ``WITH CHECK`` compare the row's
    tenant with ``TENANT``.

    Idempotent: a table, key or index that already starts with ``tenant`` is
    left as it is, so a later migration that adds tables can run it again.
    """
    cur = await conn.execute("SELECT %s::regnamespace::oid", (s.as_string(conn),))
    row = await cur.fetchone()
    assert row is not None
    nsp = row[0]
    cur = await conn.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = %s "
        "AND c.relkind IN ('r', 'p') AND c.relname <> 'schema_migrations' "
        "ORDER BY c.relname", (nsp,))
    tables = {oid: name for oid, name in await cur.fetchall()}
    if not tables:
        return
    oids = list(tables)
    for name in tables.values():
        await conn.execute(sql.SQL(
            "ALTER TABLE {}.{} ADD COLUMN IF NOT EXISTS tenant text COLLATE \"C\" NOT NULL "
            "DEFAULT " + TENANT).format(s, sql.Identifier(name)))
    # Constraints whose first column is not yet tenant: foreign keys first
    # (they depend on the keys they reference), then keys and unique ones.
    cur = await conn.execute(
        "SELECT conrelid, conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = ANY(%s) AND contype IN ('p', 'u', 'f') "
        "AND (SELECT attname FROM pg_attribute WHERE attrelid = conrelid "
        "AND attnum = conkey[1]) <> 'tenant' ORDER BY contype = 'f' DESC, conname",
        (oids,))
    constraints = await cur.fetchall()
    cur = await conn.execute(
        "SELECT i.indrelid, c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam "
        "WHERE i.indrelid = ANY(%s) AND am.amname = 'btree' AND NOT EXISTS "
        "(SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) "
        "AND (i.indkey[0] = 0 OR (SELECT attname FROM pg_attribute WHERE attrelid = i.indrelid "
        "AND attnum = i.indkey[0]) <> 'tenant') ORDER BY c.relname", (oids,))
    indexes = await cur.fetchall()
    for rel, name, _, _ in constraints:
        await conn.execute(sql.SQL("ALTER TABLE {}.{} DROP CONSTRAINT {}").format(
            s, sql.Identifier(tables[rel]), sql.Identifier(name)))
    for _, name, _ in indexes:
        await conn.execute(sql.SQL("DROP INDEX {}.{}").format(s, sql.Identifier(name)))
    for rel, name, kind, old in sorted(constraints, key=lambda c: c[2] == "f"):
        if kind == "f":
            new = re.sub(r" REFERENCES ([^(]+)\(", r" REFERENCES \1(tenant, ",
                         re.sub(r"^FOREIGN KEY \(", "FOREIGN KEY (tenant, ", old), count=1)
        else:
            new = re.sub(r"^(PRIMARY KEY|UNIQUE(?: NULLS NOT DISTINCT)?) \(",
                         r"\1 (tenant, ", old)
        await conn.execute(sql.SQL("ALTER TABLE {}.{} ADD CONSTRAINT {} ").format(
            s, sql.Identifier(tables[rel]), sql.Identifier(name)) + sql.SQL(new))
    for _, _, definition in indexes:
        await conn.execute(sql.SQL(re.sub(r" USING btree \(", " USING btree (tenant, ",
                                          definition, count=1)))
    for name in tables.values():
        table = sql.SQL("{}.{}").format(s, sql.Identifier(name))
        await conn.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table))
        await conn.execute(sql.SQL("ALTER TABLE {} FORCE ROW LEVEL SECURITY").format(table))
        await conn.execute(sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(
            sql.Identifier(_POLICY), table))
        await conn.execute(sql.SQL(
            "CREATE POLICY {} ON {} USING (tenant = " + TENANT + ") WITH CHECK (tenant = "
            + TENANT + ")").format(sql.Identifier(_POLICY), table))


# ``{s}`` is the schema. COLLATE "C" orders ids by code point, as the other
# stores do, whatever the database's locale.
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
    (5, CATALOG),  # stores/postgres/_catalog.py: metadata and last activity (S62)
    (6, SEARCH),  # stores/postgres/_search.py: the full-text index (S64)
    (
        7,
        # Blobs beside the log (S57). bytea rather than large objects: a blob
        # is one row, written and deleted in the statement that names it, so
        # it is in every dump and replica, and no orphaned object can outlive it.
        """
        CREATE TABLE {s}.blobs (
            key text COLLATE "C" PRIMARY KEY,
            size bigint NOT NULL,
            touched_at timestamptz NOT NULL,
            data bytea NOT NULL
        );
        ALTER TABLE {s}.blobs ALTER COLUMN data SET STORAGE EXTERNAL;
        """,
    ),
    # After every table it covers; a later migration that adds a table runs it again.
    (8, tenant_tables),
)


# Fails with UndefinedTable until the first migration has run.
_VERSION = "SELECT coalesce(max(version), 0), to_regclass(%s) FROM {}.schema_migrations"


async def migrate(conn: Conn, schema: str, where: str, *, create: bool) -> None:
    """Bring ``schema`` to the latest version, or with ``create=False`` refuse a missing one."""
    ident = sql.Identifier(schema)
    # The common open finds the schema current in one read, without the lock
    # or DDL (a cold open's round trips are most of its cost). A schema not
    # there yet fails that read, which only means "migrate"; anything but a
    # current schema is decided again below, under the lock.
    try:
        if conn.autocommit:
            row = await _stored_version(conn, schema)
        else:  # a savepoint, so the failed read leaves the caller's transaction usable
            async with conn.transaction():
                row = await _stored_version(conn, schema)
    except psycopg.errors.UndefinedTable as exc:
        if not create:
            raise _no_store(where) from exc
    else:
        if not create and row[1] is None:
            raise _no_store(where)
        if row[0] >= MIGRATIONS[-1][0]:
            return
    # A lock id per schema: processes migrating other schemas do not wait.
    key = int.from_bytes(
        hashlib.blake2b(f"threadline:{schema}".encode(), digest_size=8).digest(),
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


async def _stored_version(conn: Conn, schema: str) -> tuple[int, str | None]:
    """The schema's migration version, and whether its ``sessions`` table exists."""
    query = sql.SQL(_VERSION).format(sql.Identifier(schema))
    cur = await conn.execute(query, (sql.Identifier(schema, "sessions").as_string(None),))
    row = await cur.fetchone()
    assert row is not None  # an aggregate gives one row
    return int(row[0]), row[1]


def _no_store(where: str) -> StoreError:
    return StoreError(f"no threadline store in {where}: the schema or its tables do not exist")


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
