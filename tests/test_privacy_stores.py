"""The conformance suite over an encrypted memory, file, SQLite and PostgreSQL store.

Every contract point of the Store protocol holds through ``EncryptedStore``,
while the store beneath holds only sealed entries.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.postgres import insert_raw_row as pg_insert_raw_row
from support.sqlite import insert_raw_row as sqlite_insert_raw_row
from support.sqlite import raw_connection
from support.stores import FileHooks
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
from threadline.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store
from threadline.testing import StoreConformance

# A fixed key-encryption key, so every child process opens the same keyring.
KEK = b"threadline conformance kek 32 b!"


def encrypted(inner: Store, tmp_path: Path) -> EncryptedStore:
    return EncryptedStore(inner, Keyring(tmp_path / "keyring", LocalKeyProvider(KEK)))


_SEALED = ("metadata entries are sealed like every custom entry, so the store beneath "
           "lists no metadata (docs/privacy.md); the activity order still holds")


class _SealedMetadata:
    """What an encrypted store does not offer yet: listing by metadata (S61, S62)."""

    @pytest.mark.skip(reason=_SEALED)
    async def test_s61_last_change_in_append_order_wins_on_every_branch(self) -> None: ...

    @pytest.mark.skip(reason=_SEALED)
    async def test_s61_set_metadata_chains_after_the_last_entry(self) -> None: ...

    @pytest.mark.skip(reason=_SEALED)
    async def test_s62_filters_by_owner_tenant_and_labels(self) -> None: ...


class TestEncryptedMemoryStore(_SealedMetadata, StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch"})
    shared_instances = False

    async def make_store(self, tmp_path: Path) -> Store:
        return encrypted(MemoryStore(), tmp_path)

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        assert isinstance(store, EncryptedStore) and isinstance(store.inner, MemoryStore)
        store.inner._logs[session_id].append(data)


class TestEncryptedFileStore(_SealedMetadata, FileHooks):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    async def make_store(self, tmp_path: Path) -> Store:
        return encrypted(FileStore(tmp_path / "sessions"), tmp_path)


class TestEncryptedSQLiteStore(_SealedMetadata, StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    async def make_store(self, tmp_path: Path) -> Store:
        return encrypted(SQLiteStore(tmp_path / "sessions.db"), tmp_path)

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        with raw_connection(self._tmp_path / "sessions.db") as conn:
            sqlite_insert_raw_row(conn, session_id, data)


class TestEncryptedPostgresStore(_SealedMetadata, StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    @pytest.fixture(autouse=True)
    def _schema(self, pg_url: str, pg_schema: str) -> Iterator[None]:
        self.pg_url, self.pg_schema = pg_url, pg_schema
        yield

    async def make_store(self, tmp_path: Path) -> Store:
        return encrypted(PostgresStore(self.pg_url, schema=self.pg_schema, max_size=4), tmp_path)

    def store_opener(self, tmp_path: Path) -> functools.partial[Store]:
        return functools.partial(_open_postgres, self.pg_url, self.pg_schema, str(tmp_path))

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        pg_insert_raw_row(self.pg_url, self.pg_schema, session_id, data)


def _open_postgres(url: str, schema: str, tmp_path: str) -> Store:
    return encrypted(PostgresStore(url, schema=schema, max_size=2), Path(tmp_path))
