"""Tenants in the file and SQLite stores (S72): a folder or a database file per
tenant, the same API, and a store of one tenant sees nothing of another's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import ConfigError, SessionNotFound, StoreError
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, SQLiteStore, open_store
from threadline.stores._rules import tenant_folder

HOSTILE = ["../up", "a/b", "..", "Acme", "acme", "ACME\u202e<script>", "con", "x" * 200,
           "\u00e9t\u00e9", "e\u0301te\u0301"]


def _entry(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage.of(text))


def _open(kind: str, tmp_path: Path, tenant: str | None) -> FileStore | SQLiteStore:
    if kind == "file":
        return FileStore(tmp_path / "root", tenant=tenant)
    return SQLiteStore(tmp_path / "db" / "sessions.db", tenant=tenant)


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s72_a_tenant_lists_loads_appends_watches_nothing_of_another(
    kind: str, tmp_path: Path
) -> None:
    a, b, default = (_open(kind, tmp_path, t) for t in ("tenant-a", "tenant-b", None))
    a.watch_interval = 0.02
    try:
        for sid in ("b-only", "shared"):
            await b.create_session(SessionRecord(id=sid))
            await b.append_entries(sid, [_entry(f"B {sid} {n}") for n in range(3)])
        await default.create_session(SessionRecord(id="d"))
        await a.create_session(SessionRecord(id="shared"))
        await a.append_entries("shared", [_entry("A shared")])

        assert [r.id for r in (await a.list_sessions()).sessions] == ["shared"]
        assert [r.id for r in (await default.list_sessions()).sessions] == ["d"]
        assert [e.message.text for e in await a.load_entries("shared")  # type: ignore[attr-defined]
                ] == ["A shared"]
        for call in (a.load_entries("b-only"), a.load_session("b-only"),
                     a.append_entries("b-only", [_entry("A into B")]),
                     a.append_linear("b-only", [_entry("A linear into B")]),
                     a.delete_session("b-only"), a.load_entries("d")):
            with pytest.raises(SessionNotFound):
                await call
        with pytest.raises(SessionNotFound):
            await anext(aiter(a.watch("b-only")))

        seen: list[str] = []

        async def follow() -> None:
            async for e in a.watch("shared"):
                seen.append(e.message.text)  # type: ignore[attr-defined]
                if len(seen) == 3:
                    return

        task = asyncio.create_task(follow())
        for n in range(2):
            await b.append_entries("shared", [_entry(f"B late {n}")])
            await a.append_entries("shared", [_entry(f"A late {n}")])
        await asyncio.wait_for(task, 30)
        assert seen == ["A shared", "A late 0", "A late 1"]
        await a.delete_session("shared")
        assert len(await b.load_entries("shared")) == 5
        assert sorted(r.id for r in (await b.list_sessions()).sessions) == ["b-only", "shared"]
    finally:
        for s in (a, b, default):
            await s.close()


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s72_hostile_tenant_names_each_get_their_own_place_inside_tenants(
    kind: str, tmp_path: Path
) -> None:
    stores = [_open(kind, tmp_path, t) for t in HOSTILE]
    try:
        for n, store in enumerate(stores):
            await store.create_session(SessionRecord(id="s"))
            await store.append_entries("s", [_entry(str(n))])
        for n, store in enumerate(stores):
            assert [e.message.text for e in await store.load_entries("s")  # type: ignore[attr-defined]
                    ] == [str(n)]
    finally:
        for store in stores:
            await store.close()
    base = (tmp_path / ("root" if kind == "file" else "db") / "tenants").resolve()
    places = {tenant_folder(base.parent, t) for t in HOSTILE}
    assert len(places) == len(HOSTILE)
    assert {p.parent for p in places} == {base}
    assert sorted(os.listdir(base)) == sorted(p.name for p in places)
    # Names that differ only in case have folders that differ in more than case.
    assert len({p.name.lower() for p in places}) == len(HOSTILE)
    assert tenant_folder("r", "acme") == Path("r/tenants/acme")


@pytest.mark.parametrize("bad", ["", "a\x00b", "a\nb", "\x1b[31m", "x" * 201])
def test_s72_a_bad_tenant_name_is_a_config_error(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tenant"):
        FileStore(tmp_path, tenant=bad)
    with pytest.raises(ConfigError, match="tenant"):
        SQLiteStore(tmp_path / "x.db", tenant=bad)


def test_s72_a_tenant_that_does_not_exist_yet_is_not_made_by_a_reader(tmp_path: Path) -> None:
    FileStore(tmp_path)
    with pytest.raises(StoreError, match="tenants"):
        FileStore(tmp_path, tenant="nobody", create=False)
    assert not (tmp_path / "tenants").exists()
    with pytest.raises(ConfigError):
        SQLiteStore(":memory:", tenant="a")


def test_s72_store_urls_take_a_tenant(tmp_path: Path) -> None:
    file_store = open_store(f"file:{tmp_path}/root?tenant=acme")
    assert isinstance(file_store, FileStore)
    assert file_store.root == tmp_path / "root" / "tenants" / "acme"
    db = open_store(f"sqlite:{tmp_path}/s.db?tenant=Acme%20Inc")
    assert isinstance(db, SQLiteStore)
    assert Path(db.path).parent.parent == tmp_path / "tenants"
    assert db.tenant == "Acme Inc"
    from threadline.stores import PostgresStore

    pg = open_store("postgresql://u@127.0.0.1/test?tenant=acme&trusted=true&schema=s")
    assert isinstance(pg, PostgresStore)
    assert (pg.tenant, pg._trusted, pg.schema) == ("acme", True, "s")
    with pytest.raises(ConfigError, match="trusted"):
        open_store("postgresql://u@127.0.0.1/test?tenant=acme&trusted=maybe")
