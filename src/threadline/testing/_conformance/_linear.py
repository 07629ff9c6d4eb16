"""The linear level: appends chained after the last entry, and reads after an entry (S32).

For a store that declares the "linear" capability (``LinearStore``).
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import (
    ConfigError,
    EntryNotFound,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
)
from threadline.session._entries import MessageEntry
from threadline.session._tree import TreeIndex
from threadline.stores._contract import Store
from threadline.testing._conformance._base import SuiteBase
from threadline.testing._conformance._data import assert_same_entries, chain_entry
from threadline.testing._conformance._probes import (
    BAD_ENTRY_IDS,
    BAD_SESSION_IDS,
    Probes,
    session_with_one_entry,
)

__all__ = ["LinearTests"]


class LinearTests(SuiteBase):
    """Tests of ``append_linear`` and ``load_entries_after``."""

    async def test_s32_linear_append_chains_after_the_last_entry(self, store: Store) -> None:
        linear = self.linear(store)
        sid = await self.new_session(store)
        (first,) = await linear.append_linear(sid, [chain_entry("not-there", 0, 0)])
        assert first.parent_id is None  # an empty log: the batch starts a root
        root, side = chain_entry(None, 1, 0), chain_entry(None, 1, 1)
        await store.append_entries(sid, [root, side])  # the last entry is a second root
        batch = [chain_entry(root.id, 2, 0)]
        batch.append(chain_entry(batch[0].id, 2, 1))
        stored = await linear.append_linear(sid, batch)
        assert [e.parent_id for e in stored] == [side.id, batch[0].id]
        loaded = await (await self.another_handle()).load_entries(sid)
        assert list(loaded) == [first, root, side, *stored]
        with pytest.raises(SessionNotFound):
            await linear.append_linear("conf-missing", batch)
        # The duplicate-id rule of append_entries: refused whole, nothing stored.
        fresh = chain_entry(None, 3, 0)
        for repeating in ([fresh, batch[1]], [fresh, fresh]):
            with pytest.raises(StoreError) as caught:
                await linear.append_linear(sid, repeating)
            assert caught.value.session_id == sid
        assert list(await (await self.another_handle()).load_entries(sid)) == list(loaded)

    async def test_s32_retried_linear_batch_is_stored_once(self, store: Store) -> None:
        # S25 for append_linear: the first write re-chained the batch after the
        # last entry; a retry (the acknowledgement was lost) finds every id
        # stored as one run with its bytes, the first entry's parent apart.
        linear = self.linear(store)
        sid = await self.new_session(store)
        root = chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        batch = [chain_entry("unknown-parent", 1, 0)]
        batch.append(chain_entry(batch[0].id, 1, 1))
        stored = await linear.append_linear(sid, batch)
        assert stored[0].parent_id == root.id
        other = self.linear(await self.another_handle())
        assert await other.append_linear(sid, batch) == stored
        assert await linear.append_linear(sid, batch) == stored
        assert list(await store.load_entries(sid)) == [root, *stored]
        # Later entries do not make it a new batch: still the same run.
        later = await linear.append_linear(sid, [chain_entry(None, 2, 0)])
        assert await other.append_linear(sid, batch) == stored
        # Any other repeat is refused whole: a changed entry, a part of the
        # batch with a new id, the run in another order.
        changed = [batch[0], MessageEntry(id=batch[1].id, parent_id=batch[0].id,
                                          message=UserMessage.of("changed"))]
        for repeating in (changed, [*batch, chain_entry(batch[1].id, 3, 0)],
                          [batch[1], batch[0]]):
            with pytest.raises(StoreError) as caught:
                await linear.append_linear(sid, repeating)
            assert caught.value.session_id == sid
        assert list(await (await self.another_handle()).load_entries(sid)) == [
            root, *stored, *later]

    async def test_s32_concurrent_linear_appends_form_one_path(self, store: Store) -> None:
        sid = await self.new_session(store)
        handles = [self.linear(store)] + [
            self.linear(await self.another_handle()) for _ in range(3)]

        async def writer(w: int) -> None:
            for n in range(10):
                first = chain_entry(None, w, 2 * n)
                await handles[w % len(handles)].append_linear(
                    sid, [first, chain_entry(first.id, w, 2 * n + 1)])

        await asyncio.gather(*(writer(w) for w in range(6)))
        tree = TreeIndex(await store.load_entries(sid), session_id=sid)
        assert len(tree.leaves()) == 1 and len(tree.path()) == len(tree) == 120
        texts = [e.message.text for e in tree.path() if isinstance(e, MessageEntry)
                 and isinstance(e.message, UserMessage)]
        for w in range(6):  # each writer's entries in its order, each batch unbroken
            mine = [i for i, t in enumerate(texts) if t.startswith(f"writer {w} ")]
            assert [int(texts[i].split()[3]) for i in mine] == list(range(20))
            assert all(b - a == 1 for a, b in zip(mine[::2], mine[1::2], strict=True))

    async def test_s32_load_entries_after(self, store: Store) -> None:
        linear = self.linear(store)
        sid = await self.new_session(store)
        assert await linear.load_entries_after(sid, None) == []
        entries = [chain_entry(None, 0, 0)]
        for n in range(1, 5):
            entries.append(chain_entry(entries[-1].id, 0, n))
        await store.append_entries(sid, entries)
        reader = self.linear(await self.another_handle())
        assert await reader.load_entries_after(sid, None) == entries
        assert await reader.load_entries_after(sid, entries[1].id) == entries[2:]
        assert await reader.load_entries_after(sid, entries[-1].id) == []
        with pytest.raises(EntryNotFound):
            await reader.load_entries_after(sid, "conf-no-such-entry")
        with pytest.raises(SessionNotFound):
            await reader.load_entries_after("conf-missing", None)

    async def test_s32_linear_methods_refuse_odd_arguments(self, store: Store) -> None:
        linear = self.linear(store)
        sid, kept = await session_with_one_entry(self, store)
        entry = chain_entry(None, 0, 1)
        probes = Probes()
        for bad in BAD_SESSION_IDS:
            await probes.expect(InvalidSessionId, f"append_linear({bad!r}, [entry])",
                                functools.partial(linear.append_linear, bad, [entry]))
            await probes.expect(InvalidSessionId, f"load_entries_after({bad!r}, None)",
                                functools.partial(linear.load_entries_after, bad, None))
        for bad in BAD_ENTRY_IDS:
            await probes.expect(ConfigError, f"load_entries_after({sid!r}, {bad!r:.40})",
                                functools.partial(linear.load_entries_after, sid, bad))
        await probes.entries(linear.append_linear, "append_linear", sid, entry)
        probes.check(store)
        assert_same_entries(await store.load_entries(sid), kept)
