"""The shipped conformance suite fails wrong stores, and is fair to right ones.

Each variant below wraps a real ``FileStore`` and breaks one rule of the
Store contract. The suite's own test methods are run on it, the way pytest
runs them for a store author, and the test that states the rule must fail.
The unbroken wrapper passes the same tests, so a failure means the rule,
not the wrapper. A store that declares a capability and lacks or misnames
its method fails every test of that capability; one that does not declare
it skips them, told which. Importing or running the suite leaves the
custom-entry registry as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from support.stores import FileHooks
from threadline.errors import ConfigError, CorruptLog, SessionExists, SessionNotFound, StoreError
from threadline.session import Entry, SessionRecord, custom_kinds
from threadline.stores import EntryLog, FileStore, SessionPage, Store
from threadline.testing import StoreConformance
from threadline.testing._conformance import Capability
from threadline.testing._conformance._catalog import CatalogTests
from threadline.testing._conformance._linear import LinearTests
from threadline.testing._conformance._processes import ProcessTests
from threadline.testing._conformance._watch import WatchTests

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


class Core:
    """Delegates the three methods of the Store protocol to a real FileStore."""

    declares: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries)


class Wrapped(Core):
    """Delegates the catalog too."""

    declares = frozenset({"catalog"})

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


class WatchEntries(Wrapped):
    """Declares watch, but names it ``watch_entries``."""

    declares = frozenset({"catalog", "watch"})

    def watch_entries(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        return self.inner.watch(session_id, after)


class LinearUnderOtherNames(Wrapped):
    """Declares linear, but names its append ``append_after_last``."""

    declares = frozenset({"catalog", "linear"})

    async def append_after_last(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        return await self.inner.append_linear(session_id, entries)

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        return await self.inner.load_entries_after(session_id, entry_id)


class CatalogWithoutListing(Core):
    """Declares catalog, but lists with ``list`` instead of ``list_sessions``."""

    declares = frozenset({"catalog"})

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self.inner.load_session(session_id)

    async def list(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        return await self.inner.list_sessions(limit=limit, cursor=cursor)

    async def delete_session(self, session_id: str) -> None:
        await self.inner.delete_session(session_id)

    async def close(self) -> None:
        await self.inner.close()


CAUGHT: dict[type[Core], list[str]] = {
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

# A store that declares a capability and lacks one of its methods: every test
# of the capability fails, naming the method (never a skip).
MISDECLARED: dict[type[Core], tuple[type, str]] = {
    WatchEntries: (WatchTests, "watch()"),
    LinearUnderOtherNames: (LinearTests, "append_linear()"),
    CatalogWithoutListing: (CatalogTests, "list_sessions()"),
}


class WrappedSuite(FileHooks):
    """The suite on a wrapped FileStore. Not collected (no ``Test`` prefix)."""

    variant: ClassVar[type[Core]] = Wrapped
    capabilities = Wrapped.declares

    async def make_store(self, tmp_path: Path) -> Store:
        return self.variant(FileStore(tmp_path / "sessions", durability="flush"))


def _suite(variant: type[Core], **attributes: Any) -> StoreConformance:
    attributes = {"variant": variant, "capabilities": variant.declares, **attributes}
    return type(f"{variant.__name__}Suite", (WrappedSuite,), attributes)()


async def _outcome(suite: StoreConformance, test: str, tmp_path: Path) -> BaseException | None:
    """Run one suite test as pytest would; how it failed or skipped, or None if it passed.

    A long test runs its sample (``scale``), as in a run without ``-m stress``.
    """
    method = getattr(suite, test)
    extra = {"scale": "sample"} if "scale" in inspect.signature(method).parameters else {}
    async with suite.running(tmp_path) as store:
        try:
            await method(store, **extra)
        except (Exception, pytest.fail.Exception, pytest.skip.Exception) as exc:
            return exc
    return None


def _tests_of(level: type) -> list[str]:
    return sorted(name for name in vars(level) if name.startswith("test_"))


@pytest.mark.parametrize(
    ("variant", "test"), [(v, t) for v, tests in CAUGHT.items() for t in tests],
    ids=[f"{v.__name__}-{t}" for v, tests in CAUGHT.items() for t in tests])
async def test_the_suite_fails_a_store_that_breaks_the_rule(
    variant: type[Core], test: str, tmp_path: Path
) -> None:
    outcome = await _outcome(_suite(variant), test, tmp_path)
    assert outcome is not None, f"{variant.__name__} broke the rule {test} checks, and it passed"
    assert not isinstance(outcome, pytest.skip.Exception), outcome


@pytest.mark.parametrize("test", sorted({t for tests in CAUGHT.values() for t in tests}))
async def test_the_unbroken_wrapper_passes(test: str, tmp_path: Path) -> None:
    assert await _outcome(WrappedSuite(), test, tmp_path) is None


@pytest.mark.parametrize(
    ("variant", "test"),
    [(v, t) for v, (level, _) in MISDECLARED.items()
     for t in [*_tests_of(level), "test_s7_declared_capabilities_are_offered"]],
    ids=[f"{v.__name__}-{t}" for v, (level, _) in MISDECLARED.items()
         for t in [*_tests_of(level), "test_s7_declared_capabilities_are_offered"]])
async def test_a_declared_capability_whose_method_is_misnamed_fails(
    variant: type[Core], test: str, tmp_path: Path
) -> None:
    outcome = await _outcome(_suite(variant), test, tmp_path)
    assert isinstance(outcome, pytest.fail.Exception), outcome
    assert MISDECLARED[variant][1] in str(outcome) and "declares" in str(outcome), outcome


@pytest.mark.parametrize(("level", "capability"), [
    (CatalogTests, "catalog"), (LinearTests, "linear"), (WatchTests, "watch"),
    (ProcessTests, "multi_process")])
async def test_an_undeclared_capability_skips_naming_it(
    level: type, capability: str, tmp_path: Path
) -> None:
    class CoreOnly(WrappedSuite):
        variant = Core
        capabilities = frozenset()

    for test in _tests_of(level):
        outcome = await _outcome(CoreOnly(), test, tmp_path / test)
        assert isinstance(outcome, pytest.skip.Exception), (test, outcome)
        assert f"does not declare the {capability!r} capability" in str(outcome), outcome


async def test_an_undeclared_capability_the_store_has_says_how_to_declare_it(
    tmp_path: Path,
) -> None:
    # A FileStore watches, but this suite declares only the catalog.
    class CatalogOnly(FileHooks):
        capabilities = frozenset({"catalog"})

        async def make_store(self, tmp_path: Path) -> Store:
            return FileStore(tmp_path / "sessions", durability="flush")

    outcome = await _outcome(CatalogOnly(), "test_s26_watch_catches_up_then_follows", tmp_path)
    assert isinstance(outcome, pytest.skip.Exception)
    assert "FileStore has watch: add 'watch' to capabilities" in str(outcome), outcome


async def test_an_unknown_capability_fails(tmp_path: Path) -> None:
    suite = _suite(Wrapped, capabilities=frozenset({"catalog", "watches"}))
    outcome = await _outcome(suite, "test_s7_declared_capabilities_are_offered", tmp_path)
    assert isinstance(outcome, pytest.fail.Exception)
    assert "'watches'" in str(outcome) and "'multi_process'" in str(outcome), outcome


async def test_multi_process_declared_for_unshared_handles_fails(tmp_path: Path) -> None:
    suite = _suite(Wrapped, capabilities=frozenset({"catalog", "multi_process"}),
                   shared_instances=False)
    for test in [*_tests_of(ProcessTests), "test_s7_declared_capabilities_are_offered"]:
        outcome = await _outcome(suite, test, tmp_path / test)
        assert isinstance(outcome, pytest.fail.Exception), (test, outcome)
        assert "shared_instances = False" in str(outcome), outcome


async def test_the_process_test_fails_rather_than_skips_without_a_way_to_open(
    tmp_path: Path,
) -> None:
    class LocalSuite(WrappedSuite):  # defined in a function: a child cannot import it
        capabilities = frozenset({"catalog", "multi_process"})

    failure = await _outcome(LocalSuite(), "test_s4_concurrent_appends_from_processes", tmp_path)
    assert isinstance(failure, pytest.fail.Exception)
    assert "module level" in str(failure) and "store_opener" in str(failure)


# -- the kill test (S14) catches a store that is not all or nothing -------------------


class OneEntryAtATime(FileStore):
    """A wrong store: one write per entry, so a kill can leave part of a call."""

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        for entry in entries:
            await super().append_entries(session_id, [entry])


class OneEntryAtATimeSuite(StoreConformance):
    """At module level, so the kill test's children can open its store."""

    capabilities = frozenset({"multi_process"})

    async def make_store(self, tmp_path: Path) -> Store:
        return OneEntryAtATime(tmp_path, durability="flush")


