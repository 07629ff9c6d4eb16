"""S39-S40: how a durable run hands its events over, and the copies it holds.

S39: events reach the consumer in the loop's order, each once, with the loop
at most a bounded number of events ahead (all of them already stored), and a
finished or abandoned run leaves no task behind. S40: the agent holds copies
equal to what the run gave it; later changes to the loop's objects or to a
receipt reach neither the agent nor the store, and an entry a copy would
change is refused before anything is stored.

Every test runs over the memory, file (fsync) and SQLite stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from threadline import durable
from threadline.agent import AgentLoop
from threadline.agent._events import AgentEvent, MessageEnd
from threadline.ai import ToolResult, tool
from threadline.ai._messages import AssistantMessage, TextPart, ToolResultMessage, UserMessage
from threadline.ai._model import LanguageModel, ModelInfo, Request, StreamEvent, StreamOptions
from threadline.durable import RunStarted, StoredMessageEnd
from threadline.durable._agent import _QUEUE_SIZE
from threadline.durable._retry import RETRY_DELAYS
from threadline.errors import AgentError, InvalidEntry, StoreError, StoreUnavailable
from threadline.session import MessageEntry
from threadline.stores import FileStore, MemoryStore, SQLiteStore, Store
from threadline.testing import Call, FaultyStore, ScriptedModel, Text, Turn


@pytest.fixture(params=["memory", "file", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "file":
        yield FileStore(tmp_path / "sessions")
    else:
        sqlite = SQLiteStore(tmp_path / "sessions.db")
        yield sqlite
        await sqlite.close()


class Counted:
    """A model that counts the stream events it has produced so far."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.produced = 0

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: Request, options: StreamOptions | None = None
                     ) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request, options):
            self.produced += 1
            yield event


@tool
async def lookup(step: int) -> str:
    """Look something up."""
    return f"step {step} done"


def long_script() -> list[Turn]:
    many = [f"w{i} " for i in range(3 * _QUEUE_SIZE)]
    return [Turn(Text(*many), Call("lookup", {"step": 1})),
            Turn(Text("more "), Call("lookup", {"step": 2})),
            Turn.text(*many)]


def _shape(events: list[Any]) -> list[tuple[str, Any]]:
    """Event types with what identifies them, for comparing two runs."""
    out: list[tuple[str, Any]] = []
    for ev in events:
        kind = getattr(ev, "type", type(ev).__name__)
        message = getattr(ev, "message", None)
        out.append((kind, type(message).__name__ if message is not None else None))
    return out


async def test_s39_events_arrive_in_loop_order_once_and_the_loop_stays_bounded_ahead(
    store: Store,
) -> None:
    bare_events: list[AgentEvent] = [
        ev async for ev in AgentLoop(ScriptedModel(long_script()), [lookup]).run(
            [], [UserMessage.of("go")])
    ]
    model = Counted(ScriptedModel(long_script()))
    agent = await durable.open(lambda: AgentLoop(model, [lookup]), store=store)
    seen: list[Any] = []
    lead = 0
    async for ev in agent.run("go"):
        seen.append(ev)
        deltas_seen = sum(1 for e in seen if getattr(e, "type", "") == "message_update")
        lead = max(lead, model.produced - deltas_seen)
        if len(seen) % 50 == 0:
            await asyncio.sleep(0.001)  # a slow consumer: the loop runs ahead meanwhile
    assert isinstance(seen[0], RunStarted)
    # The same events as the bare loop, in its order, each once (message ends
    # become receipts).
    assert _shape(seen[1:]) == _shape(bare_events)
    assert not any(type(ev) is MessageEnd for ev in seen)
    # It did run ahead, but never by more than the hand-off holds (plus the
    # event in the loop's hands and the one in the consumer's).
    assert 1 < lead <= _QUEUE_SIZE + 2
    # Input receipts repeat the RunStarted entries; everything else is stored once.
    receipts = dict.fromkeys(e.id for ev in seen if isinstance(ev, RunStarted | StoredMessageEnd)
                             for e in ev.entries)
    stored = await store.load_entries(agent.session_id)
    assert [e.id for e in stored] == list(receipts)


def _other_tasks() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


@pytest.mark.parametrize("stop_after", [None, 1, 3, 40, 300])
async def test_s39_a_finished_or_abandoned_run_leaves_no_task_behind(
    store: Store, stop_after: int | None,
) -> None:
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(long_script()), [lookup]),
                               store=store)
    async with agent.run("go") as run:
        count = 0
        async for _ in run:
            count += 1
            if count == stop_after:
                break
    assert _other_tasks() == []
    # The tail was stored: the agent appends again right away, and a reopen
    # sees a valid path.
    await agent.append(UserMessage.of("next"))
    reopened = await durable.open(None, store=store, session_id=agent.session_id)
    assert reopened.leaf_id == agent.leaf_id
    assert reopened.entries == agent.entries


