"""The shipped conformance suite fails wrong stores (issue: a suite that passes anything).

Each variant below wraps a real ``FileStore`` and breaks one rule of the
Store contract. The suite's own test methods are run on it, the way pytest
runs them for a store author, and the test that states the rule must fail.
The unbroken wrapper passes the same tests, so a failure means the rule,
not the wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from test_store_file import FileHooks
from threadline.errors import ConfigError, CorruptLog, SessionExists, SessionNotFound, StoreError
from threadline.session import Entry, EntryLog, FileStore, SessionPage, SessionRecord, Store
from threadline.testing import StoreConformance


class Wrapped:
    """Delegates every method to a real FileStore."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries)

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self.inner.load_session(session_id)

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        return await self.inner.list_sessions(limit=limit, cursor=cursor)

    async def delete_session(self, session_id: str) -> None:
        await self.inner.delete_session(session_id)

    async def close(self) -> None:
        await self.inner.close()


class OneWritePerEntry(Wrapped):
    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if not entries:
            await self.inner.append_entries(session_id, [])
        for entry in entries:
            await self.inner.append_entries(session_id, [entry])
            await asyncio.sleep(0)


class StaleCache(Wrapped):
    def __init__(self, inner: FileStore) -> None:
        super().__init__(inner)
        self.cache: dict[str, list[Entry]] = {}

    async def load_entries(self, session_id: str) -> list[Entry]:
        if session_id not in self.cache:
            self.cache[session_id] = list(await self.inner.load_entries(session_id))
        return list(self.cache[session_id])

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries)
        self.cache.setdefault(session_id, []).extend(entries)


class DropsPast100(Wrapped):
    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries[:100])


class BreaksNear8000(Wrapped):
    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if len(entries) > 8000:
            raise StoreError("request too large", session_id=session_id)
        await self.inner.append_entries(session_id, entries)


