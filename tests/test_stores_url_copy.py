"""Store URLs (``open_store``) and copying sessions between stores."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from support.stores import BareStore
from threadline.ai._messages import UserMessage
from threadline.errors import ConfigError, CopyConflict, StoreError
from threadline.session import Entry, MessageEntry, SessionRecord, encode_entry
from threadline.stores import (
    CatalogStore,
    CopyProgress,
    FileStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    copy_sessions,
    open_store,
)
from threadline.testing import FaultyStore, sample_entries

# -- open_store -----------------------------------------------------------------


async def _works(store: CatalogStore) -> None:
    await store.create_session(SessionRecord(id="probe"))
    await store.append_entries("probe", [MessageEntry(message=UserMessage.of("hi"))])
    assert len(await store.load_entries("probe")) == 1
    await store.close()


async def test_folder_paths_and_file_urls_open_a_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(str(tmp_path / "plain"))
    assert isinstance(store, FileStore)
    assert (store.root, store.durability) == (tmp_path / "plain", "fsync")
    await _works(store)
    assert (tmp_path / "plain").is_dir()

    assert isinstance(path_store := open_store(tmp_path / "pathlike"), FileStore)
    assert path_store.root == tmp_path / "pathlike"

    url_store = open_store(f"file://{tmp_path}/with%20space?durability=flush")
    assert isinstance(url_store, FileStore)
    assert (url_store.root, url_store.durability) == (tmp_path / "with space", "flush")

    monkeypatch.chdir(tmp_path)
    rel = open_store("file:relative/dir")
    assert isinstance(rel, FileStore)
    assert rel.root == Path("relative/dir")
    await _works(rel)
    assert (tmp_path / "relative" / "dir").is_dir()


async def test_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"sqlite://{tmp_path}/a.db?synchronous=normal&busy_timeout=2.5")
    assert isinstance(store, SQLiteStore)
    assert (store.path, store.synchronous, store.busy_timeout) == (
        f"{tmp_path}/a.db", "NORMAL", 2.5)
    await _works(store)
    assert (tmp_path / "a.db").is_file()

    monkeypatch.chdir(tmp_path)
    rel = open_store("sqlite:rel.db")
    assert isinstance(rel, SQLiteStore)
    assert (rel.path, rel.synchronous) == ("rel.db", "FULL")
    await _works(rel)
    assert (tmp_path / "rel.db").is_file()


async def test_memory_url() -> None:
    store = open_store("memory:")
    assert isinstance(store, MemoryStore)
    await _works(store)
    assert open_store("memory:") is not store


async def test_postgres_urls(pg_url: str, pg_schema: str) -> None:
    store = open_store(f"{pg_url}?schema={pg_schema}&prepare_threshold=none&max_size=3"
                       f"&sslmode=disable")
    assert isinstance(store, PostgresStore)
    assert store.schema == pg_schema
    assert isinstance(store.pool.kwargs, dict)
    assert store.pool.kwargs["prepare_threshold"] is None
    assert store.pool.max_size == 3
    await _works(store)
    alias = open_store(pg_url.replace("postgresql://", "postgres://", 1)
                       + f"?schema={pg_schema}&prepare_threshold=3")
    assert isinstance(alias, PostgresStore)
    assert isinstance(alias.pool.kwargs, dict)
    assert alias.pool.kwargs["prepare_threshold"] == 3
    assert len(await alias.load_entries("probe")) == 1
    await alias.close()


@pytest.mark.parametrize(("url", "mentions"), [
    ("redis://localhost/0", "scheme 'redis'"),
    ("sqlite://somehost/x.db", "names a host"),
    ("sqlite:", "no path"),
    ("sqlite:x.db?synchronous=OFF", "synchronous"),
    ("sqlite:x.db?busy_timeout=soon", "busy_timeout"),
    ("sqlite:x.db?bogus=1", "bogus"),
    ("sqlite:x.db?synchronous=FULL&synchronous=NORMAL", "repeats"),
    ("file:/tmp/x?durability=maybe", "durability"),
    ("memory:?x=1", "x"),
    ("memory:somewhere", "no path"),
    ("postgresql://h/db?max_size=lots", "max_size"),
    ("postgresql://h/db?no_such_libpq_option=1", "no_such_libpq_option"),
])
def test_bad_urls_are_config_errors_naming_the_url(url: str, mentions: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert url.split("?", maxsplit=1)[0] in str(info.value)
    assert mentions in str(info.value)


def test_bad_url_errors_hide_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("postgresql://me:hunter2@h/db?max_size=lots")
    assert "hunter2" not in str(info.value)
    assert "me:***@h/db" in str(info.value)
    with pytest.raises(ConfigError):
        open_store("")


# -- copy_sessions --------------------------------------------------------------

CREATED = datetime(2024, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)


async def _fill(store: CatalogStore) -> dict[str, Sequence[Entry]]:
    """A session with every entry kind, a fork of it, and an empty one."""
    main = sample_entries()
    fork: list[Entry] = [MessageEntry(message=UserMessage.of("forked")) for _ in range(3)]
    await store.create_session(SessionRecord(id="main", created_at=CREATED))
    await store.append_entries("main", main[:4])
    await store.append_entries("main", main[4:])
    await store.create_session(SessionRecord(id="fork", parent_id="main",
                                             created_at=CREATED.replace(minute=6)))
    await store.append_entries("fork", fork)
    await store.create_session(SessionRecord(id="empty", created_at=CREATED.replace(minute=7)))
    return {"main": main, "fork": fork, "empty": []}


async def _assert_same(store: CatalogStore, expected: Mapping[str, Sequence[Entry]]) -> None:
    for sid, entries in expected.items():
        assert [encode_entry(e) for e in await store.load_entries(sid)] == [
            encode_entry(e) for e in entries], sid
    assert (await store.load_session("fork")).parent_id == "main"
    assert (await store.load_session("main")).created_at == CREATED
    assert (await store.load_session("empty")).parent_id is None


async def test_copy_through_every_store_kind_is_byte_identical(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    chain: list[CatalogStore] = [
        MemoryStore(),
        SQLiteStore(tmp_path / "copy.db"),
        PostgresStore(pg_url, schema=pg_schema),
        FileStore(tmp_path / "files"),
        MemoryStore(),
    ]
    expected = await _fill(chain[0])
    for src, dst in itertools.pairwise(chain):
        result = await copy_sessions(src, dst)
        assert (result.copied, result.resumed, result.skipped, result.entries) == (
            3, 0, 0, len(expected["main"]) + len(expected["fork"]))
        await _assert_same(dst, expected)
    for store in chain:
        await store.close()


async def test_copy_resumes_after_an_interruption(tmp_path: Path) -> None:
    src = MemoryStore()
    expected = await _fill(src)
    dst = SQLiteStore(tmp_path / "dst.db")
    # The third batch fails: "main" holds a strict prefix when the copy stops.
    faulty = FaultyStore(dst, fail_append_on=3)
    with pytest.raises(StoreError, match="injected"):
        await copy_sessions(src, faulty, ["main", "fork", "empty"], batch_size=4)
    assert 0 < len(await dst.load_entries("main")) < len(expected["main"])

    seen: list[CopyProgress] = []
    result = await copy_sessions(src, dst, ["main", "fork", "empty"], seen.append,
                                 batch_size=4)
    await _assert_same(dst, expected)
    assert [(p.session_id, p.status, p.done, p.total) for p in seen] == [
        ("main", "resumed", 1, 3), ("fork", "copied", 2, 3), ("empty", "copied", 3, 3)]
    assert seen[0].entries == len(expected["main"]) - 8
    assert result.entries == sum(p.entries for p in seen)

    # Run again: everything is complete, nothing is appended.
    seen.clear()
    again = await copy_sessions(src, dst, progress=seen.append)
    assert (again.skipped, again.entries) == (3, 0)
    assert {p.session_id for p in seen} == {"main", "fork", "empty"}
    await dst.close()


async def test_copy_after_a_lost_acknowledgement_does_not_duplicate(tmp_path: Path) -> None:
    src = MemoryStore()
    expected = await _fill(src)
    dst = SQLiteStore(tmp_path / "dst.db")
    # The batch is stored, but the copier is told it failed.
    with pytest.raises(StoreError):
        await copy_sessions(src, FaultyStore(dst, fail_append_on=1, when="after"), ["main"])
    result = await copy_sessions(src, dst)
    assert result.skipped == 1  # "main" was in fact complete
    await _assert_same(dst, expected)
    await dst.close()


async def test_copy_refuses_a_destination_that_differs(tmp_path: Path) -> None:
    src = MemoryStore()
    expected = await _fill(src)

    different_entry = MemoryStore()
    await different_entry.create_session(SessionRecord(id="main", created_at=CREATED))
    await different_entry.append_entries("main", [*expected["main"][:2],
                                                  MessageEntry(message=UserMessage.of("x"))])
    with pytest.raises(CopyConflict, match="entry 3") as info:
        await copy_sessions(src, different_entry, ["main"])
    assert info.value.session_id == "main"
    assert len(await different_entry.load_entries("main")) == 3  # untouched

    longer = MemoryStore()
    await longer.create_session(SessionRecord(id="fork", parent_id="main",
                                              created_at=CREATED.replace(minute=6)))
    await longer.append_entries("fork", [*expected["fork"], MessageEntry(
        message=UserMessage.of("more"))])
    with pytest.raises(CopyConflict, match="4 entries"):
        await copy_sessions(src, longer, ["fork"])

    other_parent = MemoryStore()
    await other_parent.create_session(SessionRecord(id="fork", parent_id="elsewhere",
                                                    created_at=CREATED.replace(minute=6)))
    with pytest.raises(CopyConflict, match="elsewhere"):
        await copy_sessions(src, other_parent, ["fork"])
    assert list(await other_parent.load_entries("fork")) == []


async def test_copy_needs_what_it_cannot_do_without() -> None:
    src = MemoryStore()
    expected = await _fill(src)
    with pytest.raises(ConfigError, match="load_session"):
        await copy_sessions(BareStore(src), MemoryStore(), ["main"])
    # A bare destination is fine: its entries are still compared.
    bare_dst = BareStore(MemoryStore())
    await copy_sessions(src, bare_dst, ["main", "main"])
    assert [encode_entry(e) for e in await bare_dst.load_entries("main")] == [
        encode_entry(e) for e in expected["main"]]
    assert (await bare_dst.inner.load_session("main")).created_at == CREATED


class _NoListStore(BareStore):
    async def load_session(self, session_id: str) -> SessionRecord:
        return await self.inner.load_session(session_id)


async def test_copy_of_all_sessions_needs_list_sessions() -> None:
    src = MemoryStore()
    await _fill(src)
    with pytest.raises(ConfigError, match="list_sessions"):
        await copy_sessions(_NoListStore(src), MemoryStore())
    dst = MemoryStore()
    assert (await copy_sessions(_NoListStore(src), dst, ["fork"])).copied == 1
    assert [r.id for r in (await dst.list_sessions()).sessions] == ["fork"]
