"""The Store conformance suite: one set of tests every store must pass (S7-S9, S14-S16, S25, S26).

Each test checks one rule of docs/writing-a-store.md (the Store contract);
the page names the test for each rule.

Subclass ``StoreConformance`` in a test module and give it a factory::

    from pathlib import Path

    from threadline.testing import StoreConformance

    class TestMyStore(StoreConformance):
        async def make_store(self, tmp_path: Path) -> Store:
            return MyStore(tmp_path / "db")

pytest then collects every ``test_*`` method for your store. The suite needs
``pytest-asyncio`` (its tests are ``async def`` and carry the asyncio mark, so
the plugin's strict mode works as well as auto mode).

The factory's contract:

- ``make_store(tmp_path)`` returns a handle on storage that is **empty** for a
  fresh ``tmp_path``. Calling it again with the same ``tmp_path`` must return
  a *second handle on the same data* (another connection, another file store
  on the same directory). A store whose instances cannot share data (an
  in-memory store) sets ``shared_instances = False``; the concurrency tests
  then share one instance between tasks and threads.
- Handles are closed by the suite (``await store.close()``) when they have a
  ``close`` method.
- Handles may be opened from other threads, each running its own event loop.

Child processes. The multi-process tests run ``make_store(tmp_path)`` in
child processes (started with ``spawn``) by default, which works when the
test class is defined at module level of an importable test module, as
above. Otherwise override ``store_opener(tmp_path)`` to return a picklable
zero-argument callable that opens the same storage, in one line::

    def store_opener(self, tmp_path: Path) -> StoreOpener:
        return functools.partial(MyStore, str(tmp_path / "db"))

A test that cannot open the store in a child fails and says why; it never
skips quietly. ``process_count`` / ``process_appends`` size the
multi-process append test; ``kill_rounds`` / ``kill_batch`` say how many
children the SIGKILL test kills in the middle of one ``append_entries``
call, and how many entries that call holds.

Optional hooks for reaching past the store's own checks (tests that need a
hook the store lacks skip, naming the hook):

- ``write_stored(store, session_id, data)``: put ``data`` into the
  session's log as its next stored entry exactly as given, bypassing
  encoding and validation (a raw ``INSERT``, a line appended to a file).
- ``write_format_version(store, session_id, version)``: mark the session as
  written by format ``version``, for stores that keep a format version per
  session (the file store's first line).
- ``watch_appends``: how many entries the S26 test appends while three
  watchers follow (10,000). The S26 tests run when the store has ``watch``.

A store refuses what it could not give back exactly by calling
``threadline.session.encode_entry`` on every entry before writing any of
them (``InvalidEntry``); the S16 tests check that it does.

Methods the protocol does not require (``load_session``, ``list_sessions``,
``delete_session``, and the ``LinearStore`` pair ``append_linear`` and
``load_entries_after``) are tested only when the store has them. To skip a test
that cannot apply to your store, override it with a method marked
``pytest.mark.skip(reason=...)`` and say why.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import multiprocessing
import pickle
import random
import signal
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
import pytest_asyncio

from threadline.ai._messages import (
    AssistantMessage,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from threadline.errors import (
    ConfigError,
    CorruptLog,
    EntryNotFound,
    InvalidEntry,
    InvalidSessionId,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import MAX_DEPTH, decode_entry, encode_entry
from threadline.session._entries import (
    FORMAT_VERSION,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
    register_custom,
)
from threadline.session._ids import new_id
from threadline.session._store import LinearStore, Store, WatchableStore
from threadline.session._storekit import MAX_SESSION_ID_BYTES
from threadline.session._tree import TreeIndex

__all__ = [
    "ConformanceNote",
    "StoreConformance",
    "StoreOpener",
    "assert_same_entries",
    "check_concurrent_log",
    "sample_entries",
]

StoreOpener = Callable[[], "Store | Awaitable[Store]"]
"""A picklable callable a child process uses to open the store under test."""


class ConformanceNote(msgspec.Struct, frozen=True, kw_only=True):
    """The registered custom kind the suite round-trips."""

    text: str
    tags: tuple[str, ...] = ()
    score: float = 0.0


NOTE_KIND = "threadline.conformance.note"
UNREGISTERED_KIND = "threadline.conformance.never-registered"
register_custom(NOTE_KIND, ConformanceNote)

UNICODE_IDS = (
    "séance",
    "se\u0301ance",  # the NFD spelling of the id above: a different id
    "SÉANCE",
    "Séance",
    "Ωμέγα/../../etc/passwd",
    "emoji 😀 id",
    "CON",
    "con.txt",
    "..",
    ".",
    "tab\tand\nnewline",
    "C:\\Windows\\aux",
    "日本語のセッション",
    "x" * 500,
)


def _at(seconds: int) -> datetime:
    return datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def sample_entries() -> list[Entry]:
    """One chain holding every entry kind and every content part."""
    ids = [new_id() for _ in range(9)]
    opaque = decode_entry(
        b'{"type":"future.kind","id":"' + ids[8].encode() + b'","parent_id":"'
        + ids[7].encode() + b'","timestamp":"2024-05-01T12:00:00Z",'
        b'"payload":{"z":1, "a":[1.50,"\\u00e9",null]}}'
    )
    assert isinstance(opaque, OpaqueEntry)
    return [
        MessageEntry(
            id=ids[0], timestamp=_at(0),
            message=UserMessage(content=(
                TextPart(text="What is in this picture? é ☃ 😀"),
                ImagePart(data="iVBORw0KGgo=", mime_type="image/png"),
            )),
        ),
        MessageEntry(
            id=ids[1], parent_id=ids[0], timestamp=_at(1),
            message=AssistantMessage(
                content=(
                    ThinkingPart(thinking="Let me look.", signature="sig-abc", provider="anth"),
                    ThinkingPart(thinking="", signature="ENCRYPTED", redacted=True),
                    TextPart(text="Calling a tool."),
                    ToolCall(id="call_1", name="lookup",
                             arguments={"q": "cats", "n": 3, "nested": {"a": [1, None]}}),
                ),
                model="m-1", provider="prov", api="chat",
                usage=Usage(input_tokens=10, output_tokens=5, cache_read_tokens=2,
                            cache_write_tokens=1, reasoning_tokens=4),
                stop_reason="tool_use", response_id="resp_1",
            ),
        ),
        MessageEntry(
            id=ids[2], parent_id=ids[1], timestamp=_at(2),
            message=ToolResultMessage(
                tool_call_id="call_1", tool_name="lookup",
                content=(TextPart(text="3 cats"), ImagePart(data="R0lG", mime_type="image/gif")),
                is_error=True, synthesized="interrupted", details={"exit": 1},
            ),
        ),
        MessageEntry(
            id=ids[3], parent_id=ids[2], timestamp=_at(3),
            message=AssistantMessage(stop_reason="error", error_message="boom"),
        ),
        CompactionEntry(
            id=ids[4], parent_id=ids[3], timestamp=_at(4), summary="Earlier: cats.",
            first_kept_entry_id=ids[2], tokens_before=1234, details={"files": ["a.py"]},
        ),
        BranchSummaryEntry(
            id=ids[5], parent_id=ids[4], timestamp=_at(5), from_id=ids[3],
            summary="Tried a branch.", origin_id=new_id(),
        ),
        CustomEntry(
            id=ids[6], parent_id=ids[5], timestamp=_at(6), kind=NOTE_KIND,
            data=ConformanceNote(text="registered", tags=("a", "b"), score=0.5),
        ),
        CustomEntry(
            id=ids[7], parent_id=ids[6], timestamp=_at(7), kind=UNREGISTERED_KIND,
            data=msgspec.Raw(b'{"keep" : [1.0, 2.50, "\\u00e9"],  "order":{"b":1,"a":2}}'),
        ),
        opaque,
        CustomMessageEntry(
            parent_id=ids[8], timestamp=_at(9), kind="reminder",
            content=(TextPart(text="remember"), ImagePart(data="AAAA", mime_type="image/png")),
            display=False, details=[1, "two"],
        ),
    ]


def _nested(depth: int) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _custom(data: object) -> Callable[[], Entry]:
    return lambda: CustomEntry(kind=UNREGISTERED_KIND, data=data)


def _text(text: str, id: str | None = None, parent_id: str | None = None) -> Callable[[], Entry]:
    def make() -> Entry:
        entry = MessageEntry(parent_id=parent_id, message=UserMessage.of(text))
        return entry if id is None else msgspec.structs.replace(entry, id=id)

    return make


# What no store may accept: each would be lost, changed or unreadable (S16).
INVALID_ENTRIES: dict[str, Callable[[], Entry]] = {
    "empty id": _text("x", id=""),
    "NUL in id": _text("x", id="a\x00b"),
    "empty parent_id": _text("x", parent_id=""),
    "lone surrogate in text": _text("a \ud800 b"),
    "lone surrogate in id": _text("x", id="id-\udfff"),
    "lone surrogate in parent_id": _text("x", parent_id="p-\ud800"),
    "lone surrogate in a dict key": _custom({"k\ud800": 1}),
    "nested one level too deep": _custom(_nested(MAX_DEPTH)),
    "nested 1,000 levels deep": _custom(_nested(1_000)),
    "NaN": _custom({"x": float("nan")}),
    "infinity": _custom([float("inf")]),
    "minus infinity": _custom({"x": [-float("inf")]}),
    "bytes": _custom({"blob": b"\x00\x01"}),
    "not an entry": lambda: {"type": "message"},  # type: ignore[return-value,dict-item]
}


def assert_same_entries(actual: Sequence[Entry], expected: Sequence[Entry]) -> None:
    """Same kinds, same order, byte-identical encodings."""
    assert [type(e) for e in actual] == [type(e) for e in expected]
    assert [encode_entry(e) for e in actual] == [encode_entry(e) for e in expected]


def check_concurrent_log(
    loaded: Sequence[Entry], acknowledged: Sequence[Sequence[str]]
) -> None:
    """Every acknowledged id present once, each writer's ids in its own order,
    every parent present, and nothing that no writer acknowledged."""
    ids = [e.id for e in loaded]
    assert len(ids) == len(set(ids)), "an entry was stored twice"
    expected = {i for chain in acknowledged for i in chain}
    assert set(ids) == expected, (
        f"{len(expected - set(ids))} acknowledged entries lost, "
        f"{len(set(ids) - expected)} unexpected"
    )
    position = {entry_id: n for n, entry_id in enumerate(ids)}
    for chain in acknowledged:
        assert [position[i] for i in chain] == sorted(position[i] for i in chain)
    present = set(ids)
    for entry in loaded:
        assert entry.parent_id is None or entry.parent_id in present, entry


def _fields(record: SessionRecord) -> tuple[str, str | None, datetime]:
    return record.id, record.parent_id, record.created_at


def _chain(count: int, parent_id: str | None = None, writer: int = 0) -> list[Entry]:
    """``count`` entries, each the child of the one before."""
    out: list[Entry] = []
    for n in range(count):
        entry = _chain_entry(parent_id, writer, n)
        parent_id = entry.id
        out.append(entry)
    return out


def _chain_entry(parent_id: str | None, writer: int, n: int) -> MessageEntry:
    return MessageEntry(
        parent_id=parent_id,
        message=UserMessage(content=(TextPart(text=f"writer {writer} entry {n} " + "ä" * 40),)),
    )


async def _append_chain(
    store: Store, session_id: str, writer: int, count: int, batch: int = 1
) -> list[str]:
    """Append ``count`` chained entries, ``batch`` per call; the ids acknowledged."""
    acknowledged: list[str] = []
    parent: str | None = None
    for start in range(0, count, batch):
        entries = []
        for n in range(start, min(start + batch, count)):
            entry = _chain_entry(parent, writer, n)
            parent = entry.id
            entries.append(entry)
        await store.append_entries(session_id, entries)
        acknowledged.extend(e.id for e in entries)
    return acknowledged


async def _open(opener: StoreOpener) -> Store:
    store = opener()
    if inspect.isawaitable(store):
        store = await store
    return store


async def _close(store: Store) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


def _process_append(opener: StoreOpener, session_id: str, writer: int, count: int) -> list[str]:
    async def run() -> list[str]:
        store = await _open(opener)
        try:
            return await _append_chain(store, session_id, writer, count)
        finally:
            await _close(store)

    return asyncio.run(run())


async def _open_with_suite(suite: type[StoreConformance], tmp_path: Path) -> Store:
    return await suite().make_store(tmp_path)


async def _append_batches(store: Store, session_id: str, count: int) -> list[str]:
    """Append ``count`` chained entries in batches of 1 to 5; the ids in append order."""
    acknowledged: list[str] = []
    parent: str | None = None
    while len(acknowledged) < count:
        entries: list[Entry] = []
        for _ in range(min(1 + len(acknowledged) % 5, count - len(acknowledged))):
            entry = _chain_entry(parent, 0, len(acknowledged) + len(entries))
            parent = entry.id
            entries.append(entry)
        await store.append_entries(session_id, entries)
        acknowledged.extend(e.id for e in entries)
    return acknowledged


def _process_append_batches(opener: StoreOpener, session_id: str, count: int) -> list[str]:
    async def run() -> list[str]:
        store = await _open(opener)
        try:
            return await _append_batches(store, session_id, count)
        finally:
            await _close(store)

    return asyncio.run(run())


async def _watch_ids(store: Store, session_id: str, count: int, after: str | None = None,
                     stop_after: int | None = None) -> list[str]:
    """Ids ``watch`` yields until ``count`` arrived (or ``stop_after``, then it disconnects)."""
    assert isinstance(store, WatchableStore)
    ids: list[str] = []
    watch = store.watch(session_id, after)
    try:
        async for entry in watch:
            ids.append(entry.id)
            if len(ids) in (count, stop_after):
                break
    finally:
        await _aclose(watch)
    return ids


async def _aclose(iterator: AsyncIterator[Entry]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


def _process_batch(opener: StoreOpener, session_id: str, size: int, say: Any) -> None:
    """Create a session, say "s", append ``size`` entries in one call, say "d"."""

    async def run() -> None:
        store = await _open(opener)
        await store.create_session(SessionRecord(id=session_id))
        parent: str | None = None
        batch: list[Entry] = []
        for n in range(size):
            entry = _chain_entry(parent, 0, n)
            entry = msgspec.structs.replace(
                entry, message=UserMessage.of(f"{n} " + "é" * 1_000))
            parent = entry.id
            batch.append(entry)
        say.send("s")
        await store.append_entries(session_id, batch)
        say.send("d")
        await _close(store)

    asyncio.run(run())


def _process_create(opener: StoreOpener, session_id: str) -> bool:
    async def run() -> bool:
        store = await _open(opener)
        try:
            await store.create_session(SessionRecord(id=session_id))
        except SessionExists:
            return False
        finally:
            await _close(store)
        return True

    return asyncio.run(run())


@pytest.mark.asyncio
class StoreConformance:
    """Subclass this and implement ``make_store``. See the module docstring."""

    shared_instances: ClassVar[bool] = True
    """False when two ``make_store`` calls cannot see each other's data."""

    process_count: ClassVar[int] = 4
    process_appends: ClassVar[int] = 50
    kill_rounds: ClassVar[int] = 10
    kill_batch: ClassVar[int] = 1_000

    watch_appends: ClassVar[int] = 10_000
    """Entries appended while three watchers follow (stores that can watch)."""

    async def make_store(self, tmp_path: Path) -> Store:
        raise NotImplementedError("subclasses of StoreConformance implement make_store")

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        """How a child process opens the storage; by default ``make_store`` in the child.

        Return ``None`` only for a store whose data cannot be shared between
        processes (then also set ``shared_instances = False``).
        """
        if not self.shared_instances:
            return None
        return functools.partial(_open_with_suite, type(self), tmp_path)

    async def write_stored(self, store: Store, session_id: str, data: bytes) -> None:
        """Hook: store ``data`` as the session's next entry, bypassing every check."""
        pytest.skip(f"{type(self).__name__} has no write_stored hook")

    async def write_format_version(self, store: Store, session_id: str, version: int) -> None:
        """Hook: mark the session as written by format ``version``."""
        pytest.skip(f"{type(self).__name__} has no write_format_version hook "
                    f"(a store without a per-session format version needs none)")

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
                await _close(handle)

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

    # -- round trips (S8, S9) -------------------------------------------------

    async def test_s8_round_trip_every_entry_kind(self, store: Store) -> None:
        sid = await self.new_session(store)
        entries = sample_entries()
        await store.append_entries(sid, entries)
        loaded = await store.load_entries(sid)
        assert_same_entries(loaded, entries)
        assert isinstance(loaded[6], CustomEntry)
        assert isinstance(loaded[6].data, ConformanceNote)
        assert loaded[6].data == ConformanceNote(text="registered", tags=("a", "b"), score=0.5)

    async def test_s9_unregistered_custom_kind_is_lossless(self, store: Store) -> None:
        sid = await self.new_session(store)
        raw = b'{ "x" : 1.250e1, "y":["\\u2603", {"b":null,"a":true}] }'
        entry = CustomEntry(kind=UNREGISTERED_KIND, data=msgspec.Raw(raw))
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert type(loaded) is CustomEntry
        assert loaded.kind == UNREGISTERED_KIND
        assert bytes(loaded.data) == raw
        assert encode_entry(loaded) == encode_entry(entry)

    async def test_s9_unknown_entry_type_is_written_back_unchanged(self, store: Store) -> None:
        sid = await self.new_session(store)
        raw = (
            b'{"type":"from.the.future","id":"' + new_id().encode()
            + b'","parent_id":null,"extra":{"k":[1,2.0,"\\u00e9"]},"n":  7}'
        )
        entry = decode_entry(raw)
        assert isinstance(entry, OpaqueEntry)
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert isinstance(loaded, OpaqueEntry)
        assert loaded.type == "from.the.future"
        assert encode_entry(loaded) == raw

    async def test_s8_new_session_has_no_entries(self, store: Store) -> None:
        sid = await self.new_session(store)
        assert list(await store.load_entries(sid)) == []

    async def test_s8_append_order_is_kept(self, store: Store) -> None:
        sid = await self.new_session(store)
        root = _chain_entry(None, 0, 0)
        # Siblings, a late child of the root and a batch: order is append order,
        # not tree order or id order.
        batches: list[list[Entry]] = [
            [root],
            [_chain_entry(root.id, 0, 1), _chain_entry(root.id, 0, 2)],
            [],
            [_chain_entry(root.id, 0, 3)],
        ]
        older = MessageEntry(id="00000000-0000-7000-8000-000000000000", parent_id=root.id,
                             message=UserMessage.of("an id that sorts first"))
        batches.append([older])
        for batch in batches:
            await store.append_entries(sid, batch)
        loaded = await store.load_entries(sid)
        assert_same_entries(loaded, [e for batch in batches for e in batch])

    async def test_s8_stored_data_is_not_shared_with_caller(self, store: Store) -> None:
        sid = await self.new_session(store)
        call = ToolCall(id="c", name="t", arguments={"k": "before"})
        entry = MessageEntry(message=AssistantMessage(content=(call,)))
        await store.append_entries(sid, [entry])
        call.arguments["k"] = "changed after append"
        loaded = await store.load_entries(sid)
        loaded_entry = loaded[0]
        assert isinstance(loaded_entry, MessageEntry)
        assert isinstance(loaded_entry.message, AssistantMessage)
        loaded_entry.message.tool_calls[0].arguments["k"] = "changed after load"
        loaded.clear()
        (again,) = await store.load_entries(sid)
        assert isinstance(again, MessageEntry)
        assert isinstance(again.message, AssistantMessage)
        assert again.message.tool_calls[0].arguments == {"k": "before"}

    # -- one append is all or nothing (S14) -------------------------------------

    @pytest.mark.parametrize("position", ["first", "middle", "last"])
    async def test_s14_batch_with_an_invalid_entry_appends_nothing(
        self, store: Store, position: str
    ) -> None:
        sid = await self.new_session(store)
        root = _chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        good = [_chain_entry(root.id, 0, n) for n in range(1, 41)]
        bad = MessageEntry(parent_id=root.id, message=UserMessage.of("lone \ud800 surrogate"))
        at = {"first": 0, "middle": 20, "last": 40}[position]
        with pytest.raises(InvalidEntry) as info:
            await store.append_entries(sid, [*good[:at], bad, *good[at:]])
        assert info.value.session_id == sid and info.value.entry_id == bad.id
        assert [e.id for e in await store.load_entries(sid)] == [root.id]
        await store.append_entries(sid, good)  # the session is not harmed
        assert len(await store.load_entries(sid)) == 41

    # -- what other programs wrote comes back byte for byte (S15) ---------------

    async def test_s15_foreign_lines_come_back_byte_for_byte(self, store: Store) -> None:
        sid = await self.new_session(store)
        ids = [new_id() for _ in range(6)]
        lines = [
            # A field this version does not know; a timestamp with two digits.
            b'{"type":"message","id":"%s","timestamp":"2025-03-01T09:30:01.12Z",'
            b'"message":{"role":"user","content":[{"type":"text","text":"hi"}]},'
            b'"mood":"curious"}' % ids[0].encode(),
            # Another key order, a +00:00 offset, escapes this version would not write.
            b'{"id":"%s","parent_id":"%s","type":"message","timestamp":'
            b'"2025-03-01T09:30:02+00:00","message":{"role":"user","content":'
            b'[{"type":"text","text":"\\u00e9t\\u00e9"}]}}' % (ids[1].encode(), ids[0].encode()),
            # A custom entry with a top-level field nobody here knows.
            b'{"type":"custom","id":"%s","parent_id":"%s","timestamp":"2025-03-01T09:30:03Z",'
            b'"kind":"%s","data":{"a":1},"written_by":"another app"}'
            % (ids[2].encode(), ids[1].encode(), UNREGISTERED_KIND.encode()),
            # A registered kind whose data has a field its class lacks.
            b'{"type":"custom","id":"%s","parent_id":"%s","timestamp":"2025-03-01T09:30:04.5Z",'
            b'"kind":"%s","data":{"text":"n","added_later":[1,2]}}'
            % (ids[3].encode(), ids[2].encode(), NOTE_KIND.encode()),
            # A type this version does not know.
            b'{"type":"from.the.future","id":"%s","parent_id":"%s","x":{"y":[1.50]}}'
            % (ids[4].encode(), ids[3].encode()),
        ]
        entries = [decode_entry(line) for line in lines]
        await store.append_entries(sid, entries)  # one call ...
        single = await self.new_session(store)
        for entry in entries:  # ... and one call each
            await store.append_entries(single, [entry])
        for session in (sid, single):
            loaded = await store.load_entries(session)
            assert [encode_entry(e) for e in loaded] == lines
        first, _, custom, note, _ = loaded
        assert isinstance(first, MessageEntry) and first.message.text == "hi"
        assert isinstance(custom, CustomEntry) and isinstance(custom.data, msgspec.Raw)
        assert isinstance(note, CustomEntry) and note.data == ConformanceNote(text="n")
        # Once changed, an entry is written the way this version writes it.
        changed = msgspec.structs.replace(first, id=ids[5])
        assert b"mood" not in encode_entry(changed)

    # -- nothing unreadable is ever stored (S16) --------------------------------

    @pytest.mark.parametrize("case", sorted(INVALID_ENTRIES))
    async def test_s16_invalid_entry_is_refused_before_anything_is_written(
        self, store: Store, case: str
    ) -> None:
        sid = await self.new_session(store)
        good = _chain_entry(None, 0, 0)
        with pytest.raises(InvalidEntry) as info:
            await store.append_entries(sid, [good, INVALID_ENTRIES[case]()])
        assert info.value.session_id == sid and repr(sid) in str(info.value)
        assert list(await store.load_entries(sid)) == []
        await store.append_entries(sid, [good])
        assert [e.id for e in await store.load_entries(sid)] == [good.id]

    async def test_s16_nesting_up_to_the_limit_round_trips(self, store: Store) -> None:
        sid = await self.new_session(store)
        # The line's own object is one level, so MAX_DEPTH - 1 levels of data fit.
        entry = CustomEntry(kind=UNREGISTERED_KIND, data=_nested(MAX_DEPTH - 1))
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert encode_entry(loaded) == encode_entry(entry)

    # -- errors (S7) ----------------------------------------------------------

    async def test_s7_load_unknown_session_raises_not_found(self, store: Store) -> None:
        with pytest.raises(SessionNotFound) as info:
            await store.load_entries("conf-no-such-session")
        assert info.value.session_id == "conf-no-such-session"

    async def test_s7_create_existing_session_raises_exists(self, store: Store) -> None:
        sid = await self.new_session(store)
        await store.append_entries(sid, [_chain_entry(None, 0, 0)])
        with pytest.raises(SessionExists):
            await store.create_session(SessionRecord(id=sid, parent_id="other"))
        assert len(await store.load_entries(sid)) == 1

    async def test_s7_append_to_unknown_session_raises_and_creates_nothing(
        self, store: Store
    ) -> None:
        with pytest.raises(SessionNotFound):
            await store.append_entries("conf-missing", [_chain_entry(None, 0, 0)])
        with pytest.raises(SessionNotFound):
            await store.load_entries("conf-missing")

    async def test_s8_repeated_entry_id_refuses_the_whole_batch(self, store: Store) -> None:
        # The second half of the repeated-id rule: a batch that repeats a
        # stored id and is not an exact retry of stored entries (S25) is a
        # conflict, refused whole, on this handle and on any other.
        sid, before, batch = await self._stored_batch(store)
        stored = before + batch
        changed = msgspec.structs.replace(batch[1], message=UserMessage.of("not the same"))
        fresh = _chain_entry(batch[2].id, 0, 4)
        twin = msgspec.structs.replace(fresh, message=UserMessage.of("its twin"))
        other = await self.another_handle()
        conflicts = [
            (store, [changed]),                          # other bytes under a stored id
            (store, [batch[0], changed, batch[2]]),      # ... inside an otherwise exact retry
            (store, [fresh, changed]),                   # a new entry, then a stored id
            (store, [*batch, fresh]),                    # stored, plus one new entry
            (store, [batch[1], batch[0], batch[2]]),     # stored ids in another order
            (store, [before[0], batch[1]]),              # stored, but not as one run
            (store, [batch[0], batch[0]]),               # one stored entry twice
            (store, [fresh, twin]),                      # an id twice within the batch
            (other, [fresh, changed]),
            (other, [batch[1], batch[0], batch[2]]),
        ]
        for handle, conflict in conflicts:
            with pytest.raises(StoreError) as info:
                await handle.append_entries(sid, conflict)
            assert info.value.session_id == sid and repr(sid) in str(info.value)
            assert_same_entries(await store.load_entries(sid), stored)
        # The new id stays free for the batch that is right.
        await store.append_entries(sid, [fresh])
        assert_same_entries(await other.load_entries(sid), [*stored, fresh])
        # Ids stored by a call of several entries count as well (one batch line
        # in the file store), for the handle that wrote them, for one that had
        # the session open before (it learns them from what was added since),
        # for one that loaded after, and for one that never looked.
        pair = [_chain_entry(fresh.id, 1, 0)]
        pair.append(_chain_entry(pair[0].id, 1, 1))
        await store.append_entries(sid, pair)
        loaded = await self.another_handle()
        await loaded.load_entries(sid)
        cold = await self.another_handle()
        stored = [*stored, fresh, *pair]
        for handle in (store, other, loaded, cold):
            for old in pair:
                changed = msgspec.structs.replace(old, message=UserMessage.of("changed"))
                for batch in ([changed], [_chain_entry(pair[-1].id, 2, 0), changed]):
                    with pytest.raises(StoreError) as info:
                        await handle.append_entries(sid, batch)
                    assert info.value.session_id == sid
            assert_same_entries(await handle.load_entries(sid), stored)

    # -- lineage (S6) ---------------------------------------------------------

    async def test_s6_lineage_read_back(self, store: Store) -> None:
        load_session = getattr(store, "load_session", None)
        if load_session is None:
            pytest.skip("store has no load_session")
        created = datetime(2023, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
        parent = SessionRecord(id="conf-parent", created_at=created)
        child = SessionRecord(id="conf-child", parent_id="conf-parent",
                              created_at=created + timedelta(hours=1))
        await store.create_session(parent)
        await store.create_session(child)
        for record in (parent, child):
            got = await load_session(record.id)
            assert (got.id, got.parent_id, got.created_at) == (
                record.id, record.parent_id, record.created_at
            )
        with pytest.raises(SessionNotFound):
            await load_session("conf-nobody")

    # -- size and text --------------------------------------------------------

    async def test_s8_one_mebibyte_entries(self, store: Store) -> None:
        sid = await self.new_session(store)
        big_text = "a" * (1 << 20)
        big_unicode = ("é😀" * (1 << 18))[: 1 << 19]
        entries: list[Entry] = [
            MessageEntry(message=UserMessage.of(big_text)),
            MessageEntry(message=ToolResultMessage(
                tool_call_id="c", tool_name="cat", content=(TextPart(text=big_unicode),))),
            CustomEntry(kind=UNREGISTERED_KIND,
                        data=msgspec.Raw(msgspec.json.encode({"blob": big_text}))),
        ]
        await store.append_entries(sid, entries[:1])
        await store.append_entries(sid, entries[1:])
        assert_same_entries(await store.load_entries(sid), entries)

    async def test_s1_unicode_session_ids_and_content(self, store: Store) -> None:
        text = "mixed: é ß 漢字 😀 \u200f\u05e9\u05dc\u05d5\u05dd \u2028 \x00 \\ \" \x7f end"
        for sid in UNICODE_IDS:
            await store.create_session(SessionRecord(id=sid))
            await store.append_entries(
                sid, [MessageEntry(message=UserMessage.of(f"{sid}|{text}"))]
            )
        for sid in UNICODE_IDS:
            (entry,) = await store.load_entries(sid)
            assert isinstance(entry, MessageEntry)
            assert isinstance(entry.message, UserMessage)
            assert entry.message.text == f"{sid}|{text}"
        load_session = getattr(store, "load_session", None)
        if load_session is not None:
            for sid in UNICODE_IDS:
                assert (await load_session(sid)).id == sid

    async def test_s8_many_sessions(self, store: Store) -> None:
        sids = [f"conf-many-{n:03d}" for n in range(150)]
        await asyncio.gather(*(store.create_session(SessionRecord(id=s)) for s in sids))
        await asyncio.gather(*(
            store.append_entries(s, [MessageEntry(message=UserMessage.of(s))]) for s in sids
        ))
        for sid in sids:
            (entry,) = await store.load_entries(sid)
            assert isinstance(entry, MessageEntry)
            assert isinstance(entry.message, UserMessage)
            assert entry.message.text == sid

    # -- listing and deleting (when offered) ----------------------------------

    async def test_list_sessions_newest_first_with_keyset_pages(self, store: Store) -> None:
        list_sessions = getattr(store, "list_sessions", None)
        if list_sessions is None:
            pytest.skip("store has no list_sessions")
        # Every field of every record comes back: lineage on some, microseconds on all.
        records = [SessionRecord(id=f"conf-list-{n:02d}",
                                 parent_id=f"conf-origin-{n}" if n % 3 else None,
                                 created_at=_at(n) + timedelta(microseconds=7 * n + 1))
                   for n in range(10)]
        # Three sessions created in the same instant: ties break by id, descending.
        records += [SessionRecord(id=f"conf-tie-{c}", created_at=_at(5)) for c in "bca"]
        for record in records:
            await store.create_session(record)
        expected = [_fields(r) for r in sorted(records, key=lambda r: (r.created_at, r.id),
                                               reverse=True)]

        page = await list_sessions(limit=100)
        assert [_fields(r) for r in page.sessions] == expected
        assert page.next_cursor is None

        seen: list[tuple[str, str | None, datetime]] = []
        page = await list_sessions(limit=4)
        seen += [_fields(r) for r in page.sessions]
        # A session created between pages must not shift the pages (keyset).
        await store.create_session(SessionRecord(id="conf-list-late", created_at=_at(100)))
        while page.next_cursor is not None:
            page = await list_sessions(limit=4, cursor=page.next_cursor)
            assert 0 < len(page.sessions) <= 4
            seen += [_fields(r) for r in page.sessions]
        assert seen == expected
        first = (await list_sessions(limit=1)).sessions[0]
        assert first.id == "conf-list-late"
        assert first.created_at == _at(100)

    async def test_delete_session(self, store: Store) -> None:
        delete_session = getattr(store, "delete_session", None)
        if delete_session is None:
            pytest.skip("store has no delete_session")
        keep = await self.new_session(store)
        gone = await self.new_session(store)
        await store.append_entries(keep, [_chain_entry(None, 0, 0)])
        await store.append_entries(gone, [_chain_entry(None, 0, 0)])
        await delete_session(gone)
        with pytest.raises(SessionNotFound):
            await store.load_entries(gone)
        with pytest.raises(SessionNotFound):
            await store.append_entries(gone, [_chain_entry(None, 0, 1)])
        with pytest.raises(SessionNotFound):
            await delete_session(gone)
        load_session = getattr(store, "load_session", None)
        if load_session is not None:
            with pytest.raises(SessionNotFound):
                await load_session(gone)
        list_sessions = getattr(store, "list_sessions", None)
        if list_sessions is not None:
            assert gone not in [r.id for r in (await list_sessions(limit=1000)).sessions]
        assert len(await store.load_entries(keep)) == 1
        # The id is free again, with an empty log.
        await store.create_session(SessionRecord(id=gone))
        assert list(await store.load_entries(gone)) == []

    # -- the written contract (docs/writing-a-store.md) -----------------------

    async def test_s7_identical_record_cannot_be_created_twice(self, store: Store) -> None:
        record = SessionRecord(id="conf-twice", created_at=_at(1))
        await store.create_session(record)
        for handle in (store, await self.another_handle()):
            with pytest.raises(SessionExists) as info:
                await handle.create_session(record)
            assert info.value.session_id == record.id

    async def test_s7_not_found_names_the_session_asked_for(self, store: Store) -> None:
        await self.new_session(store, "conf-present")
        sid = "conf-absent"
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load_entries(sid),
            lambda: store.append_entries(sid, [_chain_entry(None, 0, 0)]),
            lambda: store.append_entries(sid, []),  # an empty batch still needs the session
        ]
        for name in ("load_session", "delete_session"):
            method = getattr(store, name, None)
            if method is not None:
                calls.append(functools.partial(method, sid))
        for call in calls:
            with pytest.raises(SessionNotFound) as info:
                await call()
            assert info.value.session_id == sid and repr(sid) in str(info.value)
        with pytest.raises(SessionNotFound):
            await store.load_entries(sid)  # and nothing was created on the way

    async def test_s1_one_session_id_rule(self, store: Store) -> None:
        too_long = "é" * (MAX_SESSION_ID_BYTES // 2 + 1)
        for sid in ("", "nul\x00inside", "lone \ud800 surrogate", too_long, 42, None):
            with pytest.raises(InvalidSessionId):
                await store.create_session(SessionRecord(id=sid))  # type: ignore[arg-type]
            with pytest.raises(InvalidSessionId):
                await store.load_entries(sid)  # type: ignore[arg-type]
            with pytest.raises(InvalidSessionId):
                await store.append_entries(sid, [])  # type: ignore[arg-type]
            if sid is None:
                continue  # no parent_id: a root session
            # A parent_id names a session, so the same rule holds for it; the
            # error names the session that was being created.
            with pytest.raises(InvalidSessionId) as info:
                await store.create_session(
                    SessionRecord(id="conf-bad-parent", parent_id=sid))  # type: ignore[arg-type]
            assert info.value.session_id == "conf-bad-parent"
            with pytest.raises(SessionNotFound):
                await store.load_entries("conf-bad-parent")
        longest = "é" * (MAX_SESSION_ID_BYTES // 2)
        await store.create_session(SessionRecord(id=longest))
        await store.append_entries(longest, [_chain_entry(None, 0, 0)])
        assert len(await store.load_entries(longest)) == 1

    async def test_s6_created_at_keeps_microseconds(self, store: Store) -> None:
        readers = [getattr(store, n, None) for n in ("load_session", "list_sessions")]
        if readers == [None, None]:
            pytest.skip("store has neither load_session nor list_sessions")
        record = SessionRecord(id="conf-micro", parent_id="conf-origin",
                               created_at=datetime(2024, 2, 29, 23, 59, 59, 123457, tzinfo=UTC))
        await store.create_session(record)
        if readers[0] is not None:
            assert _fields(await readers[0](record.id)) == _fields(record)
        if readers[1] is not None:
            assert [_fields(r) for r in (await readers[1]()).sessions] == [_fields(record)]

    async def test_s4_every_handle_sees_what_another_handle_wrote(self, store: Store) -> None:
        other = await self.another_handle()
        sid = await self.new_session(store)
        assert list(await other.load_entries(sid)) == []  # loaded (and maybe cached) first
        first = _chain_entry(None, 1, 0)
        await store.append_entries(sid, [first])
        assert_same_entries(await other.load_entries(sid), [first])
        second = _chain_entry(first.id, 2, 0)
        await other.append_entries(sid, [second])
        assert_same_entries(await store.load_entries(sid), [first, second])
        late = await self.new_session(other)
        assert list(await store.load_entries(late)) == []
        delete_session = getattr(other, "delete_session", None)
        if delete_session is not None:
            await delete_session(late)
            with pytest.raises(SessionNotFound):
                await store.load_entries(late)

    async def test_s4_two_handles_append_from_one_leaf_grow_siblings(self, store: Store) -> None:
        other = await self.another_handle()
        sid = await self.new_session(store)
        root = _chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        leaf_a = TreeIndex(await store.load_entries(sid)).leaf_id
        leaf_b = TreeIndex(await other.load_entries(sid)).leaf_id
        first, second = _chain_entry(leaf_a, 1, 1), _chain_entry(leaf_b, 2, 1)
        await asyncio.gather(store.append_entries(sid, [first]),
                             other.append_entries(sid, [second]))
        for handle in (store, other):
            loaded = await handle.load_entries(sid)
            assert len(loaded) == 3 and loaded[0].id == root.id
            children = TreeIndex(loaded).children(root.id)
            assert sorted(e.id for e in children) == sorted([first.id, second.id])

    async def test_s8_large_batches_are_kept_whole(self, store: Store) -> None:
        other = await self.another_handle()
        for size in (101, 250, 10_000):
            sid = await self.new_session(store)
            batch = _chain(size)
            await store.append_entries(sid, batch)
            assert_same_entries(await store.load_entries(sid), batch)
            assert_same_entries(await other.load_entries(sid), batch)

    async def test_s8_readers_never_see_part_of_a_batch(self, store: Store) -> None:
        reader = await self.another_handle()
        sid = await self.new_session(store)
        size, parent, seen = 300, None, set()
        for _ in range(3):
            batch = _chain(size, parent)
            parent = batch[-1].id
            task = asyncio.ensure_future(store.append_entries(sid, batch))
            while not task.done():
                seen.add(len(await reader.load_entries(sid)))
                await asyncio.sleep(0)
            await task
            seen.add(len(await reader.load_entries(sid)))
        assert seen <= {0, size, 2 * size, 3 * size}, sorted(seen)

    async def test_s8_undecodable_stored_data_is_corrupt_log(self, store: Store) -> None:
        for data in (
            b'{"type":"message","id":"conf-cut","timestamp":"2024-05-01T1',
            b'{"type":"message","id":"conf-alien","timestamp":"2024-05-01T12:00:00Z",'
            b'"message":{"role":"alien"}}',
            b"not json at all",
        ):
            sid = await self.new_session(store)
            await store.append_entries(sid, [_chain_entry(None, 0, 0)])
            await self.write_stored(store, sid, data)
            with pytest.raises(CorruptLog) as info:
                await store.load_entries(sid)
            assert info.value.session_id == sid

    async def test_s8_newer_format_version_is_refused_with_upgrade_advice(
        self, store: Store
    ) -> None:
        sid = await self.new_session(store)
        await store.append_entries(sid, [_chain_entry(None, 0, 0)])
        await self.write_format_version(store, sid, FORMAT_VERSION + 1)
        fresh = await self.another_handle()
        with pytest.raises(CorruptLog, match="upgrade"):
            await fresh.load_entries(sid)
        with pytest.raises(CorruptLog, match="upgrade"):
            await fresh.append_entries(sid, [_chain_entry(None, 0, 1)])

    async def test_list_sessions_refuses_a_bad_limit_or_cursor(self, store: Store) -> None:
        list_sessions = getattr(store, "list_sessions", None)
        if list_sessions is None:
            pytest.skip("store has no list_sessions")
        for n in range(3):
            await store.create_session(SessionRecord(id=f"conf-page-{n}", created_at=_at(n)))
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

    async def test_s7_close_twice_then_calls_work_or_raise_store_error(
        self, store: Store
    ) -> None:
        close = getattr(store, "close", None)
        if close is None:
            pytest.skip("store has no close")
        sid = await self.new_session(store)
        await close()
        await close()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load_entries(sid),
            lambda: store.append_entries(sid, [_chain_entry(None, 0, 0)]),
            lambda: store.create_session(SessionRecord(id="conf-after-close")),
        ]
        for call in calls:
            # Anything but a StoreError (AttributeError on a dropped
            # connection, a hang) fails the test.
            with contextlib.suppress(StoreError):
                await call()

    # -- concurrency (S4) -----------------------------------------------------

    async def test_s4_concurrent_creates_one_winner(self, store: Store) -> None:
        handles = [store] + [await self.another_handle() for _ in range(3)]
        results = await asyncio.gather(
            *(h.create_session(SessionRecord(id="conf-race")) for h in handles),
            return_exceptions=True,
        )
        assert sum(r is None for r in results) == 1, results
        assert all(r is None or isinstance(r, SessionExists) for r in results), results

    async def test_s4_concurrent_appends_from_tasks(self, store: Store) -> None:
        sid = await self.new_session(store)
        handles = [store] + [await self.another_handle() for _ in range(3)]
        chains = await asyncio.gather(*(
            _append_chain(handles[w % len(handles)], sid, w, 30, batch=1 + w % 3)
            for w in range(8)
        ))
        check_concurrent_log(await store.load_entries(sid), chains)

    async def test_s4_concurrent_appends_from_threads(self, store: Store) -> None:
        sid = await self.new_session(store)
        results: dict[int, list[str]] = {}
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            async def run() -> list[str]:
                handle = (
                    await self.make_store(self._tmp_path) if self.shared_instances
                    else self._main
                )
                try:
                    return await _append_chain(handle, sid, w, 40, batch=1 + w % 2)
                finally:
                    if self.shared_instances:
                        await _close(handle)

            try:
                results[w] = asyncio.run(run())
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()

        def join_all() -> None:
            for t in threads:
                t.join()

        await asyncio.to_thread(join_all)
        if errors:
            raise errors[0]
        check_concurrent_log(await store.load_entries(sid), list(results.values()))

    def _child_opener(self) -> StoreOpener:
        opener = self.store_opener(self._tmp_path)
        if opener is None:
            if not self.shared_instances:
                pytest.skip("the store's data lives in one process (shared_instances = False)")
            pytest.fail(f"{type(self).__name__}.store_opener() returned None although "
                        f"handles share data: return a picklable way to open the store")
        try:
            pickle.dumps(opener)
        except Exception as exc:
            pytest.fail(
                f"cannot send {type(self).__name__}'s store opener to a child process "
                f"({type(exc).__name__}: {exc}). Define the test class at module level, or "
                f"override store_opener(tmp_path) to return e.g. "
                f"functools.partial(MyStore, str(tmp_path / 'db'))")
        return opener

    def _process_pool(self, n: int) -> ProcessPoolExecutor:
        # spawn: the parent runs an event loop and threads, which fork would copy.
        return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))

    async def test_s14_batch_cut_by_sigkill_is_whole_or_absent(self, store: Store) -> None:
        opener = self._child_opener()
        context = multiprocessing.get_context("spawn")
        rnd = random.Random(14)
        duration: float | None = None
        kills = 0
        for _ in range(self.kill_rounds + 1):
            sid = f"conf-kill-{new_id()}"
            ours, theirs = context.Pipe()
            child = context.Process(target=_process_batch,
                                    args=(opener, sid, self.kill_batch, theirs))
            child.start()
            assert await asyncio.to_thread(ours.poll, 120), "the child never started"
            assert ours.recv() == "s"
            started = time.monotonic()
            if duration is None:  # the first child shows how long the call takes
                assert await asyncio.to_thread(ours.poll, 120) and ours.recv() == "d"
                duration = time.monotonic() - started
                await asyncio.to_thread(child.join)
            else:  # kill the others anywhere inside the call
                wait = duration * rnd.uniform(0.05, 1.1)
                await asyncio.sleep(wait)
                child.kill()
                await asyncio.to_thread(child.join)
                if child.exitcode == -signal.SIGKILL:
                    kills += 1
                else:
                    # Done before the kill: the first call was slower than
                    # these (a loaded machine, a cold cache), so aim earlier.
                    duration = min(duration, wait)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a torn last line
                count = len(await store.load_entries(sid))
            assert count in (0, self.kill_batch), (
                f"{count} of {self.kill_batch} entries of one append_entries call stored")
        assert kills >= self.kill_rounds // 2, f"only {kills} children were killed mid-call"

    async def test_s4_concurrent_appends_from_processes(self, store: Store) -> None:
        opener = self._child_opener()
        sid = await self.new_session(store)
        loop = asyncio.get_running_loop()
        with self._process_pool(self.process_count) as pool:
            chains = await asyncio.gather(*(
                loop.run_in_executor(pool, _process_append, opener, sid, w,
                                     self.process_appends)
                for w in range(self.process_count)
            ))
            winners = await asyncio.gather(*(
                loop.run_in_executor(pool, _process_create, opener, "conf-process-race")
                for _ in range(self.process_count)
            ))
        check_concurrent_log(await store.load_entries(sid), chains)
        assert sum(winners) == 1, winners

    # -- a retried batch is stored once (S25) ---------------------------------

    async def _stored_batch(
        self, store: Store
    ) -> tuple[str, list[MessageEntry], list[MessageEntry]]:
        sid = await self.new_session(store)
        before = [_chain_entry(None, 0, 0)]
        await store.append_entries(sid, before)
        batch = [_chain_entry(before[0].id, 0, 1)]
        batch += [_chain_entry(batch[0].id, 0, 2), _chain_entry(None, 0, 3)]
        await store.append_entries(sid, batch)
        return sid, before, batch

    async def test_s25_retried_batch_is_stored_once(self, store: Store) -> None:
        # The first half of the repeated-id rule (S8): a batch whose entries
        # are all stored already, the same bytes in the same order, is the
        # earlier append acknowledged late. It succeeds and stores nothing.
        sid, before, batch = await self._stored_batch(store)
        # The caller never heard back, so it sends the same batch again, maybe
        # over another connection, maybe more than once.
        await (await self.another_handle()).append_entries(sid, batch)
        await store.append_entries(sid, batch)
        await store.append_entries(sid, batch[1:])  # a tail of it is stored as well
        assert_same_entries(await store.load_entries(sid), before + batch)

    # -- watch (S26) ----------------------------------------------------------

    def _watchable(self, store: Store) -> WatchableStore:
        if not isinstance(store, WatchableStore):
            pytest.skip("this store offers no watch()")
        return store

    async def test_s26_watch_catches_up_then_follows(self, store: Store) -> None:
        watchable = self._watchable(store)
        sid = await self.new_session(store)
        first = [_chain_entry(None, 0, n) for n in range(3)]
        await store.append_entries(sid, first)
        watch = watchable.watch(sid)
        got = [await anext(watch) for _ in range(3)]
        later = [_chain_entry(first[-1].id, 1, n) for n in range(2)]
        await (await self.another_handle()).append_entries(sid, later)
        got += [await anext(watch) for _ in range(2)]
        await _aclose(watch)
        assert_same_entries(got, first + later)
        # Resuming after an entry starts right behind it; after the last, with nothing.
        assert await _watch_ids(store, sid, 3, after=first[1].id) == [
            e.id for e in [first[2], *later]]
        tail = watchable.watch(sid, after=later[-1].id)
        pending = asyncio.ensure_future(anext(tail))
        await asyncio.sleep(0)
        assert not pending.done()
        extra = _chain_entry(later[-1].id, 2, 0)
        await store.append_entries(sid, [extra])
        assert (await pending).id == extra.id
        await _aclose(tail)

    async def test_s26_watch_unknown_session_or_entry_is_an_error(self, store: Store) -> None:
        watchable = self._watchable(store)
        with pytest.raises(SessionNotFound):
            await anext(watchable.watch("conf-no-such-session"))
        sid = await self.new_session(store)
        await store.append_entries(sid, [_chain_entry(None, 0, 0)])
        with pytest.raises(StoreError) as info:
            await anext(watchable.watch(sid, after=new_id()))
        assert info.value.session_id == sid and "no such entry" in str(info.value)

    async def test_s26_three_watchers_see_every_append_once_in_order(
        self, store: Store
    ) -> None:
        # One writer (another process when the store can be opened there)
        # appends while three watchers follow; the third disconnects part way
        # and resumes, on a new handle, after the last id it got.
        self._watchable(store)
        count = self.watch_appends
        sid = await self.new_session(store)
        resumed_handle = await self.another_handle()

        async def resuming() -> list[str]:
            ids = await _watch_ids(store, sid, count, stop_after=count // 3)
            return ids + await _watch_ids(resumed_handle, sid, count - len(ids), after=ids[-1])

        watchers = [asyncio.ensure_future(_watch_ids(store, sid, count)),
                    asyncio.ensure_future(_watch_ids(await self.another_handle(), sid, count)),
                    asyncio.ensure_future(resuming())]
        opener = self.store_opener(self._tmp_path)
        if opener is not None:
            loop = asyncio.get_running_loop()
            with self._process_pool(1) as pool:
                appended = await loop.run_in_executor(
                    pool, _process_append_batches, opener, sid, count)
        else:
            appended = await _append_batches(await self.another_handle(), sid, count)
        # A watcher that skipped an entry would wait forever: give up, loudly.
        done, _ = await asyncio.wait(watchers, timeout=120)
        assert len(done) == 3, "a watcher did not receive every entry"
        assert [e.id for e in await store.load_entries(sid)] == appended
        for watcher in watchers:
            assert watcher.result() == appended

    async def test_s26_watch_delivers_entries_of_several_mebibytes(self, store: Store) -> None:
        watchable = self._watchable(store)
        sid = await self.new_session(store)
        big = MessageEntry(message=UserMessage.of("b" * (5 << 20)))
        small = _chain_entry(big.id, 0, 1)
        await store.append_entries(sid, [big, small])
        watch = watchable.watch(sid)
        got = [await anext(watch), await anext(watch)]
        await _aclose(watch)
        assert_same_entries(got, [big, small])
    # -- the linear capability (S32, when offered) -------------------------------

    def _linear(self, store: Store) -> LinearStore:
        if not isinstance(store, LinearStore):
            pytest.skip("store does not offer LinearStore (append_linear, load_entries_after)")
        return store

    async def test_s32_linear_append_chains_after_the_last_entry(self, store: Store) -> None:
        linear = self._linear(store)
        sid = await self.new_session(store)
        (first,) = await linear.append_linear(sid, [_chain_entry("not-there", 0, 0)])
        assert first.parent_id is None  # an empty log: the batch starts a root
        root, side = _chain_entry(None, 1, 0), _chain_entry(None, 1, 1)
        await store.append_entries(sid, [root, side])  # the last entry is a second root
        batch = [_chain_entry(root.id, 2, 0)]
        batch.append(_chain_entry(batch[0].id, 2, 1))
        stored = await linear.append_linear(sid, batch)
        assert [e.parent_id for e in stored] == [side.id, batch[0].id]
        loaded = await (await self.another_handle()).load_entries(sid)
        assert list(loaded) == [first, root, side, *stored]
        with pytest.raises(SessionNotFound):
            await linear.append_linear("conf-missing", batch)
        # The duplicate-id rule of append_entries: refused whole, nothing stored.
        fresh = _chain_entry(None, 3, 0)
        for repeating in ([fresh, batch[1]], [fresh, fresh]):
            with pytest.raises(StoreError) as caught:
                await linear.append_linear(sid, repeating)
            assert caught.value.session_id == sid
        assert list(await (await self.another_handle()).load_entries(sid)) == list(loaded)

    async def test_s32_retried_linear_batch_is_stored_once(self, store: Store) -> None:
        # S25 for append_linear: the first write re-chained the batch after the
        # last entry; a retry (the acknowledgement was lost) finds every id
        # stored as one run with its bytes, the first entry's parent apart.
        linear = self._linear(store)
        sid = await self.new_session(store)
        root = _chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        batch = [_chain_entry("unknown-parent", 1, 0)]
        batch.append(_chain_entry(batch[0].id, 1, 1))
        stored = await linear.append_linear(sid, batch)
        assert stored[0].parent_id == root.id
        other = self._linear(await self.another_handle())
        assert await other.append_linear(sid, batch) == stored
        assert await linear.append_linear(sid, batch) == stored
        assert list(await store.load_entries(sid)) == [root, *stored]
        # Later entries do not make it a new batch: still the same run.
        later = await linear.append_linear(sid, [_chain_entry(None, 2, 0)])
        assert await other.append_linear(sid, batch) == stored
        # Any other repeat is refused whole: a changed entry, a part of the
        # batch with a new id, the run in another order.
        changed = [batch[0], MessageEntry(id=batch[1].id, parent_id=batch[0].id,
                                          message=UserMessage.of("changed"))]
        for repeating in (changed, [*batch, _chain_entry(batch[1].id, 3, 0)],
                          [batch[1], batch[0]]):
            with pytest.raises(StoreError) as caught:
                await linear.append_linear(sid, repeating)
            assert caught.value.session_id == sid
        assert list(await (await self.another_handle()).load_entries(sid)) == [
            root, *stored, *later]

    async def test_s32_concurrent_linear_appends_form_one_path(self, store: Store) -> None:
        sid = await self.new_session(store)
        handles = [self._linear(store)] + [
            self._linear(await self.another_handle()) for _ in range(3)]

        async def writer(w: int) -> None:
            for n in range(10):
                first = _chain_entry(None, w, 2 * n)
                await handles[w % len(handles)].append_linear(
                    sid, [first, _chain_entry(first.id, w, 2 * n + 1)])

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
        linear = self._linear(store)
        sid = await self.new_session(store)
        assert await linear.load_entries_after(sid, None) == []
        entries = [_chain_entry(None, 0, 0)]
        for n in range(1, 5):
            entries.append(_chain_entry(entries[-1].id, 0, n))
        await store.append_entries(sid, entries)
        reader = self._linear(await self.another_handle())
        assert await reader.load_entries_after(sid, None) == entries
        assert await reader.load_entries_after(sid, entries[1].id) == entries[2:]
        assert await reader.load_entries_after(sid, entries[-1].id) == []
        with pytest.raises(EntryNotFound):
            await reader.load_entries_after(sid, "conf-no-such-entry")
        with pytest.raises(SessionNotFound):
            await reader.load_entries_after("conf-missing", None)
