"""The four built-in stores, described so another thread or process can open them too.

A ``StoreSpec`` is plain data (kind and location); ``spec.open()`` builds a
fresh store object for it, so each thread, event loop or child process under
test gets its own connection to the same sessions.

Also: the file store's conformance hooks (``FileHooks``), a store with only
the protocol's three methods (``BareStore``), a child's marker before each big
write (``say_before_big_writes``), and ``until``, which waits for a state.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from threadline.session import Entry, SessionRecord
from threadline.stores import FileStore, MemoryStore, Store
from threadline.testing import StoreConformance


@dataclass(frozen=True)
class StoreSpec:
    kind: str
    location: str = ""
    schema: str = ""

    def open(self) -> Store:
        if self.kind == "memory":
            return _MEMORY.setdefault(self.location, MemoryStore())
        if self.kind == "file":
            return FileStore(self.location)
        if self.kind == "sqlite":
            from threadline.stores import SQLiteStore

            return SQLiteStore(self.location)
        from threadline.stores import PostgresStore

        return PostgresStore(self.location, schema=self.schema, min_size=0, max_size=2)

    def as_argv(self) -> list[str]:
        return [self.kind, self.location, self.schema]


# One memory store per location: "another connection" to memory is the same object.
_MEMORY: dict[str, MemoryStore] = {}


def make_spec(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreSpec:
    if kind == "memory":
        return StoreSpec("memory", str(tmp_path))
    if kind == "file":
        return StoreSpec("file", str(tmp_path / "sessions"))
    if kind == "sqlite":
        return StoreSpec("sqlite", str(tmp_path / "sessions.db"))
    url = request.getfixturevalue("pg_url")
    return StoreSpec("postgres", url, request.getfixturevalue("pg_schema"))


async def close(store: Store) -> None:
    closer = getattr(store, "close", None)
    if closer is not None:
        await closer()


def run_threads(target: Callable[[int], None], n: int) -> None:
    threads = [threading.Thread(target=target, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"


def race(spec: StoreSpec, body: Callable[[Store, int], Awaitable[None]], *,
         threads: int, children: list[list[str]]) -> None:
    """Run ``body(store, t)`` in ``threads`` threads, each with its own event loop
    and store object, while the ``children`` command lines run; all must succeed."""
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for argv in children]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        async def main() -> None:
            store = spec.open()
            await body(store, t)
            if spec.kind != "memory":
                await close(store)
        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    run_threads(worker, threads)
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert not errors, errors


def assert_one_order(texts: list[str], writers: list[str], per_writer: int) -> None:
    """Every writer's ``<writer>-<n>`` is there once, each writer's in its own order."""
    assert sorted(texts) == sorted(f"{w}-{n}" for w in writers for n in range(per_writer))
    for w in writers:
        assert [t for t in texts if t.startswith(w + "-")] == [
            f"{w}-{n}" for n in range(per_writer)]


def import_every_store() -> None:
    """Import each store's module and driver now, as a fork server should before forking.

    The SQL stores import their drivers on first use, so a child forked from a
    server that had not imported them pays for it again every time: psycopg
    took 60-80 ms of each forked child's run here, most of a PostgreSQL kill
    loop's time. Imports only: the server must stay free of threads and
    connections to fork safely.
    """
    import psycopg._tz  # noqa: F401  (zoneinfo, which a connection loads)

    import threadline.stores.postgres._store
    import threadline.stores.sqlite._store  # noqa: F401


def files_of(store: object) -> FileStore:
    """The FileStore itself, or the one a test wrapper (``.inner``) delegates to."""
    files = getattr(store, "inner", store)
    assert isinstance(files, FileStore)
    return files


class FileHooks(StoreConformance):
    """The conformance hooks that reach into session files."""

    capabilities = frozenset({"catalog", "linear", "watch", "search", "multi_process"})

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        append_raw(files_of(store).path_for(session_id), data + b"\n")

    async def write_format_version(self, store: Store, session_id: str, version: int) -> None:
        path = files_of(store).path_for(session_id)
        head, rest = path.read_bytes().split(b"\n", 1)
        init = msgspec.json.decode(head)
        init["version"] = version
        path.write_bytes(msgspec.json.encode(init) + b"\n" + rest)


def append_raw(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


class BareStore:
    """Only the three methods of the Store protocol."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries)


def say_before_big_writes(fd: int) -> None:
    """In a child process: write "w" to ``fd`` just before each write of over 1 MiB.

    The parent then aims its kill into the store's big ``os.write`` itself.
    """
    real_write = os.write

    def write(target: int, data: Any) -> int:
        if target != fd and len(data) > 1 << 20:
            real_write(fd, b"w")
        return real_write(target, data)

    os.write = write  # this child's own copy of the os module



async def until(condition: Callable[[], object]) -> None:
    """Return once ``condition()`` is true: the test waits for a state, not a time.

    Thirty seconds is only a guard against a hang, far above any wait here.
    """
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never true in 30 s: {condition}")