class _Stubborn:
    """A loop that keeps producing after abort: a burst larger than the hand-off holds."""

    async def run(self, context: Any, input: Any, *, abort: asyncio.Event | None = None
                  ) -> AsyncIterator[AgentEvent]:
        from threadline.agent._events import AgentEnd, AgentStart, MessageStart, MessageUpdate
        from threadline.ai._model import TextDelta

        yield AgentStart()
        for message in input:
            yield MessageStart(message)
            yield MessageEnd(message)
        reply = AssistantMessage(content=(TextPart(text="done"),))
        yield MessageStart(reply)
        for _ in range(3 * _QUEUE_SIZE):
            await asyncio.sleep(0)  # the consumer may run (and leave) meanwhile
            yield MessageUpdate(TextDelta(0, "x"))
        yield MessageEnd(reply)
        yield AgentEnd((reply,))


async def test_s39_a_loop_that_runs_on_after_its_consumer_left_is_stored_and_ends(
    store: Store,
) -> None:
    agent = await durable.open(_Stubborn, store=store)
    async with asyncio.timeout(10):
        async with agent.run("go") as run:
            async for ev in run:
                if getattr(ev, "type", "") == "message_update":
                    break
    # The loop ignored abort and produced far more than the buffer holds
    # with nobody taking it: the pump dropped it, stored the tail and ended.
    assert _other_tasks() == []
    stored = await store.load_entries(agent.session_id)
    assert [e.message.text for e in stored if isinstance(e, MessageEntry)] == ["go", "done"]
    assert stored == agent.entries


async def test_s39_a_second_consumer_of_one_run_gets_the_generator_error(store: Store) -> None:
    gate = asyncio.Event()

    @tool
    async def wait() -> str:
        """Wait for the test."""
        await gate.wait()
        return "ok"

    script = [Turn(Text("a"), Call("wait", {})), Turn.text("done")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [wait]), store=store)
    run = agent.run("go")
    first: list[Any] = []
    while not (first and getattr(first[-1], "type", "") == "tool_execution_start"):
        first.append(await run.__anext__())
    # The consumer's next step waits inside the run; another task stepping
    # the same run meanwhile is refused, as with any async generator.
    pending = asyncio.ensure_future(run.__anext__())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already running"):
        await run.__anext__()
    gate.set()
    rest = [await pending] + [ev async for ev in run]
    assert getattr(rest[-1], "type", "") == "agent_end"
    assert rest[-1].error is None


# -- S40 -----------------------------------------------------------------------


async def test_s40_changing_the_loops_objects_after_the_event_changes_nothing_held(
    store: Store,
) -> None:
    kept: list[dict[str, Any]] = []
    asked: AssistantMessage | None = None

    @tool
    async def report(q: str) -> ToolResult:
        """Report with details the tool keeps a handle on."""
        details = {"rows": [1, 2], "note": "first", "q": q}
        kept.append(details)
        return ToolResult.text("done", details=details)

    script = [Turn(Text("checking"), Call("report", {"q": "x"})), Turn.text("ok")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [report]),
                               store=store)
    async for ev in agent.run("go"):
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, ToolResultMessage):
            # The tool changes what it returned, and the consumer changes the
            # receipt's message and entry, after the result is stored.
            kept[0]["note"] = "changed by the tool"
            ev.message.details["rows"].append(3)
            entry = ev.entries[0]
            assert isinstance(entry, MessageEntry)
            assert isinstance(entry.message, ToolResultMessage)
            assert entry.message.details == {"rows": [1, 2], "note": "first", "q": "x"}
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, AssistantMessage) and \
                ev.message.tool_calls:
            asked = ev.message
    # After the run, the consumer changes the call it was shown.
    assert asked is not None
    asked.tool_calls[0].arguments["q"] = "changed"
    reopened = await durable.open(None, store=store, session_id=agent.session_id)
    assert reopened.entries == agent.entries
    results = [e.message for e in agent.entries if isinstance(e, MessageEntry)
               and isinstance(e.message, ToolResultMessage)]
    assert [r.details for r in results] == [{"rows": [1, 2], "note": "first", "q": "x"}]
    calls = [c for e in agent.entries if isinstance(e, MessageEntry)
             for c in getattr(e.message, "tool_calls", ())]
    assert [c.arguments for c in calls] == [{"q": "x"}]


