"""MemoryStore: the conformance suite plus what is particular to memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from threadline.ai._messages import ToolResultMessage, UserMessage
from threadline.errors import DurabilityError, StoreError
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import MemoryStore, Store
from threadline.testing import FaultyStore, StoreConformance


def _msg(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage.of(text))


class TestMemoryStore(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "search"})
    shared_instances = False

    async def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        assert isinstance(store, MemoryStore)
        store._logs[session_id].append(data)


async def test_stored_entries_are_bytes_not_caller_objects() -> None:
    # Frozen structs can still hold dicts; the store must not share them.
    store = MemoryStore()
    await store.create_session(SessionRecord(id="s"))
    entry = MessageEntry(message=ToolResultMessage(tool_call_id="c", tool_name="t",
                                                   details={"k": 1}))
    await store.append_entries("s", [entry])
    (loaded,) = await store.load_entries("s")
    assert loaded == entry and loaded is not entry


async def test_faulty_store_fails_the_chosen_append_before_storing() -> None:
    inner = MemoryStore()
    store = FaultyStore(inner, fail_append_on=2)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("1")])
    with pytest.raises(StoreError, match="injected fault"):
        await store.append_entries("s", [_msg("2")])
    await store.append_entries("s", [_msg("3")])
    assert [e.message.text for e in await inner.load_entries("s")  # type: ignore[union-attr]
            ] == ["1", "3"]
    assert store.append_calls == 3
    assert await store.load_session("s") == await inner.load_session("s")  # passes through


async def test_faulty_store_after_mode_stores_then_raises_the_given_error() -> None:
    inner = MemoryStore()
    boom = DurabilityError("disk on fire", session_id="s")
    store = FaultyStore(inner, fail_append_on={1}, fail_create_on=2, fail_load_on=1,
                        error=boom, when="after")
    await store.create_session(SessionRecord(id="s"))
    with pytest.raises(DurabilityError):
        await store.append_entries("s", [_msg("1")])
    assert len(await inner.load_entries("s")) == 1
    with pytest.raises(DurabilityError):
        await store.create_session(SessionRecord(id="t"))
    await inner.load_session("t")  # "after": the create did happen
    with pytest.raises(DurabilityError):
        await store.load_entries("s")
    assert len(await store.load_entries("s")) == 1


async def test_repeated_entry_id_is_refused_like_the_sql_stores() -> None:
    store = MemoryStore()
    await store.create_session(SessionRecord(id="s"))
    first = _msg("a")
    await store.append_entries("s", [first])
    for batch in ([_msg("b"), first], [(twice := _msg("c")), twice]):
        with pytest.raises(StoreError, match="'s' repeats an entry id"):
            await store.append_entries("s", batch)
    await store.append_entries("s", [first])  # S25: the same batch again is a retry
    assert await store.load_entries("s") == [first]
    await store.delete_session("s")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [first])  # a deleted session's ids are forgotten
