"""The four built-in stores, described so another thread or process can open them too.

A ``StoreSpec`` is plain data (kind and location); ``spec.open()`` builds a
fresh store object for it, so each thread, event loop or child process under
test gets its own connection to the same sessions.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from threadline.session import FileStore, MemoryStore, Store


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
            from threadline.session import SQLiteStore

            return SQLiteStore(self.location)
        from threadline.session import PostgresStore

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

    import threadline.session._postgres
    import threadline.session._sqlite  # noqa: F401
