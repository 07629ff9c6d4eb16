"""The watch level: following a session as any handle or process appends (S26).

For a store that declares the "watch" capability (``WatchableStore``).
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import ConfigError, InvalidSessionId, SessionNotFound, StoreError
from threadline.session._entries import MessageEntry
from threadline.session._ids import new_id
from threadline.stores._contract import Store, WatchableStore
from threadline.testing._conformance._base import SuiteBase, sample_and_stress
from threadline.testing._conformance._children import (
    aclose,
    append_batches,
    process_append_batches,
)
from threadline.testing._conformance._data import assert_same_entries, chain_entry
from threadline.testing._conformance._probes import (
    BAD_ENTRY_IDS,
    BAD_SESSION_IDS,
    Probes,
    first_entry,
    session_with_one_entry,
)

__all__ = ["WatchTests", "watch_ids"]


async def watch_ids(store: WatchableStore, session_id: str, count: int, after: str | None = None,
                    stop_after: int | None = None) -> list[str]:
    """Ids ``watch`` yields until ``count`` arrived (or ``stop_after``, then it disconnects)."""
    ids: list[str] = []
    watch = store.watch(session_id, after)
    try:
        async for entry in watch:
            ids.append(entry.id)
            if len(ids) in (count, stop_after):
                break
    finally:
        await aclose(watch)
    return ids


class WatchTests(SuiteBase):
    """Tests of ``watch``."""

    async def test_s26_watch_catches_up_then_follows(self, store: Store) -> None:
        watchable = self.watchable(store)
        sid = await self.new_session(store)
        first = [chain_entry(None, 0, n) for n in range(3)]
        await store.append_entries(sid, first)
        watch = watchable.watch(sid)
        got = [await anext(watch) for _ in range(3)]
        later = [chain_entry(first[-1].id, 1, n) for n in range(2)]
        await (await self.another_handle()).append_entries(sid, later)
        got += [await anext(watch) for _ in range(2)]
        await aclose(watch)
        assert_same_entries(got, first + later)
        # Resuming after an entry starts right behind it; after the last, with nothing.
        assert await watch_ids(watchable, sid, 3, after=first[1].id) == [
            e.id for e in [first[2], *later]]
        tail = watchable.watch(sid, after=later[-1].id)
        pending = asyncio.ensure_future(anext(tail))
        await asyncio.sleep(0)
        assert not pending.done()
        extra = chain_entry(later[-1].id, 2, 0)
        await store.append_entries(sid, [extra])
        assert (await pending).id == extra.id
        await aclose(tail)

    async def test_s26_watch_unknown_session_or_entry_is_an_error(self, store: Store) -> None:
        watchable = self.watchable(store)
        with pytest.raises(SessionNotFound):
            await anext(watchable.watch("conf-no-such-session"))
        sid = await self.new_session(store)
        await store.append_entries(sid, [chain_entry(None, 0, 0)])
        with pytest.raises(StoreError) as info:
            await anext(watchable.watch(sid, after=new_id()))
        assert info.value.session_id == sid and "no such entry" in str(info.value)

    @sample_and_stress
    async def test_s26_three_watchers_see_every_append_once_in_order(
        self, store: Store, scale: str
    ) -> None:
        # One writer (another process when the store can be opened there)
        # appends while three watchers follow; the third disconnects part way
        # and resumes, on a new handle, after the last id it got.
        watchable = self.watchable(store)
        opener = self.child_opener() if self.offers("multi_process") else None
        count = self.scaled(scale, self.watch_appends)
        sid = await self.new_session(store)
        resumed_handle = self.watchable(await self.another_handle())

        async def resuming() -> list[str]:
            ids = await watch_ids(watchable, sid, count, stop_after=count // 3)
            return ids + await watch_ids(resumed_handle, sid, count - len(ids), after=ids[-1])

        other = self.watchable(await self.another_handle())
        watchers = [asyncio.ensure_future(watch_ids(watchable, sid, count)),
                    asyncio.ensure_future(watch_ids(other, sid, count)),
                    asyncio.ensure_future(resuming())]
        if opener is not None:
            loop = asyncio.get_running_loop()
            with self.process_pool(1) as pool:
                appended = await loop.run_in_executor(
                    pool, process_append_batches, opener, sid, count)
        else:
            appended = await append_batches(await self.another_handle(), sid, count)
        # A watcher that skipped an entry would wait forever: give up, loudly.
        done, _ = await asyncio.wait(watchers, timeout=120)
        assert len(done) == 3, "a watcher did not receive every entry"
        assert [e.id for e in await store.load_entries(sid)] == appended
        for watcher in watchers:
            assert watcher.result() == appended

    async def test_s26_watch_delivers_entries_of_several_mebibytes(self, store: Store) -> None:
        watchable = self.watchable(store)
        sid = await self.new_session(store)
        big = MessageEntry(message=UserMessage.of("b" * (5 << 20)))
        small = chain_entry(big.id, 0, 1)
        await store.append_entries(sid, [big, small])
        watch = watchable.watch(sid)
        got = [await anext(watch), await anext(watch)]
        await aclose(watch)
        assert_same_entries(got, [big, small])

    async def test_s26_watch_refuses_odd_arguments(self, store: Store) -> None:
        watchable = self.watchable(store)
        # One entry stored: a watch that wrongly takes a bad ``after`` for None
        # yields it instead of waiting.
        sid, _ = await session_with_one_entry(self, store)
        probes = Probes()
        for bad in BAD_SESSION_IDS:
            await probes.expect(InvalidSessionId, f"watch({bad!r})",
                                functools.partial(first_entry, watchable.watch, bad))
        for bad in BAD_ENTRY_IDS:
            await probes.expect(ConfigError, f"watch({sid!r}, after={bad!r:.40})",
                                functools.partial(first_entry, watchable.watch, sid, bad))
        probes.check(store)
