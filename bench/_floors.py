"""The floors: the least the work a store or an agent does could cost, done bare.

Each is measured in the same run, on the same disk or server, as what it is
set against:

- ``FsyncFile``: ``os.write`` + ``os.fdatasync`` of the same bytes, on the
  calling thread (what any durable per-message log pays at least), and
  ``ThreadedFsync``, the same handed to a worker thread and awaited (the
  least an append that keeps the sync off the event loop pays);
- ``fsync_serial``: lines written one write + fdatasync each, one after another;
- ``SQLiteInsert``: BEGIN IMMEDIATE + one INSERT + COMMIT of the entry's line,
  with the store's journal mode and the same ``synchronous`` setting;
- ``PostgresInsert``: one INSERT in autocommit on a psycopg connection (one
  round trip, one WAL flush), blocking or on an ``AsyncConnection``;
- ``bare_loop``: the agent loop alone, nothing stored;
- ``scan``: ``os.scandir`` of a folder plus one read of each file's first line
  (the least a listing of a file store can do);
- ``read_decode``: read a session file and parse every line after the first
  with msgspec, untyped (the least a reader of the file must do).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from bench._targets import AgentLoop, Message


class FsyncFile:
    """Appends to one file, each ``write`` followed by ``fdatasync``."""

    def __init__(self, path: Path, *, like: Path | None = None) -> None:
        if like is not None:  # the same size as the file it is set against
            path.write_bytes(like.read_bytes())
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.fsync(self.fd)

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class ThreadedFsync(FsyncFile):
    """``FsyncFile``'s write on a worker thread, awaited from the event loop."""

    def __init__(self, path: Path, *, like: Path | None = None) -> None:
        super().__init__(path, like=like)
        self.pool = ThreadPoolExecutor(1)

    async def write_off_loop(self, data: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self.write, data)

    def close(self) -> None:
        self.pool.shutdown()
        super().close()


def fsync_serial(path: Path, lines: Sequence[bytes]) -> float:
    """Seconds to write ``lines`` one write + fdatasync each, in a new file."""
    floor = FsyncFile(path)
    try:
        t0 = time.perf_counter()
        for line in lines:
            floor.write(line)
        return time.perf_counter() - t0
    finally:
        floor.close()


_SQLITE_TABLE = (
    "CREATE TABLE IF NOT EXISTS floor (seq INTEGER PRIMARY KEY, session INTEGER NOT NULL, "
    "id BLOB NOT NULL, parent BLOB, ts INTEGER, data BLOB NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS floor_id ON floor (session, id)",
)


class SQLiteInsert:
    """One row per call, committed: in a table of its own in the store's database.

    The row holds the entry's encoded line (the store's own row is no
    bigger), a 16-byte id, its parent and a timestamp; the write lock is
    waited for in short slices and retried, as a store waits, so under
    several processes the floor does not lose every race for it.
    """

    def __init__(self, path: Path | str, *, synchronous: str = "FULL", session: int = 0) -> None:
        self.conn = sqlite3.connect(path, timeout=0.005, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self._retry(lambda: [self.conn.execute(q) for q in _SQLITE_TABLE])
        self.session = session
        self.n = 0

    def _retry(self, fn: Any) -> None:
        while True:
            try:
                fn()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise

    def insert(self, line: bytes) -> None:
        self.n += 1
        key = self.n.to_bytes(16, "big")
        self._retry(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        self.conn.execute("INSERT INTO floor (session, id, parent, ts, data) "
                          "VALUES (?, ?, ?, ?, ?)",
                          (self.session, key, key, time.time_ns() // 1000, line))
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def postgres_floor_table(url: str, schema: str) -> None:
    """A table built like a store's entries (same kinds of columns, keys, indexes)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.floor (seq bigint NOT NULL, "
                     f"ts bigint, session_id text COLLATE \"C\" NOT NULL, entry_id bytea NOT NULL, "
                     f"parent_id bytea, data bytea NOT NULL, PRIMARY KEY (session_id, seq), "
                     f"UNIQUE (session_id, entry_id))")


class PostgresInsert:
    """One INSERT of the entry's line per call, in autocommit, blocking or async."""

    def __init__(self, conn: Any, schema: str, session: str) -> None:
        self.conn, self.session, self.n = conn, session, 0
        self.query = (f"INSERT INTO {schema}.floor (seq, ts, session_id, entry_id, parent_id, "
                      f"data) VALUES (%s, %s, %s, %s, %s, %s)")

    @classmethod
    def connect(cls, url: str, schema: str, session: str, **kw: Any) -> PostgresInsert:
        import psycopg

        return cls(psycopg.connect(url, autocommit=True, **kw), schema, session)

    @classmethod
    async def connect_async(cls, url: str, schema: str, session: str,
                            **kw: Any) -> PostgresInsert:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, **kw)
        return cls(conn, schema, session)

    def _params(self, line: bytes) -> tuple[Any, ...]:
        self.n += 1
        key = self.n.to_bytes(16, "big")
        return (self.n, time.time_ns() // 1000, self.session, key, key, line)

    def insert(self, line: bytes) -> None:
        self.conn.execute(self.query, self._params(line))

    async def insert_async(self, line: bytes) -> None:
        await self.conn.execute(self.query, self._params(line))

    def close(self) -> Any:
        return self.conn.close()


async def bare_loop(loop: AgentLoop, input: Sequence[Message]) -> int:
    """Run the agent loop to its end, nothing stored; the events it gave."""
    events = 0
    run: AsyncIterator[Any] = loop.run([], list(input))
    async for _ in run:
        events += 1
    return events


def scan(root: Path, suffix: str = ".jsonl") -> int:
    """Files under ``root`` whose first line could be read: scandir + one pread each."""
    found = 0
    with os.scandir(root) as it:
        for item in it:
            if item.name.endswith(suffix):
                fd = os.open(item.path, os.O_RDONLY)
                try:
                    found += os.pread(fd, 4096, 0).find(b"\n") > 0
                finally:
                    os.close(fd)
    return found


_untyped = msgspec.json.Decoder()


def read_decode(path: Path) -> int:
    """Read a session file and parse each line after its first; the lines parsed."""
    with open(path, "rb") as f:
        data = f.read()
    return len(_untyped.decode_lines(memoryview(data)[data.index(b"\n") + 1:]))


def decode_each(lines: Sequence[bytes]) -> int:
    """Parse each line on its own, untyped."""
    decode = _untyped.decode
    for line in lines:
        decode(line)
    return len(lines)