async def test_s14_the_kill_test_fails_a_store_that_writes_entry_by_entry(
    tmp_path: Path,
) -> None:
    failure = await _outcome(OneEntryAtATimeSuite(),
                             "test_s14_batch_cut_by_sigkill_is_whole_or_absent", tmp_path)
    assert isinstance(failure, AssertionError), failure
    assert "entries of one append_entries call stored" in str(failure)


# -- the suite leaves the one global alone, and marks its long tests ------------------


def test_importing_the_suite_registers_no_custom_kind() -> None:
    # A fresh interpreter: in this one, other test modules have registered kinds.
    code = ("from threadline.session import custom_kinds\n"
            "before = custom_kinds()\n"
            "import threadline.testing\n"
            "from threadline.testing import StoreConformance, sample_entries\n"
            "sample_entries()\n"
            "assert custom_kinds() == before, custom_kinds()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_test_that_needs_the_suite_s_kind_registers_it_only_while_it_runs(
    tmp_path: Path,
) -> None:
    before = custom_kinds()
    for test in ("test_s8_round_trip_every_entry_kind",
                 "test_s15_foreign_lines_come_back_byte_for_byte"):
        assert await _outcome(WrappedSuite(), test, tmp_path / test) is None
        assert custom_kinds() == before


def test_the_long_tests_run_a_sample_and_a_stress_run() -> None:
    def stress_run(test: object) -> bool:
        return any(m.name == "stress" for mark in getattr(test, "pytestmark", [])
                   if mark.name == "parametrize" for param in mark.args[1]
                   for m in getattr(param, "marks", ()))

    marked = {name for name in dir(StoreConformance)
              if name.startswith("test_") and stress_run(getattr(StoreConformance, name))}
    assert marked == {"test_s4_concurrent_appends_from_processes",
                      "test_s14_batch_cut_by_sigkill_is_whole_or_absent",
                      "test_s26_three_watchers_see_every_append_once_in_order"}
    ini = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert any(line.startswith("stress:") for line in ini["markers"])