class MillisecondsOnly(Wrapped):
    async def create_session(self, record: SessionRecord) -> None:
        at = record.created_at
        cut = at.replace(microsecond=at.microsecond // 1000 * 1000)
        await self.inner.create_session(msgspec.structs.replace(record, created_at=cut))


class ListingDropsParent(Wrapped):
    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        page = await self.inner.list_sessions(limit=limit, cursor=cursor)
        records = [msgspec.structs.replace(r, parent_id=None) for r in page.sessions]
        return msgspec.structs.replace(page, sessions=records)


class ListingWrongCreatedAt(Wrapped):
    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        page = await self.inner.list_sessions(limit=limit, cursor=cursor)
        now = datetime.now(UTC)
        records = page.sessions[:1] + [
            msgspec.structs.replace(r, created_at=now) for r in page.sessions[1:]]
        return msgspec.structs.replace(page, sessions=records)


class RecreateIdenticalSucceeds(Wrapped):
    async def create_session(self, record: SessionRecord) -> None:
        try:
            await self.inner.create_session(record)
        except SessionExists:
            if await self.inner.load_session(record.id) != record:
                raise


class EmptyAppendNeedsNothing(Wrapped):
    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if entries:
            await self.inner.append_entries(session_id, entries)


class NotFoundNamesAnother(Wrapped):
    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        try:
            await self.inner.append_entries(session_id, entries)
        except SessionNotFound:
            raise SessionNotFound("the-store's-own-key") from None

    async def delete_session(self, session_id: str) -> None:
        try:
            await self.inner.delete_session(session_id)
        except SessionNotFound:
            raise SessionNotFound("the-store's-own-key") from None


class LaxIds(Wrapped):
    """Accepts ids the rule refuses, by quietly changing them."""

    @staticmethod
    def fix(session_id: Any) -> str:
        text = str(session_id).replace("\x00", "_").encode("utf-8", "replace").decode()
        return (text or "empty")[:200]

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(SessionRecord(
            id=self.fix(record.id), created_at=record.created_at,
            parent_id=None if record.parent_id is None else self.fix(record.parent_id)))

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(self.fix(session_id))

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(self.fix(session_id), entries)


class HidesCorruption(Wrapped):
    async def load_entries(self, session_id: str) -> list[Entry]:
        try:
            return await self.inner.load_entries(session_id)
        except CorruptLog:
            return EntryLog()

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        with contextlib.suppress(CorruptLog):
            await self.inner.append_entries(session_id, entries)


class BrokenAfterClose(Wrapped):
    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()
        self.inner = None  # type: ignore[assignment]


class LaxCursor(Wrapped):
    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        try:
            return await self.inner.list_sessions(limit=max(limit, 1), cursor=cursor)
        except ConfigError:
            return await self.inner.list_sessions(limit=max(limit, 1))


class KeepsWhatIsNew(Wrapped):
    """Drops the repeated ids from a batch instead of refusing it."""

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        try:
            await self.inner.append_entries(session_id, entries)
        except SessionNotFound:
            raise
        except StoreError:
            stored = {e.id for e in await self.inner.load_entries(session_id)}
            fresh = {}
            for entry in entries:
                if entry.id not in stored:
                    fresh.setdefault(entry.id, entry)
            await self.inner.append_entries(session_id, list(fresh.values()))


CAUGHT: dict[type[Wrapped], list[str]] = {
    OneWritePerEntry: ["test_s8_readers_never_see_part_of_a_batch",
                       "test_s8_repeated_entry_id_refuses_the_whole_batch"],
    StaleCache: ["test_s4_every_handle_sees_what_another_handle_wrote",
                 "test_s4_two_handles_append_from_one_leaf_grow_siblings"],
    DropsPast100: ["test_s8_large_batches_are_kept_whole"],
    BreaksNear8000: ["test_s8_large_batches_are_kept_whole"],
    MillisecondsOnly: ["test_s6_created_at_keeps_microseconds",
                       "test_list_sessions_newest_first_with_keyset_pages"],
    ListingDropsParent: ["test_list_sessions_newest_first_with_keyset_pages",
                         "test_s6_created_at_keeps_microseconds"],
    ListingWrongCreatedAt: ["test_list_sessions_newest_first_with_keyset_pages"],
    RecreateIdenticalSucceeds: ["test_s7_identical_record_cannot_be_created_twice"],
    EmptyAppendNeedsNothing: ["test_s7_not_found_names_the_session_asked_for"],
    NotFoundNamesAnother: ["test_s7_not_found_names_the_session_asked_for"],
    LaxIds: ["test_s1_one_session_id_rule"],
    HidesCorruption: ["test_s8_undecodable_stored_data_is_corrupt_log",
                      "test_s8_newer_format_version_is_refused_with_upgrade_advice"],
    BrokenAfterClose: ["test_s7_close_twice_then_calls_work_or_raise_store_error"],
    LaxCursor: ["test_list_sessions_refuses_a_bad_limit_or_cursor"],
    KeepsWhatIsNew: ["test_s8_repeated_entry_id_refuses_the_whole_batch"],
}


class WrappedSuite(FileHooks):
    """The suite on a wrapped FileStore. Not collected (no ``Test`` prefix)."""

    variant: ClassVar[type[Wrapped]] = Wrapped

    async def make_store(self, tmp_path: Path) -> Store:
        return self.variant(FileStore(tmp_path / "sessions", durability="flush"))


async def _failure(suite: StoreConformance, test: str, tmp_path: Path) -> BaseException | None:
    """Run one suite test as pytest would; its failure, or None if it passed."""
    async with suite.running(tmp_path) as store:
        try:
            await getattr(suite, test)(store)
        except pytest.skip.Exception:
            raise
        except (Exception, pytest.fail.Exception) as exc:
            return exc
    return None


@pytest.mark.parametrize(
    ("variant", "test"), [(v, t) for v, tests in CAUGHT.items() for t in tests],
    ids=[f"{v.__name__}-{t}" for v, tests in CAUGHT.items() for t in tests])
async def test_the_suite_fails_a_store_that_breaks_the_rule(
    variant: type[Wrapped], test: str, tmp_path: Path
) -> None:
    suite = type(f"{variant.__name__}Suite", (WrappedSuite,), {"variant": variant})()
    assert await _failure(suite, test, tmp_path) is not None, (
        f"{variant.__name__} broke the rule {test} checks, and it passed")


@pytest.mark.parametrize("test", sorted({t for tests in CAUGHT.values() for t in tests}))
async def test_the_unbroken_wrapper_passes(test: str, tmp_path: Path) -> None:
    assert await _failure(WrappedSuite(), test, tmp_path) is None


async def test_the_process_test_fails_rather_than_skips_without_a_way_to_open(
    tmp_path: Path,
) -> None:
    class LocalSuite(WrappedSuite):  # defined in a function: a child cannot import it
        pass

    failure = await _failure(LocalSuite(), "test_s4_concurrent_appends_from_processes", tmp_path)
    assert isinstance(failure, pytest.fail.Exception)
    assert "module level" in str(failure) and "store_opener" in str(failure)
