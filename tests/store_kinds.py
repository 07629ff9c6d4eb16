"""The four built-in stores, described so another thread or process can open them too.

A ``StoreSpec`` is plain data (kind and location); ``spec.open()`` builds a
fresh store object for it, so each thread, event loop or child process under
test gets its own connection to the same sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from threadline.session import FileStore, MemoryStore, Store

KINDS = ("memory", "file", "sqlite", "postgres")


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
