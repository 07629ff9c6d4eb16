"""Search and encryption (S65): an encrypted subject leaves nothing in any index.

Checked where the index lives (SQL rows, the file store's index files), not
through ``search`` alone. With ``searching="decrypt"`` the application opts in
to finding sealed entries by opening them at search time; the conformance
part's search tests run through it, and an erased subject is never found.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from threadline.ai._messages import TextPart, UserMessage
from threadline.errors import ConfigError
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
from threadline.session._entries import MessageEntry, SessionRecord
from threadline.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store
from threadline.stores._contract import SearchableStore
from threadline.testing._conformance._search import SearchTests, indexed_sample

KEK = b"threadline conformance kek 32 b!"
SECRET = "wsecretplankton"


def _keyring(tmp_path: Path) -> Keyring:
    return Keyring(tmp_path / "keyring", LocalKeyProvider(KEK))


def _user(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage(content=(TextPart(text=text),)))


async def _fill(store: EncryptedStore) -> None:
    entries, _ = indexed_sample(SECRET)
    await store.create_session(SessionRecord(id="sealed"))
    await store.append_entries("sealed", [*entries, _user(f"{SECRET} plain words")])


async def test_s65_sqlite_index_holds_nothing_of_an_encrypted_subject(tmp_path: Path) -> None:
    inner = SQLiteStore(tmp_path / "s.db")
    store = EncryptedStore(inner, _keyring(tmp_path))
    await _fill(store)
    assert isinstance(store, SearchableStore)
    assert await store.search(SECRET) == []
    await inner.close()
    with sqlite3.connect(tmp_path / "s.db") as raw:
        assert raw.execute("SELECT count(*) FROM search").fetchone()[0] == 0
    assert SECRET.encode() not in (tmp_path / "s.db").read_bytes()


async def test_s65_postgres_index_holds_nothing_of_an_encrypted_subject(
        tmp_path: Path, pg_url: str, pg_schema: str) -> None:
    inner = PostgresStore(pg_url, schema=pg_schema, min_size=0, max_size=2)
    store = EncryptedStore(inner, _keyring(tmp_path))
    try:
        await _fill(store)
        assert await store.search(SECRET) == []
    finally:
        await inner.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = conn.execute(f"SELECT count(*) FROM {pg_schema}.search").fetchone()
    assert count == (0,)


async def test_s65_file_index_holds_nothing_of_an_encrypted_subject(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = EncryptedStore(FileStore(root), _keyring(tmp_path))
    await _fill(store)
    assert await store.search(SECRET) == []
    files = list((root / ".search").iterdir())
    assert files and all(SECRET.encode() not in f.read_bytes() for f in files)


async def test_s65_decrypting_search_finds_then_erasure_hides(tmp_path: Path) -> None:
    inner = SQLiteStore(tmp_path / "s.db")
    keys = _keyring(tmp_path)
    store = EncryptedStore(inner, keys, subject="ann", searching="decrypt")
    await _fill(store)
    hits = await store.search(SECRET)
    assert [h.session_id for h in hits] == ["sealed"] and SECRET in hits[0].snippet
    assert await inner.search(SECRET) == []  # still nothing in the index
    await store.erase_subject("ann")
    assert await store.search(SECRET) == []
    await store.delete_session("sealed")
    assert await store.search(SECRET) == []
    await inner.close()
    with sqlite3.connect(tmp_path / "s.db") as raw:
        assert raw.execute("SELECT count(*) FROM search").fetchone()[0] == 0


def test_s65_searching_must_be_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="searching"):
        EncryptedStore(MemoryStore(), _keyring(tmp_path), searching="plaintext")  # type: ignore[arg-type]


@pytest.mark.asyncio
class TestDecryptingSearch(SearchTests):
    """The conformance part's search tests, through ``searching="decrypt"``."""

    capabilities = frozenset({"catalog", "search"})

    async def make_store(self, tmp_path: Path) -> Store:
        return EncryptedStore(SQLiteStore(tmp_path / "s.db"), _keyring(tmp_path),
                              searching="decrypt")

