"""S31-S33: a durable branch, one linear history for many writers, any thread and loop.

Every test runs on all four built-in stores: real files, a real SQLite file
and the real PostgreSQL server. Other writers are other agents, other
threads with their own event loops, and child processes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.stores import StoreSpec, assert_one_order, close, race, run_threads
from threadline import durable
from threadline.ai import UserMessage
from threadline.errors import ConfigError, EntryNotFound, StoreError
from threadline.session import BranchSummaryEntry, CustomEntry, Entry, MessageEntry, SessionRecord
from threadline.stores import FileStore, MemoryStore, Store
from threadline.testing import FaultyStore


def texts(entries: list[Entry]) -> list[str]:
    return [e.message.text for e in entries
            if isinstance(e, MessageEntry) and isinstance(e.message, UserMessage)]


CHILD = """
import asyncio, sys
sys.path.insert(0, {root!r})
from support.stores import StoreSpec, close
from threadline import durable
from threadline.ai import UserMessage

async def main():
    store_spec = StoreSpec(*sys.argv[2:5])
    store = store_spec.open()
    agent = await durable.open(None, store=store, session_id=sys.argv[1], repair=False)
    {body}
    await close(store)

asyncio.run(main())
"""


def run_child(store_spec: StoreSpec, session_id: str, body: str) -> str:
    root = str(Path(__file__).resolve().parent)
    code = CHILD.format(root=root, body=body)
    done = subprocess.run([sys.executable, "-c", code, session_id, *store_spec.as_argv()],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_s31_durable_branch_survives_reopen_in_another_process(
    shared_store_spec: StoreSpec,
) -> None:
    store_spec = shared_store_spec
    store = store_spec.open()
    agent = await durable.open(None, store=store, session_id="s31")
    first, _, _ = await agent.append(UserMessage.of("a"), UserMessage.of("b"),
                                     UserMessage.of("c"))
    (marker,) = await agent.branch_to(first.id)
    assert isinstance(marker, BranchSummaryEntry) and marker.parent_id == first.id
    out = run_child(store_spec, "s31", "print([m.text for m in agent.messages()], "
                                 "type(agent.leaf).__name__)")
    assert out.split() == ["['a']", "BranchSummaryEntry"]
    # What the child appends continues from the moved leaf; b and c stay in the log.
    run_child(store_spec, "s31", "await agent.append(UserMessage.of('d'))")
    again = await durable.open(None, store=store, session_id="s31")
    assert [m.text for m in again.messages()] == ["a", "d"]  # type: ignore[union-attr]
    assert texts(again.entries) == ["a", "b", "c", "d"]
    await close(store)


async def test_s31_branch_to_none_clears_and_the_next_append_is_atomic_with_it(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.open()
    agent = await durable.open(None, store=store, session_id="s31-clear")
    await agent.append(UserMessage.of("a"), UserMessage.of("b"))
    marker, new = await agent.branch_to(None, UserMessage.of("fresh"))
    assert marker.parent_id is None and new.parent_id == marker.id
    reopened = await durable.open(None, store=store, session_id="s31-clear")
    assert [m.text for m in reopened.messages()] == ["fresh"]  # type: ignore[union-attr]
    assert len(reopened.entries) == 4  # nothing erased
    await close(store)


async def test_s31_failed_branch_writes_nothing_and_keeps_the_leaf() -> None:
    faulty = FaultyStore(MemoryStore(), fail_append_on=2)
    agent = await durable.open(None, store=faulty, session_id="s31-fail")
    first, second = await agent.append(UserMessage.of("a"), UserMessage.of("b"))
    with pytest.raises(StoreError):
        await agent.branch_to(first.id, UserMessage.of("c"))
    assert agent.leaf_id == second.id
    reopened = await durable.open(None, store=faulty, session_id="s31-fail")
    assert [e.id for e in reopened.entries] == [first.id, second.id]
    with pytest.raises(EntryNotFound):
        await agent.branch_to("no-such-entry")


async def test_s31_branch_summary_reaches_the_model_only_when_set() -> None:
    heard: list[object] = []
    agent = await durable.open(None, store=MemoryStore(), session_id="s31-summary",
                               publisher=heard.append)
    (first,) = await agent.append(UserMessage.of("a"))
    await agent.branch_to(first.id)
    assert len(agent.messages()) == 1
    assert [type(e).__name__ for e in heard] == ["SessionCreated", "SessionBranched"]
    assert heard[-1].to_id == first.id  # type: ignore[attr-defined]
    await agent.branch_to(first.id, summary="tried X, it failed")
    assert "tried X, it failed" in agent.messages()[-1].text  # type: ignore[union-attr]


async def test_s32_linear_append_puts_every_writer_on_one_path(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    a = await durable.open(None, store=store, session_id="s32")
    b = await durable.open(None, store=store_spec.open(), session_id="s32")
    for n in range(3):
        await a.append_linear(UserMessage.of(f"a{n}"))
        await b.append_linear(UserMessage.of(f"b{n}"))
    expected = ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert texts(b.path()) == expected
    await a.refresh()
    assert texts(a.path()) == expected
    reopened = await durable.open(None, store=store, session_id="s32")
    assert texts(reopened.path()) == expected and len(reopened.tree.leaves()) == 1
    # The default stays S4: plain appends from stale leaves grow siblings.
    await a.append(UserMessage.of("x"))
    await b.branch_to(b.path()[-2].id)
    assert len((await durable.open(None, store=store, session_id="s32")).tree.leaves()) == 2
    await close(store)


async def test_s32_refresh_reads_only_new_entries(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    reader = await durable.open(None, store=store, session_id="s32-refresh")
    writer = await durable.open(None, store=store_spec.open(), session_id="s32-refresh")
    assert await reader.refresh() == []
    await writer.append(*(UserMessage.of(str(n)) for n in range(5)))
    counting = FaultyStore(store)
    reader._store = counting  # count full loads from here on
    new = await reader.refresh()
    assert texts(new) == ["0", "1", "2", "3", "4"] and counting.load_calls == 0
    assert reader.leaf_id == new[-1].id
    assert await reader.refresh() == []
    with pytest.raises(EntryNotFound):
        await store.load_entries_after("s32-refresh", "missing")  # type: ignore[attr-defined]
    await close(store)


async def test_s32_linear_needs_the_capability() -> None:
    class Plain:
        def __init__(self) -> None:
            self.inner = MemoryStore()

        async def create_session(self, record):  # type: ignore[no-untyped-def]
            await self.inner.create_session(record)

        async def load_entries(self, session_id):  # type: ignore[no-untyped-def]
            return await self.inner.load_entries(session_id)

        async def append_entries(self, session_id, entries):  # type: ignore[no-untyped-def]
            await self.inner.append_entries(session_id, entries)

    plain: Store = Plain()
    agent = await durable.open(None, store=plain, session_id="plain")
    with pytest.raises(ConfigError, match="LinearStore"):
        await agent.append_linear(UserMessage.of("a"))
    other = await durable.open(None, store=plain, session_id="plain")
    await other.append(UserMessage.of("b"))
    assert texts(await agent.refresh()) == ["b"]  # refresh falls back to a full load


def test_s32_threads_and_processes_append_linear_at_once(store_spec: StoreSpec) -> None:
    """5 threads with their own loops and store objects, and 2 processes: one path."""
    async def setup() -> None:
        store = store_spec.open()
        await durable.open(None, store=store, session_id="s32-many")
        await close(store)

    asyncio.run(setup())
    async def body(store: Store, t: int) -> None:
        agent = await durable.open(None, store=store, session_id="s32-many")
        for n in range(10):
            await agent.append_linear(UserMessage.of(f"t{t}-{n}"))

    procs = 0 if store_spec.kind == "memory" else 2
    race(store_spec, body, threads=5, children=[[sys.executable, "-c", CHILD.format(
        root=str(Path(__file__).resolve().parent),
        body=f"for n in range(10): await agent.append_linear(UserMessage.of('p{p}-' + str(n)))",
    ), "s32-many", *store_spec.as_argv()] for p in range(procs)])

    async def check() -> list[str]:
        store = store_spec.open()
        agent = await durable.open(None, store=store, session_id="s32-many")
        assert len(agent.tree.leaves()) == 1
        path = texts(agent.path())
        await close(store)
        return path

    writers = [f"t{t}" for t in range(5)] + [f"p{p}" for p in range(procs)]
    assert_one_order(asyncio.run(check()), writers, 10)


def test_s33_one_agent_from_many_threads_each_with_its_own_loop(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    agent = asyncio.run(durable.open(None, store=store, session_id="s33"))
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for n in range(10):
                asyncio.run(agent.append(UserMessage.of(f"t{t}-{n}")))
        except BaseException as exc:
            errors.append(exc)

    run_threads(worker, 5)
    assert not errors, errors
    assert len(texts(agent.path())) == 50

    async def reopen() -> None:
        again = await durable.open(None, store=store, session_id="s33")
        assert [e.id for e in again.path()] == [e.id for e in agent.path()]
        await close(store)

    asyncio.run(reopen())


async def test_s32_file_store_reads_back_only_as_far_as_it_must(tmp_path: Path) -> None:
    # The entry sits more than one read chunk back, and a later entry's data
    # mentions its id the way a header would: neither may mislead the reader.
    store = FileStore(tmp_path)
    agent = await durable.open(None, store=store, session_id="s32-far")
    (target,) = await agent.append(UserMessage.of("target"))
    await agent.append(*(UserMessage.of("x" * 1000) for _ in range(200)),
                       CustomEntry(kind="note", data={"id": target.id}))
    after = await store.load_entries_after("s32-far", target.id)
    assert len(after) == 201 and isinstance(after[-1], CustomEntry)
    assert [e.id for e in after] == [e.id for e in agent.entries[1:]]
    assert await store.load_entries_after("s32-far", agent.entries[-1].id) == []
    with pytest.raises(EntryNotFound):
        await store.load_entries_after("s32-far", "01-not-there")


def test_s33_lock_serves_waiters_from_other_loops_in_order_and_survives_cancellation() -> None:
    from threadline.durable._lock import AnyLoopLock

    lock = AnyLoopLock()
    order: list[str] = []
    held = threading.Event()
    release = threading.Event()

    async def holder() -> None:
        async with lock:
            held.set()
            await asyncio.to_thread(release.wait)
            order.append("holder")

    async def waiter(name: str, started: threading.Event) -> None:
        task = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)  # queued behind the holder
        started.set()
        await task
        order.append(name)
        lock.release()

    async def cancelled(started: threading.Event) -> None:
        task = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)
        started.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    first, second, third = threading.Event(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=asyncio.run, args=(holder(),))]
    threads[0].start()
    held.wait(30)
    for coro, started in ((waiter("a", first), first), (cancelled(second), second),
                          (waiter("b", third), third)):
        threads.append(threading.Thread(target=asyncio.run, args=(coro,)))
        threads[-1].start()
        assert started.wait(30)
    release.set()
    for th in threads:
        th.join(30)
    assert order == ["holder", "a", "b"] and not lock.locked()


async def test_s33_a_pool_passed_in_is_refused_from_another_loop(pg_url: str,
                                                                  pg_schema: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    from threadline.stores import PostgresStore

    async with AsyncConnectionPool(pg_url, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as pool:
        store = PostgresStore(pool, schema=pg_schema)
        await store.create_session(SessionRecord(id="mine"))

        def elsewhere() -> BaseException | None:
            try:
                asyncio.run(store.load_entries("mine"))
            except StoreError as exc:
                return exc
            return None

        error = await asyncio.to_thread(elsewhere)
        assert error is not None and "another event loop" in str(error)
        assert await store.load_entries("mine") == []
