"""What a store's test class declares, and the plumbing every conformance test uses.

A test class says which optional capabilities its store offers
(``capabilities``); the tests of a declared capability always run, and fail,
naming the method, when the store lacks it. The tests of a capability that
is not declared skip, naming it.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import pickle
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import ClassVar, Literal, cast, get_args

import pytest
import pytest_asyncio

from threadline.session._entries import SessionRecord
from threadline.session._ids import new_id
from threadline.stores._contract import CatalogStore, LinearStore, Store, WatchableStore
from threadline.testing._conformance._children import StoreOpener, close

__all__ = ["CAPABILITY_METHODS", "Capability", "SuiteBase", "sample_and_stress"]

Capability = Literal["catalog", "linear", "watch", "blobs", "search", "multi_process"]
"""An optional part of the contract a store may offer (core is always tested)."""

CAPABILITY_METHODS: dict[str, tuple[str, ...]] = {
    "catalog": ("load_session", "list_sessions", "delete_session", "close"),
    "linear": ("append_linear", "load_entries_after"),
    "watch": ("watch",),
    "blobs": ("put_blob", "get_blob", "has_blobs", "list_blobs", "delete_blobs"),
    "search": ("search",),
    # Several processes on the same storage: a way to open it in a child.
    "multi_process": (),
}
assert set(CAPABILITY_METHODS) == set(get_args(Capability))

sample_and_stress = pytest.mark.parametrize(
    "scale", ["sample", pytest.param("stress", marks=pytest.mark.stress)])
"""A long test twice: its sample in every run, ``stress_scale`` times as much
under ``-m stress``."""


async def open_with_suite(suite: type[SuiteBase], tmp_path: Path) -> Store:
    """What a child runs to open the storage by default: the suite's own ``make_store``."""
    return await suite().make_store(tmp_path)


