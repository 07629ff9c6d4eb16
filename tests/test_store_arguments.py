"""Odd arguments to the local stores' public methods: one typed error each, nothing touched.

Every method checks a session id with ``check_session_id`` (``InvalidSessionId``),
an ``after`` / ``entry_id`` with ``check_entry_id`` (``ConfigError``) and a
batch with ``check_entries`` (``ConfigError``) before it reads or writes
anything, on a store that has loaded the session too (a store that keeps
something per session must not look the argument up first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import ConfigError, InvalidSessionId
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, MemoryStore, SQLiteStore

BAD_SESSION_IDS: list[Any] = ["", ["x"], 1, None, "\ud800", "a\x00b", "x" * 1025]
BAD_ENTRY_IDS: list[Any] = [1, "", ["x"], "\ud800", "a\x00b", b"id"]
BAD_BATCHES: list[Any] = [None, 1, "abc", {"a": 1}, (e for e in ())]


def _make(kind: str, tmp_path: Path) -> Any:
    if kind == "memory":
        return MemoryStore()
    if kind == "file":
        return FileStore(tmp_path / "files")
    return SQLiteStore(tmp_path / "s.db")


async def _first(iterator: AsyncIterator[Any]) -> Any:
    return await anext(iterator)


def _calls(store: Any, sid: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    entry = MessageEntry(message=UserMessage.of("x"))
    return {
        "load_entries": lambda: store.load_entries(sid),
        "append_entries": lambda: store.append_entries(sid, [entry]),
        "append_linear": lambda: store.append_linear(sid, [entry]),
        "load_entries_after": lambda: store.load_entries_after(sid, None),
        "load_session": lambda: store.load_session(sid),
        "delete_session": lambda: store.delete_session(sid),
        "watch": lambda: _first(store.watch(sid)),
    }


@pytest.fixture(params=["memory", "file", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    made = _make(request.param, tmp_path)
    async with made:
        await made.create_session(SessionRecord(id="s"))
        await made.append_entries("s", [MessageEntry(message=UserMessage.of("first"))])
        await made.load_entries("s")  # whatever a store keeps for a loaded session
        yield made


@pytest.mark.parametrize("bad", BAD_SESSION_IDS, ids=repr)
async def test_s7_every_method_refuses_a_bad_session_id_with_invalid_session_id(
        store: Any, bad: Any) -> None:
    for name, call in _calls(store, bad).items():
        with pytest.raises(InvalidSessionId):
            await call()
            pytest.fail(f"{name} took {bad!r}")
    with pytest.raises(InvalidSessionId):
        await store.create_session(SessionRecord(id=bad))
    assert len(await store.load_entries("s")) == 1


@pytest.mark.parametrize("bad", BAD_ENTRY_IDS, ids=repr)
async def test_s26_s32_a_bad_entry_id_argument_is_a_config_error(store: Any, bad: Any) -> None:
    with pytest.raises(ConfigError, match="load_entries_after on session 's'"):
        await store.load_entries_after("s", bad)
    with pytest.raises(ConfigError, match="watch on session 's'"):
        store.watch("s", bad)  # at the call, before any iteration


@pytest.mark.parametrize("bad", BAD_BATCHES, ids=["None", "1", "str", "dict", "generator"])
async def test_s14_a_batch_that_is_not_a_list_is_a_config_error(store: Any, bad: Any) -> None:
    for name in ("append_entries", "append_linear"):
        with pytest.raises(ConfigError, match=f"{name} on session 's'"):
            await getattr(store, name)("s", bad)
    assert len(await store.load_entries("s")) == 1


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
async def test_every_local_store_closes_with_async_with(kind: str, tmp_path: Path) -> None:
    async with _make(kind, tmp_path) as store:
        await store.create_session(SessionRecord(id="s"))
    async with _make(kind, tmp_path) as again:
        if kind != "memory":  # the data outlives the object
            assert (await again.load_session("s")).id == "s"
