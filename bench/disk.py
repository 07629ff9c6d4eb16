"""Bytes on disk: what each store keeps for a conversation, over the raw payload.

The peers' workload (user and assistant in turn, each one text of 400
characters of base64 of random bytes, so compression flatters nobody),
appended one message per call, at N=800 and N=3,200 messages. The file
store's folder; SQLite's database after a WAL checkpoint; PostgreSQL's
tables, TOAST and indexes in the store's schema after VACUUM. Also the bytes
each further message adds between the two sizes (fixed pages cancel).
Goals at N=800: file 1.3x, SQL stores 1.5x the payload.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from bench._harness import Run, at_most
from bench._targets import FileStore, PostgresStore, SessionRecord, SQLiteStore
from bench._workloads import payload, payload_bytes

NEEDS = ()
MINUTES = 1


def sqlite_bytes(path: Path) -> int:
    """A SQLite database's size once its WAL is folded into the main file."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def schema_bytes(url: str, schema: str) -> int:
    """Heap + TOAST + indexes of every table in ``schema``, after VACUUM."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))]
        for t in tables:
            conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(schema, t)))
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def stored(kind: str, run: Run, n: int) -> int:
    entries = payload(n)
    where = run.tmp / f"{kind}-{n}"
    schema = f"tl_bench_disk_{secrets.token_hex(4)}"
    store: Any
    if kind == "file":
        store = FileStore(where)
    elif kind == "sqlite":
        where.mkdir()
        store = SQLiteStore(where / "s.db")
    else:
        store = PostgresStore(run.pg_url, schema=schema, min_size=1, max_size=1)
    await store.create_session(SessionRecord(id="bench"))
    for entry in entries:
        await store.append_entries("bench", [entry])
    await store.close()
    if kind == "file":
        return sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    if kind == "sqlite":
        return sqlite_bytes(where / "s.db")
    try:
        return schema_bytes(run.pg_url, schema)
    finally:
        drop_schema(run.pg_url, schema)


def main(run: Run) -> None:
    small, big = run.pick((800, 3_200), (50, 100))
    kinds = ["file", "sqlite"] + (["postgres"] if run.postgres() else [])
    names = {"file": "file store", "sqlite": "SQLite store", "postgres": "PostgreSQL store"}
    goals = {"file": 1.3, "sqlite": 1.5, "postgres": 1.5}
    p_small, p_big = payload_bytes(payload(small)), payload_bytes(payload(big))
    for kind in kinds:
        a = asyncio.run(stored(kind, run, small))
        b = asyncio.run(stored(kind, run, big))
        run.row(f"{names[kind]}: bytes on disk for {small:,} messages", a / 1e3, "kB",
                versus="the raw payload (the texts' UTF-8 bytes)", versus_value=p_small / 1e3,
                goal=at_most(goals[kind]))
        run.row(f"{names[kind]}: bytes each further message adds ({small:,} to {big:,})",
                (b - a) / (big - small), "B", versus="its payload",
                versus_value=(p_big - p_small) / (big - small))