@pytest.mark.parametrize("details", [
    pytest.param((1, 2), id="tuple"),  # a copy would hold a list
    pytest.param({"at": datetime(2026, 1, 1, tzinfo=UTC)}, id="datetime"),  # JSON gives a str
    pytest.param({1: "x"}, id="int-key"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(b"raw", id="bytes"),
    # One level of string keys is copied with dict() rather than round-tripped:
    # what is inside must still be refused.
    pytest.param({"x": float("nan")}, id="nan-in-a-flat-dict"),
    pytest.param({"x": (1, 2)}, id="tuple-in-a-flat-dict"),
    pytest.param({"x": b"raw"}, id="bytes-in-a-flat-dict"),
])
async def test_s40_a_result_a_copy_would_change_fails_the_run_and_stores_nothing(
    store: Store, details: Any,
) -> None:
    @tool
    async def odd() -> ToolResult:
        """Return details JSON cannot carry exactly."""
        return ToolResult.text("done", details=details)

    script = [Turn(Text("checking"), Call("odd", {})), Turn.text("never")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [odd]), store=store)
    seen: list[Any] = []
    with pytest.raises(InvalidEntry) as info:
        async for ev in agent.run("go"):
            seen.append(ev)
    assert info.value.session_id == agent.session_id
    assert not any(isinstance(ev, StoredMessageEnd) and isinstance(ev.message, ToolResultMessage)
                   for ev in seen)
    stored = await store.load_entries(agent.session_id)
    assert stored == agent.entries
    assert not any(isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)
                   for e in stored)


async def test_s40_flat_details_and_arguments_are_copied_not_shared(store: Store) -> None:
    # A flat dict (string keys, scalars) is held as a dict() copy: changing the
    # loop's dict after the event, at its only level, must not reach the copy.
    kept: list[dict[str, Any]] = []

    @tool
    async def report(q: str, n: int) -> ToolResult:
        """Report with flat details the tool keeps a handle on."""
        details = {"note": "first", "n": n, "ok": True, "none": None, "f": 1.5}
        kept.append(details)
        return ToolResult.text("done", details=details)

    script = [Turn(Text("checking"), Call("report", {"q": "x", "n": 1})), Turn.text("ok")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [report]),
                               store=store)
    async for ev in agent.run("go"):
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, ToolResultMessage):
            kept[0]["note"] = "changed by the tool"
            del kept[0]["n"]
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, AssistantMessage) and \
                ev.message.tool_calls:
            ev.message.tool_calls[0].arguments["q"] = "changed"
            ev.message.tool_calls[0].arguments["extra"] = 2
    reopened = await durable.open(None, store=store, session_id=agent.session_id)
    assert reopened.entries == agent.entries
    results = [e.message for e in agent.entries if isinstance(e, MessageEntry)
               and isinstance(e.message, ToolResultMessage)]
    assert [r.details for r in results] == [
        {"note": "first", "n": 1, "ok": True, "none": None, "f": 1.5}]
    calls = [c for e in agent.entries if isinstance(e, MessageEntry)
             for c in getattr(e.message, "tool_calls", ())]
    assert [c.arguments for c in calls] == [{"q": "x", "n": 1}]


async def test_s40_nested_arguments_are_copied_to_the_bottom(store: Store) -> None:
    # One nested value sends the whole message through the full copy; a
    # dict() copy would share the inner list.
    @tool
    async def find(q: str, tags: list[str]) -> str:
        """Find."""
        return "found"

    script = [Turn(Call("find", {"q": "x", "tags": ["a"]})), Turn.text("ok")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [find]), store=store)
    async for ev in agent.run("go"):
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, AssistantMessage) and \
                ev.message.tool_calls:
            ev.message.tool_calls[0].arguments["tags"].append("changed")
    calls = [c for e in agent.entries if isinstance(e, MessageEntry)
             for c in getattr(e.message, "tool_calls", ())]
    assert [c.arguments for c in calls] == [{"q": "x", "tags": ["a"]}]
    assert (await store.load_entries(agent.session_id)) == agent.entries


def _model_check(model: LanguageModel) -> None:
    """Counted satisfies the protocol (checked by mypy)."""


_model_check(Counted(ScriptedModel([])))


@pytest.mark.parametrize("content", [
    pytest.param(lambda: (TextPart(text=["not", "a", "string"]),), id="list-in-a-text-part"),
    pytest.param(lambda: [TextPart(text="a list, not a tuple")], id="content-list"),
    pytest.param(lambda: (TextPart(text="\ud800"),), id="lone-surrogate"),
])
async def test_s40_a_message_with_nothing_free_form_is_still_checked_before_it_is_held(
    store: Store, content: Any,
) -> None:
    # A result without details holds nothing mutable, so the agent keeps the
    # entry itself rather than a copy; the store's check still stands between
    # a wrongly typed value and the log.
    @tool
    async def odd() -> ToolResult:
        """Return content that is not what its types say."""
        return ToolResult(content=content())

    script = [Turn(Text("checking"), Call("odd", {})), Turn.text("never")]
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(script), [odd]), store=store)
    with pytest.raises(InvalidEntry):
        await agent.run("go").collect()
    stored = await store.load_entries(agent.session_id)
    assert stored == agent.entries
    assert not any(isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)
                   for e in stored)