class SuiteBase:
    """The hooks a store's test class sets or overrides; see ``StoreConformance``."""

    capabilities: ClassVar[AbstractSet[Capability]] = frozenset()
    """The optional capabilities the store offers: "catalog", "linear", "watch",
    "blobs", "multi_process". Only the tests of these run (besides the core)."""

    shared_instances: ClassVar[bool] = True
    """False when two ``make_store`` calls cannot see each other's data."""

    process_count: ClassVar[int] = 4
    process_appends: ClassVar[int] = 50
    kill_rounds: ClassVar[int] = 10
    kill_batch: ClassVar[int] = 1_000

    watch_appends: ClassVar[int] = 10_000
    """Entries appended while three watchers follow (stores that can watch)."""

    stress_scale: ClassVar[int] = 5
    """How many times the sample the ``stress`` runs of the long tests do:
    kill rounds, appends per process, watched appends."""

    async def make_store(self, tmp_path: Path) -> Store:
        raise NotImplementedError("subclasses of StoreConformance implement make_store")

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        """How a child process opens the storage; by default ``make_store`` in the child.

        Return ``None`` only for a store whose data cannot be shared between
        processes (then also set ``shared_instances = False``).
        """
        if not self.shared_instances:
            return None
        return functools.partial(open_with_suite, type(self), tmp_path)

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        """Hook: store ``data`` as the session's next entry, bypassing every check."""
        pytest.skip(f"{type(self).__name__} has no write_stored hook")

    async def write_format_version(self, store: Store, session_id: str, version: int) -> None:
        """Hook: mark the session as written by format ``version``."""
        pytest.skip(f"{type(self).__name__} has no write_format_version hook "
                    f"(a store without a per-session format version needs none)")

    # -- capabilities ---------------------------------------------------------

    def declared(self) -> frozenset[Capability]:
        """The declared capabilities; an unknown name fails the test that asks."""
        names = frozenset(self.capabilities)
        unknown = sorted(names - set(CAPABILITY_METHODS))
        if unknown or isinstance(self.capabilities, str):
            pytest.fail(f"{type(self).__name__}.capabilities = {self.capabilities!r}: not a set "
                        f"of {', '.join(map(repr, CAPABILITY_METHODS))}")
        return names

    def offers(self, capability: Capability) -> bool:
        return capability in self.declared()

    def require(self, store: Store, capability: Capability) -> None:
        """Skip unless ``capability`` is declared; fail if the store lacks one of its methods."""
        methods = CAPABILITY_METHODS[capability]
        has = [name for name in methods if callable(getattr(store, name, None))]
        name = type(self).__name__
        if not self.offers(capability):
            hint = (f"; {type(store).__name__} has {', '.join(has)}: add {capability!r} to "
                    f"capabilities to test it" if has == list(methods) else "")
            pytest.skip(f"{name} does not declare the {capability!r} capability{hint}")
        missing = [m for m in methods if m not in has]
        if missing:
            pytest.fail(f"{name} declares the {capability!r} capability, but "
                        f"{type(store).__name__} has no {', '.join(f'{m}()' for m in missing)} "
                        f"(the capability is {', '.join(f'{m}()' for m in methods)})")

    def catalog(self, store: Store) -> CatalogStore:
        self.require(store, "catalog")
        return cast(CatalogStore, store)

    def linear(self, store: Store) -> LinearStore:
        self.require(store, "linear")
        return cast(LinearStore, store)

    def watchable(self, store: Store) -> WatchableStore:
        self.require(store, "watch")
        return cast(WatchableStore, store)

    def child_opener(self) -> StoreOpener:
        """The way a child opens the storage (``multi_process``), checked to travel."""
        name = type(self).__name__
        if not self.offers("multi_process"):
            pytest.skip(f"{name} does not declare the 'multi_process' capability")
        if not self.shared_instances:
            pytest.fail(f"{name} declares 'multi_process' but sets shared_instances = False: "
                        f"processes can only share a store whose handles share data")
        opener = self.store_opener(self._tmp_path)
        if opener is None:
            pytest.fail(f"{name} declares 'multi_process' but store_opener() returned None: "
                        f"return a picklable way to open the store")
        try:
            pickle.dumps(opener)
        except Exception as exc:
            pytest.fail(
                f"cannot send {name}'s store opener to a child process "
                f"({type(exc).__name__}: {exc}). Define the test class at module level, or "
                f"override store_opener(tmp_path) to return e.g. "
                f"functools.partial(MyStore, str(tmp_path / 'db'))")
        return opener

    def scaled(self, scale: str, count: int) -> int:
        """``count`` for the sample run, ``stress_scale`` times it for the stress run."""
        return count * self.stress_scale if scale == "stress" else count

    def process_pool(self, n: int) -> ProcessPoolExecutor:
        # spawn: the parent runs an event loop and threads, which fork would copy.
        return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))

    # -- plumbing -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, tmp_path: Path) -> AsyncIterator[Store]:
        """What the ``store`` fixture does: a fresh store, every handle closed after.

        Also the way to run one test of the suite by hand::

            async with suite.running(tmp_path) as store:
                await suite.test_s8_append_order_is_kept(store)
        """
        self._tmp_path = tmp_path
        self._handles: list[Store] = []
        main = await self.make_store(tmp_path)
        self._handles.append(main)
        self._main = main
        try:
            yield main
        finally:
            for handle in reversed(self._handles):
                await close(handle)

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        async with self.running(tmp_path) as main:
            yield main

    async def another_handle(self) -> Store:
        """A second handle on the same data (the same object if not shared)."""
        if not self.shared_instances:
            return self._main
        handle = await self.make_store(self._tmp_path)
        self._handles.append(handle)
        return handle

    async def new_session(self, store: Store, session_id: str | None = None) -> str:
        session_id = session_id or f"conf-{new_id()}"
        await store.create_session(SessionRecord(id=session_id))
        return session_id
