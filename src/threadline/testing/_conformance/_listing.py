"""The listing part of the catalog level: metadata, filters, activity order, cursors.

For a store that declares "catalog" (``CatalogStore.list_sessions`` with
``owner``, ``tenant``, ``labels`` and ``order``; S61, S62).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from threadline.errors import ConfigError
from threadline.session._entries import CustomEntry, Entry, SessionRecord
from threadline.session._metadata import METADATA_KIND, fold_metadata, metadata_change
from threadline.stores._contract import SessionInfo, Store
from threadline.stores._listing import set_metadata
from threadline.testing._conformance._base import SuiteBase
from threadline.testing._conformance._data import at, chain_entry

__all__ = ["ListingTests"]


def _change(parent: Entry | None, seconds: int, **fields: object) -> Entry:
    return CustomEntry(kind=METADATA_KIND, data=metadata_change(**fields),  # type: ignore[arg-type]
                       parent_id=None if parent is None else parent.id, timestamp=at(seconds))


def _message(parent: Entry | None, seconds: int) -> Entry:
    entry = chain_entry(None if parent is None else parent.id, 0, seconds)
    return entry.__class__(id=entry.id, parent_id=entry.parent_id, timestamp=at(seconds),
                           message=entry.message)


class ListingTests(SuiteBase):
    """Tests of metadata in the listing, its filters, activity order and cursors."""

    async def _infos(self, store: Store, **kwargs: object) -> list[SessionInfo]:
        catalog = self.catalog(store)
        out: list[SessionInfo] = []
        cursor = None
        while True:
            page = await catalog.list_sessions(limit=2, cursor=cursor, **kwargs)  # type: ignore[arg-type]
            assert [i.record for i in page.infos] == page.sessions
            out += page.infos
            cursor = page.next_cursor
            if cursor is None:
                return out

    async def test_s61_last_change_in_append_order_wins_on_every_branch(
        self, store: Store
    ) -> None:
        catalog = self.catalog(store)
        await store.create_session(SessionRecord(id="conf-meta", created_at=at(0)))
        root = _message(None, 1)
        one = _change(root, 2, title="one", owner="ann", labels={"a": "1", "b": "2"})
        other = _message(root, 3)  # a sibling branch of the first change
        two = _change(other, 4, title="two", labels={"b": None, "c": "3"})
        back = _message(one, 5)  # the first branch again, appended last
        await store.append_entries("conf-meta", [root, one])
        await store.append_entries("conf-meta", [other, two])
        await store.append_entries("conf-meta", [back])
        [info] = (await catalog.list_sessions()).infos
        # The last change appended wins though the leaf is on the other branch.
        assert (info.title, info.metadata.owner, info.metadata.tenant) == ("two", "ann", None)
        assert info.metadata.labels == {"a": "1", "c": "3"}
        assert info.metadata == fold_metadata(await store.load_entries("conf-meta"))
        assert info.last_activity == at(5)
        # Cleared with None; every change stays in the log.
        await store.append_entries("conf-meta", [_change(back, 6, title=None)])
        [info] = (await catalog.list_sessions()).infos
        assert info.title is None and info.metadata.owner == "ann"
        assert len(await store.load_entries("conf-meta")) == 6

    async def test_s61_set_metadata_chains_after_the_last_entry(self, store: Store) -> None:
        sid = await self.new_session(store)
        first = _message(None, 1)
        await store.append_entries(sid, [first])
        stored = await set_metadata(store, sid, title="hello \u202e<b>", tenant="t1")
        assert stored.parent_id == first.id
        entries = await store.load_entries(sid)
        assert entries[-1].id == stored.id
        assert fold_metadata(entries).title == "hello \u202e<b>"
        [info] = (await self.catalog(store).list_sessions(tenant="t1")).infos
        assert info.id == sid and info.title == "hello \u202e<b>"
        with pytest.raises(ConfigError):
            await set_metadata(store, sid, owner="nul\x00")
        with pytest.raises(ConfigError):
            await set_metadata(store, sid, labels={"": "x"})
        assert len(await store.load_entries(sid)) == 2

    async def test_s62_filters_by_owner_tenant_and_labels(self, store: Store) -> None:
        for n, (owner, tenant, labels) in enumerate([
            ("ann", "acme", {"kind": "chat", "tier": "gold"}),
            ("ann", "acme", {"kind": "task"}),
            ("bob", "acme", {"kind": "chat"}),
            ("ann", "zeta", {"kind": "chat", "tier": "gold"}),
            (None, None, {}),
        ]):
            sid = f"conf-filter-{n}"
            await store.create_session(SessionRecord(id=sid, created_at=at(n)))
            if owner is not None:
                await store.append_entries(sid, [_change(None, 10 + n, owner=owner,
                                                         tenant=tenant, labels=labels)])

        async def ids(**kwargs: object) -> list[str]:
            return [i.id for i in await self._infos(store, **kwargs)]

        assert await ids() == [f"conf-filter-{n}" for n in (4, 3, 2, 1, 0)]
        assert await ids(owner="ann") == ["conf-filter-3", "conf-filter-1", "conf-filter-0"]
        assert await ids(owner="ann", tenant="acme") == ["conf-filter-1", "conf-filter-0"]
        assert await ids(labels={"kind": "chat"}) == [
            "conf-filter-3", "conf-filter-2", "conf-filter-0"]
        assert await ids(labels={"kind": "chat", "tier": "gold"}, owner="ann") == [
            "conf-filter-3", "conf-filter-0"]
        assert await ids(tenant="acme", order="activity") == [
            "conf-filter-2", "conf-filter-1", "conf-filter-0"]
        assert await ids(owner="nobody") == []
        # A session moved to another owner is listed under the new one only.
        await store.append_entries("conf-filter-0", [_change(None, 20, owner="bob",
                                                             labels={"tier": None})])
        assert await ids(owner="bob", order="activity") == ["conf-filter-0", "conf-filter-2"]
        assert await ids(labels={"tier": "gold"}) == ["conf-filter-3"]
        await self.catalog(store).delete_session("conf-filter-2")
        assert await ids(owner="bob") == ["conf-filter-0"]
        for bad in ({"owner": 3}, {"labels": ["kind"]}, {"labels": {"kind": 1}},
                    {"order": "newest"}):
            with pytest.raises(ConfigError):
                await self.catalog(store).list_sessions(**bad)

    async def test_s62_activity_order_with_a_stable_cursor(self, store: Store) -> None:
        catalog = self.catalog(store)
        # Created in one order, active in another; one session never appended to.
        for n in range(6):
            await store.create_session(SessionRecord(id=f"conf-act-{n}",
                                                     created_at=at(n)))
        for n, seconds in ((0, 50), (1, 30), (2, 40), (3, 10), (5, 20)):
            await store.append_entries(f"conf-act-{n}", [_message(None, seconds)])
        expected = ["conf-act-0", "conf-act-2", "conf-act-1", "conf-act-5", "conf-act-3",
                    "conf-act-4"]
        infos = await self._infos(store, order="activity")
        assert [i.id for i in infos] == expected
        assert infos[-2].last_activity == at(10)
        assert infos[-1].last_activity == at(4)  # never appended to: its creation

        page = await catalog.list_sessions(limit=2, order="activity")
        seen = [i.id for i in page.infos]
        # A session active between pages moves above the cursor: not repeated, no shift.
        await store.append_entries("conf-act-3", [_message(None, 100)])
        # An entry older than the session's activity does not move it back.
        await store.append_entries("conf-act-5", [_message(None, 15)])
        while page.next_cursor is not None:
            page = await catalog.list_sessions(limit=2, order="activity",
                                               cursor=page.next_cursor)
            seen += [i.id for i in page.infos]
        assert seen == [i for i in expected if i != "conf-act-3"]
        assert [i.id for i in await self._infos(store, order="activity")][:1] == ["conf-act-3"]
        created_cursor = (await catalog.list_sessions(limit=1)).next_cursor
        activity_cursor = (await catalog.list_sessions(limit=1, order="activity")).next_cursor
        with pytest.raises(ConfigError):
            await catalog.list_sessions(cursor=created_cursor, order="activity")
        with pytest.raises(ConfigError):
            await catalog.list_sessions(cursor=activity_cursor)
        # The newest created first still holds, with the metadata and activity beside.
        infos = await self._infos(store)
        assert [i.id for i in infos] == [f"conf-act-{n}" for n in range(5, -1, -1)]
        assert infos[0].last_activity == at(20) and infos[0].record.created_at == at(5)
        assert infos[2].last_activity == at(3) + timedelta(seconds=97)