async def test_s25_a_run_retries_its_message_appends_like_any_other() -> None:
    # The run makes each message's first append attempt itself (one call
    # less per message); the retries after a lost connection are the same.
    memory = MemoryStore()
    store = FaultyStore(memory, fail_append_on=range(2, 100),
                        error=StoreUnavailable("server down", session_id="s"))
    agent = await durable.open(durable.model(ScriptedModel([Turn.text("hello")])),
                               store=store, session_id="s")
    seen: list[Any] = []
    with pytest.raises(StoreUnavailable, match="server down"):
        async for ev in agent.run("hi"):
            seen.append(ev)
    assert store.append_calls == 1 + len(RETRY_DELAYS) + 1  # the input, then the reply's tries
    assert not any(isinstance(ev, StoredMessageEnd) and isinstance(ev.message, AssistantMessage)
                   for ev in seen)
    assert [e.id for e in await memory.load_entries("s")] == [e.id for e in agent.entries]


async def test_s39_a_run_iterated_without_keeping_it_still_knows_its_consumer(
    store: Store,
) -> None:
    # ``async for`` over ``agent.run(...)`` keeps no reference to the Run
    # object itself, only to what its ``__aiter__`` gave: a mutation from the
    # loop body must still be refused, not wait for itself, and once the
    # loop is left with break the run is closed and the mutation waits for it.
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(long_script()), [lookup]),
                               store=store)
    async with asyncio.timeout(10):
        async for ev in agent.run("go"):
            if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, ToolResultMessage):
                with pytest.raises(AgentError, match="inside its own run"):
                    await agent.append(UserMessage.of("no"))
                break
        (after,) = await agent.append(UserMessage.of("yes"))
    assert agent.leaf_id == after.id
    assert _other_tasks() == []
    reopened = await durable.open(None, store=store, session_id=agent.session_id)
    assert reopened.entries == agent.entries


# -- S48 -----------------------------------------------------------------------


def _tool_script() -> list[Turn]:
    return [Turn(Text("checking"), Call("lookup", {"step": 1})),
            Turn(Text("again"), Call("lookup", {"step": 2})),
            Turn.text("done")]


async def test_s48_a_run_holds_copies_of_what_it_stored() -> None:
    store = MemoryStore()
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(_tool_script()), [lookup]),
                               store=store)
    given: list[Any] = []
    async for ev in agent.run("go"):
        if isinstance(ev, StoredMessageEnd):
            given.append(ev.message)
    stored = await store.load_entries(agent.session_id)
    assert stored == agent.entries and len(stored) == 6
    held = [e.message for e in agent.entries if isinstance(e, MessageEntry)]
    assert held == given
    assert not any(h is g for h, g in zip(held, given, strict=True))


class _CountingMemory(MemoryStore):
    """A memory store whose own ``append_entries`` counts what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.appended = 0

    async def append_entries(self, session_id: str, entries: Any) -> None:
        self.appended += len(entries)
        await super().append_entries(session_id, entries)


async def test_s48_a_store_that_overrides_append_entries_gets_every_append() -> None:
    store = _CountingMemory()
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(_tool_script()), [lookup]),
                               store=store)
    await agent.run("go").collect()
    await agent.append(UserMessage.of("more"))
    assert store.appended == len(await store.load_entries(agent.session_id)) == 7


async def test_s48_a_wrapper_that_passes_attributes_on_is_not_bypassed() -> None:
    # FaultyStore passes unknown attributes to the store it wraps; the agent
    # must still append through the wrapper, so the fault it injects is met.
    memory = MemoryStore()
    store = FaultyStore(memory, fail_append_on=3)
    agent = await durable.open(lambda: AgentLoop(ScriptedModel(_tool_script()), [lookup]),
                               store=store)
    seen: list[Any] = []
    with pytest.raises(StoreError):
        async for ev in agent.run("go"):
            seen.append(ev)
    # The input and the first reply were stored; the tool result's append failed.
    assert store.append_calls == 3
    receipts = [ev for ev in seen if isinstance(ev, StoredMessageEnd)]
    assert [type(ev.message) for ev in receipts] == [UserMessage, AssistantMessage]
    assert [e.id for e in await memory.load_entries(agent.session_id)] == \
        [e.id for e in agent.entries]
