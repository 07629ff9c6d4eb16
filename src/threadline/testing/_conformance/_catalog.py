"""The catalog level: read a session's record, list sessions, delete one, close.

For a store that declares the "catalog" capability (``CatalogStore``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from threadline.errors import ConfigError, InvalidSessionId, SessionNotFound, StoreError
from threadline.session._entries import SessionRecord
from threadline.stores._contract import Store
from threadline.testing._conformance._base import SuiteBase
from threadline.testing._conformance._data import assert_same_entries, at, chain_entry, fields
from threadline.testing._conformance._probes import (
    BAD_CURSORS,
    BAD_LIMITS,
    BAD_SESSION_IDS,
    Probes,
    session_with_one_entry,
)

__all__ = ["CatalogTests"]


class CatalogTests(SuiteBase):
    """Tests of ``load_session``, ``list_sessions``, ``delete_session`` and ``close``."""

    async def test_s6_lineage_read_back(self, store: Store) -> None:
        catalog = self.catalog(store)
        created = datetime(2023, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
        parent = SessionRecord(id="conf-parent", created_at=created)
        child = SessionRecord(id="conf-child", parent_id="conf-parent",
                              created_at=created + timedelta(hours=1))
        await store.create_session(parent)
        await store.create_session(child)
        for record in (parent, child):
            got = await catalog.load_session(record.id)
            assert (got.id, got.parent_id, got.created_at) == (
                record.id, record.parent_id, record.created_at
            )
        with pytest.raises(SessionNotFound):
            await catalog.load_session("conf-nobody")

    async def test_s6_created_at_keeps_microseconds(self, store: Store) -> None:
        catalog = self.catalog(store)
        record = SessionRecord(id="conf-micro", parent_id="conf-origin",
                               created_at=datetime(2024, 2, 29, 23, 59, 59, 123457, tzinfo=UTC))
        await store.create_session(record)
        assert fields(await catalog.load_session(record.id)) == fields(record)
        assert [fields(r) for r in (await catalog.list_sessions()).sessions] == [fields(record)]

    async def test_list_sessions_newest_first_with_keyset_pages(self, store: Store) -> None:
        list_sessions = self.catalog(store).list_sessions
        # Every field of every record comes back: lineage on some, microseconds on all.
        records = [SessionRecord(id=f"conf-list-{n:02d}",
                                 parent_id=f"conf-origin-{n}" if n % 3 else None,
                                 created_at=at(n) + timedelta(microseconds=7 * n + 1))
                   for n in range(10)]
        # Three sessions created in the same instant: ties break by id, descending.
        records += [SessionRecord(id=f"conf-tie-{c}", created_at=at(5)) for c in "bca"]
        for record in records:
            await store.create_session(record)
        expected = [fields(r) for r in sorted(records, key=lambda r: (r.created_at, r.id),
                                               reverse=True)]

        page = await list_sessions(limit=100)
        assert [fields(r) for r in page.sessions] == expected
        assert page.next_cursor is None

        seen: list[tuple[str, str | None, datetime]] = []
        page = await list_sessions(limit=4)
        seen += [fields(r) for r in page.sessions]
        # A session created between pages must not shift the pages (keyset).
        await store.create_session(SessionRecord(id="conf-list-late", created_at=at(100)))
        while page.next_cursor is not None:
            page = await list_sessions(limit=4, cursor=page.next_cursor)
            assert 0 < len(page.sessions) <= 4
            seen += [fields(r) for r in page.sessions]
        assert seen == expected
        first = (await list_sessions(limit=1)).sessions[0]
        assert first.id == "conf-list-late"
        assert first.created_at == at(100)

    async def test_list_sessions_refuses_a_bad_limit_or_cursor(self, store: Store) -> None:
        list_sessions = self.catalog(store).list_sessions
        for n in range(3):
            await store.create_session(SessionRecord(id=f"conf-page-{n}", created_at=at(n)))
        for limit in (0, -1):
            with pytest.raises(ConfigError):
                await list_sessions(limit=limit)
        cursor = (await list_sessions(limit=1)).next_cursor
        assert isinstance(cursor, str)
        for bad in ("", "not a cursor", cursor[: len(cursor) // 2] + "!"):
            with pytest.raises(ConfigError):
                await list_sessions(limit=1, cursor=bad)
        assert [r.id for r in (await list_sessions(limit=5, cursor=cursor)).sessions] == [
            "conf-page-1", "conf-page-0"]

    async def test_delete_session(self, store: Store) -> None:
        catalog = self.catalog(store)
        keep = await self.new_session(store)
        gone = await self.new_session(store)
        await store.append_entries(keep, [chain_entry(None, 0, 0)])
        await store.append_entries(gone, [chain_entry(None, 0, 0)])
        await catalog.delete_session(gone)
        with pytest.raises(SessionNotFound):
            await store.load_entries(gone)
        with pytest.raises(SessionNotFound):
            await store.append_entries(gone, [chain_entry(None, 0, 1)])
        with pytest.raises(SessionNotFound):
            await catalog.delete_session(gone)
        with pytest.raises(SessionNotFound):
            await catalog.load_session(gone)
        assert gone not in [r.id for r in (await catalog.list_sessions(limit=1000)).sessions]
        assert len(await store.load_entries(keep)) == 1
        # The id is free again, with an empty log.
        await store.create_session(SessionRecord(id=gone))
        assert list(await store.load_entries(gone)) == []

    async def test_s7_close_twice_then_calls_work_or_raise_store_error(
        self, store: Store
    ) -> None:
        catalog = self.catalog(store)
        sid = await self.new_session(store)
        await catalog.close()
        await catalog.close()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load_entries(sid),
            lambda: store.append_entries(sid, [chain_entry(None, 0, 0)]),
            lambda: store.create_session(SessionRecord(id="conf-after-close")),
        ]
        for call in calls:
            # Anything but a StoreError (AttributeError on a dropped
            # connection, a hang) fails the test.
            with contextlib.suppress(StoreError):
                await call()

    async def test_catalog_methods_refuse_odd_arguments(self, store: Store) -> None:
        catalog = self.catalog(store)
        sid, kept = await session_with_one_entry(self, store)
        probes = Probes()
        for bad in BAD_SESSION_IDS:
            await probes.expect(InvalidSessionId, f"create_session(SessionRecord(id={bad!r}))",
                                functools.partial(store.create_session,
                                                  SessionRecord(id=bad)))
            await probes.expect(InvalidSessionId, f"load_session({bad!r})",
                                functools.partial(catalog.load_session, bad))
            await probes.expect(InvalidSessionId, f"delete_session({bad!r})",
                                functools.partial(catalog.delete_session, bad))
        for limit in BAD_LIMITS:
            await probes.expect(ConfigError, f"list_sessions(limit={limit!r})",
                                functools.partial(catalog.list_sessions, limit=limit))
        for cursor in BAD_CURSORS:
            await probes.expect(ConfigError, f"list_sessions(cursor={cursor!r})",
                                functools.partial(catalog.list_sessions, limit=1,
                                                  cursor=cursor))
        probes.check(store)
        # Nothing was created or deleted on the way.
        assert [r.id for r in (await catalog.list_sessions()).sessions] == [sid]
        assert_same_entries(await store.load_entries(sid), kept)
