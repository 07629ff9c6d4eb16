"""The durable agent, contract point by contract point (S1-S13).

Every test runs over the memory store, the file store (real files under
``tmp_path``, fsync on) and the SQLite store. ``Backend.reopen()`` returns a
second handle on the same storage (for the memory store, the same object), so a
test can check what is really stored, not what one agent remembers. Crashes of
real processes (S4, S11, S12 with ``kill -9``) are in ``test_durable_crash.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from threadline import durable
from threadline.agent._events import AgentEnd, MessageEnd, MessageUpdate
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._model import TextDelta, TextEnd
from threadline.ai._tools import tool
from threadline.durable import (
    DurableAgent,
    LifecycleEvent,
    PublishError,
    RunStarted,
    SessionBranched,
    SessionCompacted,
    SessionCreated,
    SessionForked,
    StoredMessageEnd,
)
from threadline.errors import (
    AgentError,
    EntryNotFound,
    InvalidSessionId,
    NoLoopError,
    SessionNotFound,
    StoreError,
    ToolError,
)
from threadline.session import (
    CompactionEntry,
    CustomEntry,
    Entry,
    MessageEntry,
    SessionRecord,
    build_context,
    fold_metadata,
    register_custom,
)
from threadline.session._codec import decode_entry, encode_entry
from threadline.stores import CatalogStore, FileStore, MemoryStore, SQLiteStore, Store
from threadline.testing import (
    Call,
    Delay,
    FaultyStore,
    Gate,
    ScriptedModel,
    Text,
    Turn,
    assert_valid_for_providers,
)

T = TypeVar("T")

# -- backends ------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    tmp: Path
    fast: bool = False
    """Skip fsync: for loops of many short runs where durability is not the point."""
    _opened: list[Any] = field(default_factory=list)
    _memory: MemoryStore | None = None

    def reopen(self) -> Store:
        """A new handle on the same storage (the memory store has only one)."""
        if self.name == "memory":
            if self._memory is None:
                self._memory = MemoryStore()
            return self._memory
        if self.name == "file":
            return FileStore(self.tmp / "sessions", durability="flush" if self.fast else "fsync")
        store = SQLiteStore(self.tmp / "sessions.db",
                            synchronous="NORMAL" if self.fast else "FULL")
        self._opened.append(store)
        return store

    async def close(self) -> None:
        for store in self._opened:
            await store.close()


@pytest.fixture(params=["memory", "file", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    b = Backend(request.param, tmp_path)
    yield b
    await b.close()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.reopen()


class CountingStore:
    """Passes everything through and records the calls of the three methods."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str, int]] = []

    async def create_session(self, record: SessionRecord) -> None:
        self.calls.append(("create_session", record.id, 0))
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        self.calls.append(("load_entries", session_id, 0))
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        self.calls.append(("append_entries", session_id, len(entries)))
        await self.inner.append_entries(session_id, entries)

    def count(self, method: str, session_id: str | None = None) -> int:
        return sum(1 for m, s, _ in self.calls if m == method and session_id in (None, s))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def in_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a fresh event loop in another thread.

    A publisher is synchronous; this is how it can look into the store.
    """
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result(timeout=30)


# -- a scripted conversation ------------------------------------------------------


@tool
async def get_weather(city: str) -> str:
    """Weather for a city."""
    await asyncio.sleep(0.001)
    return f"18C in {city}"


never = asyncio.Event  # an Event nobody sets: a tool or turn that hangs until aborted


def multi_tool_script() -> list[Turn]:
    """Three turns, three tool calls; seven store appends when run to the end."""
    return [
        Turn(
            Text("Let me ", "check."), Delay(0.001),
            Call("get_weather", {"city": "Lisbon"}), Call("get_weather", {"city": "Porto"}),
        ),
        Turn(Text("One more."), Delay(0.001), Call("get_weather", {"city": "Faro"})),
        Turn(Text("All ", "sunny ", "today."), Delay(0.001), Text(" Bye.")),
    ]


def weather_factory(script: list[Turn] | None = None, **options: Any) -> durable.Factory:
    return durable.model(ScriptedModel(script or multi_tool_script()), [get_weather], **options)


def messages_of(path: Sequence[Entry]) -> list[Message]:
    return [e.message for e in path if isinstance(e, MessageEntry)]


def assert_calls_answered(path: Sequence[Entry]) -> None:
    """The raw stored path, not a context built from it: right after every
    assistant message with tool calls come exactly its results."""
    msgs = messages_of(path)
    i = 0
    while i < len(msgs):
        m = msgs[i]
        i += 1
        if isinstance(m, ToolResultMessage):
            raise AssertionError(f"message {i - 1}: result {m.tool_call_id!r} answers no call")
        if not isinstance(m, AssistantMessage) or not m.tool_calls:
            continue
        pending = {c.id for c in m.tool_calls}
        while pending:
            r = msgs[i] if i < len(msgs) else None
            if m.stop_reason == "error" and not isinstance(r, ToolResultMessage):
                break  # a failed request's calls never ran: results are optional
            if not isinstance(r, ToolResultMessage) or r.tool_call_id not in pending:
                raise AssertionError(f"message {i}: calls {sorted(pending)} unanswered, got {r!r}")
            pending.discard(r.tool_call_id)
            i += 1


async def assert_stored_path_valid(backend: Backend, session_id: str) -> DurableAgent:
    """Reopen (which repairs) and check the raw path and the model context."""
    agent = await durable.open(None, store=backend.reopen(), session_id=session_id)
    assert_calls_answered(agent.path())
    assert_valid_for_providers(build_context(agent.path()))
    return agent


async def stored_ids(backend: Backend, session_id: str) -> list[str]:
    return [e.id for e in await backend.reopen().load_entries(session_id)]


def receipts(events: Sequence[Any]) -> list[Entry]:
    """The entries the forwarded events reported, each once, in order."""
    out: dict[str, Entry] = {}
    for ev in events:
        if isinstance(ev, RunStarted | StoredMessageEnd):
            out.update((e.id, e) for e in ev.entries)
    return list(out.values())


# -- S1 --------------------------------------------------------------------------


async def test_s1_generated_id_is_reported_and_stored(backend: Backend, store: Store) -> None:
    published: list[LifecycleEvent] = []
    a = await durable.open(None, store=store, publisher=published.append)
    b = await durable.open(None, store=store)
    assert isinstance(a.session_id, str) and a.session_id
    assert a.session_id != b.session_id
    assert published == [SessionCreated(session_id=a.session_id, parent_id=None)]
    assert await backend.reopen().load_entries(a.session_id) == []


async def test_s1_application_id_is_opaque(backend: Backend, store: Store) -> None:
    sid = "User 42/chat:Ω ../x"
    agent = await durable.open(None, store=store, session_id=sid)
    assert agent.session_id == sid
    await agent.append(UserMessage.of("hi"))
    again = await durable.open(None, store=backend.reopen(), session_id=sid)
    assert again.session_id == sid
    assert messages_of(again.entries) == [UserMessage.of("hi")]


async def test_s1_empty_session_id_is_refused(store: Store) -> None:
    with pytest.raises(InvalidSessionId, match="non-empty"):
        await durable.open(None, store=store, session_id="")
    with pytest.raises(InvalidSessionId, match="NUL"):
        await durable.open(None, store=store, session_id="a\x00b")


# -- S2 --------------------------------------------------------------------------


async def test_s2_unknown_id_creates_known_id_resumes(backend: Backend) -> None:
    counting = CountingStore(backend.reopen())
    published: list[LifecycleEvent] = []
    agent = await durable.open(None, store=counting, session_id="s2", publisher=published.append)
    assert counting.count("create_session") == 1
    assert published == [SessionCreated(session_id="s2", parent_id=None)]
    assert agent.entries == [] and agent.leaf is None
    written = await agent.append(UserMessage.of("one"), UserMessage.of("two"))

    counting2 = CountingStore(backend.reopen())
    published.clear()
    resumed = await durable.open(None, store=counting2, session_id="s2",
                                 publisher=published.append)
    assert counting2.count("create_session") == 0 and counting2.count("append_entries") == 0
    assert published == []  # resuming is not a lifecycle event
    assert [e.id for e in resumed.entries] == [e.id for e in written]
    assert resumed.entries == written
    assert resumed.leaf_id == written[-1].id
    assert resumed.messages() == agent.messages()
    assert not hasattr(durable, "resume") and not hasattr(resumed, "resume")


async def test_s2_leaf_after_resume_is_last_appended_not_longest_branch(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s2b")
    root, a1, _u2, _a2 = await agent.append(
        UserMessage.of("q"), AssistantMessage(content=(TextPart(text="a"),)),
        UserMessage.of("q2"), AssistantMessage(content=(TextPart(text="a2"),)),
    )
    agent.branch(root.id)
    (side,) = await agent.append(AssistantMessage(content=(TextPart(text="other"),)))
    resumed = await durable.open(None, store=backend.reopen(), session_id="s2b")
    assert resumed.leaf_id == side.id
    assert [e.id for e in resumed.path()] == [root.id, side.id]
    assert [e.id for e in resumed.children(root.id)] == [a1.id, side.id]


class SlowLoadStore(CountingStore):
    async def load_entries(self, session_id: str) -> list[Entry]:
        try:
            return await super().load_entries(session_id)
        finally:
            await asyncio.sleep(0.02)  # widen the window between load and create


async def test_s2_two_opens_racing_on_a_new_id_both_resume_it(backend: Backend) -> None:
    published: list[LifecycleEvent] = []
    stores = [SlowLoadStore(backend.reopen()), SlowLoadStore(backend.reopen())]
    one, two = await asyncio.gather(*(
        durable.open(None, store=s, session_id="race", publisher=published.append)
        for s in stores
    ))
    assert sum(s.count("create_session") for s in stores) == 2  # both tried, one won
    assert published == [SessionCreated(session_id="race", parent_id=None)]
    await one.append(UserMessage.of("a"))
    await two.append(UserMessage.of("b"))
    assert len(await backend.reopen().load_entries("race")) == 2


# -- S3 --------------------------------------------------------------------------


async def test_s3_none_factory_records_but_cannot_run(backend: Backend, store: Store) -> None:
    agent = await durable.open(None, store=store, session_id="s3")
    assert agent.factory is None
    u, a = await agent.append(UserMessage.of("q"), AssistantMessage(content=(TextPart(text="a"),)))
    assert agent.get(a.id) == a and agent.children(u.id) == [a]
    agent.branch(u.id)
    (b,) = await agent.append(AssistantMessage(content=(TextPart(text="b"),)))
    assert [e.id for e in agent.path()] == [u.id, b.id]
    child = await agent.fork()
    assert child.factory is None and child.messages() == agent.messages()
    before = await stored_ids(backend, "s3")
    with pytest.raises(NoLoopError, match=r"without a factory.*no agent loop") as info:
        agent.run("go")
    assert "s3" in str(info.value)
    with pytest.raises(NoLoopError):
        child.run("go")
    assert await stored_ids(backend, "s3") == before  # nothing written by the failed run


async def test_s3_model_helper_builds_a_loop_per_run_and_checks_tools_early(store: Store) -> None:
    with pytest.raises(ToolError, match="get_weather"):
        durable.model(ScriptedModel(), [get_weather, get_weather])
    lm = ScriptedModel([Turn.text("one"), Turn.text("two")])
    factory = durable.model(lm, [get_weather], system="be brief", max_turns=3)
    assert factory() is not factory()
    agent = await durable.open(factory, store=store)
    await agent.run("a").collect()
    await agent.run("b").collect()
    assert [r.system for r in lm.requests] == ["be brief", "be brief"]
    assert [m.text for m in agent.messages()] == ["a", "one", "b", "two"]


# -- S4 --------------------------------------------------------------------------


async def test_s4_two_agents_in_one_process_grow_siblings(backend: Backend) -> None:
    seed = await durable.open(None, store=backend.reopen(), session_id="s4")
    (root,) = await seed.append(UserMessage.of("start"))
    one = await durable.open(None, store=backend.reopen(), session_id="s4")
    two = await durable.open(None, store=backend.reopen(), session_id="s4")
    (x,) = await one.append(UserMessage.of("from one"))
    (y,) = await two.append(UserMessage.of("from two"))
    assert x.parent_id == root.id and y.parent_id == root.id
    resumed = await durable.open(None, store=backend.reopen(), session_id="s4")
    assert [e.id for e in resumed.children(root.id)] == [x.id, y.id]
    assert resumed.leaf_id == y.id
    assert len(resumed.entries) == 3


async def test_s4_two_concurrent_runs_in_one_process(backend: Backend) -> None:
    seed = await durable.open(None, store=backend.reopen(), session_id="s4r")
    (root,) = await seed.append(UserMessage.of("start"))
    one = await durable.open(weather_factory(), store=backend.reopen(), session_id="s4r")
    two = await durable.open(weather_factory(), store=backend.reopen(), session_id="s4r")
    ev1, ev2 = await asyncio.gather(one.run("first").collect(), two.run("second").collect())
    r1, r2 = receipts(ev1), receipts(ev2)
    assert len(r1) == len(r2) == 7
    resumed = await durable.open(None, store=backend.reopen(), session_id="s4r")
    stored = {e.id: e for e in resumed.entries}
    assert len(stored) == 15
    for mine in (r1, r2):
        # Each run is one chain hanging off the leaf its agent loaded.
        assert mine[0].parent_id == root.id
        for prev, nxt in itertools.pairwise(mine):
            assert stored[nxt.id].parent_id == prev.id
        path = resumed.tree.path(mine[-1].id)
        assert_calls_answered(path)
        assert_valid_for_providers(build_context(path))
    assert resumed.leaf_id == resumed.entries[-1].id
    assert resumed.leaf_id in {r1[-1].id, r2[-1].id}


# -- S5 --------------------------------------------------------------------------

TRANSCRIPT_STATE = {
    "_factory", "_store", "_session_id", "_tree", "_publisher", "_lock", "_run_task",
    "_run_owner", "repaired", "diagnostics", "_compaction", "_approval", "_budget", "_synced_id",
    "_title",  # the title hook, configuration like _compaction (S61)
}


async def test_s5_agent_holds_only_transcript_state(backend: Backend) -> None:
    agent = await durable.open(weather_factory(), store=backend.reopen(), session_id="s5")
    assert set(vars(agent)) == TRANSCRIPT_STATE
    await agent.run("weather?").collect()
    agent.branch(agent.path()[0].id)
    await agent.append(UserMessage.of("side"))
    await agent.compact("summary", agent.path()[-1].id)
    await agent.fork()
    assert set(vars(agent)) == TRANSCRIPT_STATE
    # Everything it knows comes back from the store: a fresh agent sees the same.
    fresh = await durable.open(None, store=backend.reopen(), session_id="s5")
    assert fresh.entries == agent.entries
    assert fresh.leaf_id == agent.leaf_id
    assert fresh.messages() == agent.messages()


class _HeldCreate:
    """Passes through to ``inner``; ``create_session`` waits until ``release`` is set."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def create_session(self, record: SessionRecord) -> None:
        self.entered.set()
        await self.release.wait()
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, entries)


async def test_s27_branch_cannot_pull_the_path_from_under_a_waiting_compaction(
    store: Store,
) -> None:
    await store.create_session(SessionRecord(id="race"))
    held = _HeldCreate(store)
    agent = await durable.open(None, store=held, session_id="race")
    first, kept = await agent.append(UserMessage.of("a"), UserMessage.of("b"))
    fork = asyncio.create_task(agent.fork("race-child"))  # holds the session while held
    await held.entered.wait()
    compact = asyncio.create_task(agent.compact("s", kept.id))  # waits for the fork
    await asyncio.sleep(0)
    with pytest.raises(AgentError, match="in flight"):
        agent.branch(first.id)  # would take ``kept`` off the path compact was called on
    held.release.set()
    await fork
    entry = await compact
    assert [e.id for e in await store.load_entries("race")] == [first.id, kept.id, entry.id]


async def test_s5_session_record_carries_no_application_metadata(store: Store) -> None:
    assert set(SessionRecord.__struct_fields__) == {"id", "parent_id", "created_at"}
    agent = await durable.open(None, store=store)
    for name in ("title", "mode", "model"):
        assert not hasattr(agent, name)
    # Metadata is entries in the log (S61); the agent folds what it loaded, holds no more.
    await agent.set_metadata(title="t")
    assert agent.metadata == fold_metadata(agent.entries)
    assert set(SessionRecord.__struct_fields__) == {"id", "parent_id", "created_at"}


# -- S6 --------------------------------------------------------------------------


async def test_s6_record_written_once_with_fork_lineage(backend: Backend) -> None:
    counting = CountingStore(backend.reopen())
    agent = await durable.open(weather_factory(), store=counting, session_id="s6")
    managed = backend.reopen()
    assert isinstance(managed, CatalogStore)
    record = await managed.load_session("s6")
    assert record.parent_id is None
    await agent.run("weather?").collect()
    await agent.compact("sum", agent.path()[0].id)
    child = await agent.fork("s6-child")
    await durable.open(None, store=counting, session_id="s6")
    await durable.open(None, store=counting, session_id="s6-child")
    assert counting.count("create_session", "s6") == 1
    assert counting.count("create_session", "s6-child") == 1
    assert await managed.load_session("s6") == record  # never updated
    child_record = await managed.load_session(child.session_id)
    assert child_record.parent_id == "s6"
    grandchild = await child.fork()
    assert (await managed.load_session(grandchild.session_id)).parent_id == "s6-child"


# -- S7 --------------------------------------------------------------------------


class ThreeMethodStore:
    """The smallest store there is: exactly the contract, nothing else."""

    def __init__(self) -> None:
        self.logs: dict[str, list[bytes]] = {}

    async def create_session(self, record: SessionRecord) -> None:
        assert record.id not in self.logs
        self.logs[record.id] = []

    async def load_entries(self, session_id: str) -> list[Entry]:
        if session_id not in self.logs:
            raise SessionNotFound(session_id)
        return [decode_entry(line) for line in self.logs[session_id]]

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if session_id not in self.logs:
            raise SessionNotFound(session_id)
        self.logs[session_id].extend(encode_entry(e) for e in entries)


async def test_s7_custom_store_with_three_methods_serves_the_agent() -> None:
    store = ThreeMethodStore()
    assert isinstance(store, Store) and not isinstance(store, CatalogStore)
    agent = await durable.open(weather_factory(), store=store, session_id="s7")
    events = await agent.run("weather?").collect()
    assert isinstance(events[-1], AgentEnd) and events[-1].error is None
    await agent.compact("it was sunny", agent.path()[-1].id)
    child = await agent.fork()
    assert len(store.logs[child.session_id]) == len(agent.path())
    # A crash left an open call: repair works through the same three methods.
    await agent.append(AssistantMessage(
        content=(ToolCall(id="c9", name="get_weather", arguments={"city": "Braga"}),),
        stop_reason="tool_use",
    ))
    resumed = await durable.open(None, store=store, session_id="s7")
    assert len(resumed.repaired) == 1
    assert resumed.entries == await store.load_entries("s7")
    assert_calls_answered(resumed.path())


# -- S8 --------------------------------------------------------------------------


async def test_s8_entries_in_append_order_and_leaf_is_last_appended(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s8")
    written: list[Entry] = []
    written += await agent.append(UserMessage.of("0"))
    for i in range(1, 6):
        agent.branch(written[(i * 7) % len(written)].id)
        written += await agent.append(UserMessage.of(str(i)))
    resumed = await durable.open(None, store=backend.reopen(), session_id="s8")
    assert [e.id for e in resumed.entries] == [e.id for e in written]
    assert resumed.leaf_id == written[-1].id
    for e in written:
        assert resumed.get(e.id).parent_id == e.parent_id
    with pytest.raises(EntryNotFound, match="s8"):
        resumed.get("nope")


# -- S9 --------------------------------------------------------------------------


class Bookmark(msgspec.Struct, frozen=True):
    label: str
    entry_id: str


register_custom("test_durable.bookmark", Bookmark)


async def test_s9_custom_entries_decode_to_registered_class(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s9")
    (u,) = await agent.append(UserMessage.of("hi"))
    (c,) = await agent.append(
        CustomEntry(kind="test_durable.bookmark", data=Bookmark(label="start", entry_id=u.id))
    )
    (raw,) = await agent.append(CustomEntry(kind="test_durable.unknown", data={"x": [1, 2]}))
    resumed = await durable.open(None, store=backend.reopen(), session_id="s9")
    got = resumed.get(c.id)
    assert isinstance(got, CustomEntry) and got.data == Bookmark(label="start", entry_id=u.id)
    assert isinstance(got.data, Bookmark) and got.parent_id == u.id
    bare = resumed.get(raw.id)
    assert isinstance(bare, CustomEntry) and bare.kind == "test_durable.unknown"
    assert isinstance(bare.data, msgspec.Raw)
    assert msgspec.json.decode(bare.data) == {"x": [1, 2]}
    assert resumed.messages() == [UserMessage.of("hi")]  # custom entries are not context
    # Fork copies the unregistered entry losslessly.
    child = await resumed.fork()
    reloaded = await backend.reopen().load_entries(child.session_id)
    copy = reloaded[-1]
    assert isinstance(copy, CustomEntry) and isinstance(copy.data, msgspec.Raw)
    assert bytes(copy.data) == bytes(bare.data) and copy.origin_id == raw.id


# -- S10 -------------------------------------------------------------------------


async def branched_session(agent: DurableAgent) -> tuple[list[Entry], list[Entry]]:
    """A tree with an abandoned branch; returns (all written, active path)."""
    u1, a1, u2 = await agent.append(
        UserMessage.of("q1"), AssistantMessage(content=(TextPart(text="a1"),)),
        UserMessage.of("abandoned"),
    )
    agent.branch(a1.id)
    u3, a3 = await agent.append(
        UserMessage.of("q3"), AssistantMessage(content=(TextPart(text="a3"),))
    )
    return [u1, a1, u2, u3, a3], [u1, a1, u3, a3]


async def test_s10_fork_copies_active_path_rechained_in_one_batch(backend: Backend) -> None:
    counting = CountingStore(backend.reopen())
    published: list[LifecycleEvent] = []
    factory = weather_factory()
    agent = await durable.open(factory, store=counting, session_id="s10",
                               publisher=published.append)
    _, active = await branched_session(agent)
    (comp,) = [await agent.compact("short", active[2].id)]
    active.append(comp)
    source_before = await backend.reopen().load_entries("s10")
    published.clear()
    counting.calls.clear()

    child = await agent.fork()
    assert child.session_id != "s10"
    assert [c[0] for c in counting.calls] == ["create_session", "append_entries"]
    assert counting.calls[1] == ("append_entries", child.session_id, len(active))
    assert published == [
        SessionForked(session_id="s10", child_id=child.session_id, leaf_id=comp.id,
                      entries_copied=len(active)),
        SessionCreated(session_id=child.session_id, parent_id="s10"),
    ]
    managed = backend.reopen()
    assert isinstance(managed, CatalogStore)
    assert (await managed.load_session(child.session_id)).parent_id == "s10"
    stored = await managed.load_entries(child.session_id)
    assert stored == child.entries
    assert [getattr(e, "origin_id", None) for e in stored] == [e.id for e in active]
    assert not {e.id for e in stored} & {e.id for e in source_before}
    assert [e.parent_id for e in stored] == [None] + [e.id for e in stored[:-1]]
    assert child.leaf_id == stored[-1].id
    copied = stored[-1]
    assert isinstance(copied, CompactionEntry)
    assert copied.first_kept_entry_id == stored[2].id  # points into the child
    assert child.messages() == agent.messages()
    assert await managed.load_entries("s10") == source_before  # source untouched
    # The child inherits factory and publisher and can run.
    assert child.factory is factory and child.publisher is agent.publisher
    events = await child.run("weather?").collect()
    assert isinstance(events[-1], AgentEnd) and events[-1].error is None
    leaf_before = child.leaf_id
    child.branch(stored[0].id)
    assert published[-1] == SessionBranched(session_id=child.session_id, from_id=leaf_before,
                                            to_id=stored[0].id)


async def test_s10_fork_with_explicit_id(store: Store) -> None:
    agent = await durable.open(None, store=store, session_id="src")
    await agent.append(UserMessage.of("x"))
    child = await agent.fork("dst")
    assert child.session_id == "dst" and child.messages() == [UserMessage.of("x")]


async def test_s10_fork_with_empty_id_is_refused_and_creates_nothing(store: Store) -> None:
    agent = await durable.open(None, store=store, session_id="src")
    await agent.append(UserMessage.of("x"))
    with pytest.raises(InvalidSessionId, match="non-empty"):
        await agent.fork("")
    assert isinstance(store, CatalogStore)
    assert [r.id for r in (await store.list_sessions()).sessions] == ["src"]


@pytest.mark.parametrize("fault", ["create", "append-before", "append-after"])
async def test_s10_fork_failure_publishes_nothing(backend: Backend, fault: str) -> None:
    inner = backend.reopen()
    agent = await durable.open(None, store=inner, session_id="s10f")
    await branched_session(agent)
    published: list[LifecycleEvent] = []
    faulty = FaultyStore(
        inner,
        fail_create_on=1 if fault == "create" else None,
        fail_append_on=1 if fault.startswith("append") else None,
        when="after" if fault == "append-after" else "before",
    )
    source = await durable.open(None, store=faulty, session_id="s10f",
                                publisher=published.append)
    with pytest.raises(StoreError, match="injected fault"):
        await source.fork("s10f-child")
    assert published == []
    assert source.leaf_id == agent.leaf_id and source.entries == agent.entries


# -- S11 -------------------------------------------------------------------------


async def test_s11_receipts_are_stored_before_the_consumer_sees_them(backend: Backend) -> None:
    agent = await durable.open(weather_factory(), store=backend.reopen(), session_id="s11")
    await agent.append(UserMessage.of("earlier"))
    checker = backend.reopen()
    seen: list[Any] = []
    run_input = [UserMessage.of("weather?"), UserMessage.of("in Portugal")]
    async for ev in agent.run(run_input):
        seen.append(ev)
        assert not (isinstance(ev, MessageEnd) and not isinstance(ev, StoredMessageEnd))
        if isinstance(ev, RunStarted | StoredMessageEnd):
            on_disk = {e.id: e for e in await checker.load_entries("s11")}
            for entry in ev.entries:
                assert on_disk[entry.id] == entry
    first = seen[0]
    assert isinstance(first, RunStarted) and first.session_id == "s11"
    assert [e.message for e in first.entries] == run_input  # type: ignore[union-attr]
    ends = [ev for ev in seen if isinstance(ev, StoredMessageEnd)]
    assert all(e.entries and e.entries[0].message == e.message for e in ends)  # type: ignore[union-attr]
    # Input receipts are not written twice: each input entry appears once.
    all_receipts = receipts(seen)
    assert len({e.id for e in all_receipts}) == 2 + 6
    stored = await checker.load_entries("s11")
    assert [e.id for e in stored[1:]] == [e.id for e in first.entries] + [
        e.id for ev in ends[2:] for e in ev.entries
    ]
    assert_calls_answered(stored)


async def test_s11_failed_append_on_every_k_is_never_forwarded(backend: Backend) -> None:
    appends_in_full_run = 7
    backend.fast = True
    for when in ("before", "after"):  # after: stored, but the caller was told it failed
        for k in range(1, appends_in_full_run + 1):
            sid = f"s11k-{when}-{k}"
            inner = backend.reopen()
            faulty = FaultyStore(inner, fail_append_on=k, when=when)
            agent = await durable.open(weather_factory(), store=faulty, session_id=sid)
            forwarded: list[Any] = []
            with pytest.raises(StoreError, match=f"append_entries call {k}"):
                async for ev in agent.run("weather?"):
                    forwarded.append(ev)
            assert faulty.append_calls == k, (when, k)
            on_disk = set(await stored_ids(backend, sid))
            got = receipts(forwarded)
            assert len(got) == k - 1, (when, k)  # the k-th write's event never came
            assert {e.id for e in got} <= on_disk
            assert not any(isinstance(ev, AgentEnd) for ev in forwarded)
            await assert_stored_path_valid(backend, sid)


@pytest.mark.parametrize("style", ["break", "aclose", "async_with", "cancel"])
async def test_s11_stopping_at_every_event_index_stores_a_valid_path(
    backend: Backend, style: str
) -> None:
    backend.fast = True
    reference = await (
        await durable.open(weather_factory(), store=MemoryStore(), session_id="ref")
    ).run("weather?").collect()
    aborted_somewhere = False
    for index in range(len(reference)):
        sid = f"s11-{style}-{index}"
        agent = await durable.open(weather_factory(), store=backend.reopen(), session_id=sid)
        seen = await consume_until(agent, "weather?", index, style)
        if style == "break":
            # The abandoned run is closed by the event loop; an append waits for
            # it (one agent serialises its writes), then lands after its tail.
            (after,) = await agent.append(UserMessage.of("next"))
            assert agent.path()[-1].id == after.id
        stored = await backend.reopen().load_entries(sid)
        on_disk = {e.id for e in stored}
        assert {e.id for e in receipts(seen)} <= on_disk, (style, index)
        assert stored == agent.entries
        assert_calls_answered(stored)
        assert_valid_for_providers(build_context(stored))
        msgs = messages_of(stored)
        aborted = [m for m in msgs if isinstance(m, AssistantMessage)
                   and m.stop_reason == "aborted"]
        synthesized = [m for m in msgs if isinstance(m, ToolResultMessage) and m.synthesized]
        aborted_somewhere |= bool(aborted or synthesized)
        assert all(m.synthesized == "aborted" for m in synthesized)
        reopened = await assert_stored_path_valid(backend, sid)
        assert reopened.repaired == ()  # the run itself left nothing to repair
    assert aborted_somewhere


async def consume_until(
    agent: DurableAgent, text: str, stop: int | str, style: str
) -> list[Any]:
    """Iterate a run and leave it once event number ``stop`` (or the first
    event of the type named ``stop``) arrived, the way ``style`` says."""
    seen: list[Any] = []

    def done(ev: Any) -> bool:
        seen.append(ev)
        return len(seen) > stop if isinstance(stop, int) else type(ev).__name__ == stop

    await _LEAVE.get(style, _leave_by_cancel)(agent, text, done)
    return seen


async def _leave_by_break(agent: DurableAgent, text: str, done: Callable[[Any], bool]) -> None:
    async for ev in agent.run(text):
        if done(ev):
            break


async def _leave_by_aclose(agent: DurableAgent, text: str, done: Callable[[Any], bool]) -> None:
    run = agent.run(text)
    async for ev in run:
        if done(ev):
            break
    await run.aclose()


async def _leave_by_async_with(
    agent: DurableAgent, text: str, done: Callable[[Any], bool]
) -> None:
    async with agent.run(text) as run:
        async for ev in run:
            if done(ev):
                break


async def _leave_by_cancel(agent: DurableAgent, text: str, done: Callable[[Any], bool]) -> None:
    async def consumer() -> None:
        async with agent.run(text) as run:
            async for ev in run:
                if done(ev):
                    task.cancel()

    task = asyncio.create_task(consumer())
    with pytest.raises(asyncio.CancelledError):
        await task


_LEAVE = {"break": _leave_by_break, "aclose": _leave_by_aclose,
          "async_with": _leave_by_async_with, "cancel": _leave_by_cancel}


@pytest.mark.parametrize("style", ["break", "aclose", "async_with", "cancel"])
async def test_s11_interrupted_assistant_message_is_stored_aborted(
    backend: Backend, style: str
) -> None:
    script = [Turn(Text("I was about to say"), Gate(never()), Text(" more"))]
    agent = await durable.open(weather_factory(script), store=backend.reopen(), session_id="ia")
    async with asyncio.timeout(10):
        # RunStarted AgentStart MessageStart StoredMessageEnd TurnStart MessageStart,
        # then updates: start, text start, text delta.
        seen = await consume_until(agent, "talk", 8, style)
    if style == "break":
        await agent.append(UserMessage.of("next"))
    # The consumer left while the assistant message was still streaming.
    assert isinstance(seen[-1], MessageUpdate)
    assert isinstance(seen[-1].event, TextDelta | TextEnd)
    stored = messages_of(await backend.reopen().load_entries("ia"))
    assistant = stored[1]
    assert isinstance(assistant, AssistantMessage)
    assert assistant.stop_reason == "aborted"
    assert assistant.text == "I was about to say"
    await assert_stored_path_valid(backend, "ia")


@pytest.mark.parametrize("style", ["break", "aclose", "async_with", "cancel"])
async def test_s11_interrupted_tools_get_aborted_results(backend: Backend, style: str) -> None:
    entered = asyncio.Event()

    @tool
    async def slow(n: int) -> str:
        """Hangs until cancelled."""
        entered.set()
        await never().wait()
        return "never"

    script = [Turn.tool_calls(("slow", {"n": 1}), ("slow", {"n": 2}))]
    agent = await durable.open(durable.model(ScriptedModel(script), [slow]),
                               store=backend.reopen(), session_id="it")
    async with asyncio.timeout(10):
        if style == "cancel":
            run_task = asyncio.create_task(consume_until(agent, "go", 10_000, "async_with"))
            await entered.wait()
            run_task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run_task
        else:
            await consume_until(agent, "go", "ToolExecutionStart", style)
            if style == "break":
                await agent.append(UserMessage.of("next"))
    stored = await backend.reopen().load_entries("it")
    msgs = messages_of(stored)
    assistant = msgs[1]
    assert isinstance(assistant, AssistantMessage) and len(assistant.tool_calls) == 2
    results = msgs[2:4]
    assert [r.tool_call_id for r in results] == [c.id for c in assistant.tool_calls]  # type: ignore[union-attr]
    assert all(isinstance(r, ToolResultMessage) and r.synthesized == "aborted" for r in results)
    assert_calls_answered(stored)
    reopened = await assert_stored_path_valid(backend, "it")
    assert reopened.repaired == ()


async def test_s11_run_and_append_do_not_interleave(backend: Backend) -> None:
    gate = asyncio.Event()
    script = [Turn(Call("get_weather", {"city": "Lisbon"})), Turn(Text("half"), Gate(gate),
                                                                  Text(" done"))]
    agent = await durable.open(weather_factory(script), store=backend.reopen(), session_id="ser")
    run = agent.run("weather?")
    seen: list[Any] = []
    appended: asyncio.Task[list[Entry]] | None = None
    async for ev in run:
        seen.append(ev)
        ends = [e for e in seen if isinstance(e, StoredMessageEnd)]
        if appended is None and isinstance(ev, MessageUpdate) and len(ends) == 3:
            appended = asyncio.create_task(agent.append(UserMessage.of("meanwhile")))
            await asyncio.sleep(0.05)
            assert not appended.done()  # waits for the run
            with pytest.raises(AgentError, match="run is in progress"):
                agent.branch(None)
            gate.set()
    assert appended is not None
    (meanwhile,) = await appended
    stored = await backend.reopen().load_entries("ser")
    assert stored[-1].id == meanwhile.id
    assert meanwhile.parent_id == receipts(seen)[-1].id
    assert [e.parent_id for e in stored] == [None] + [e.id for e in stored[:-1]]


async def test_s11_loop_failure_and_bad_input(store: Store) -> None:
    def broken() -> Any:
        raise RuntimeError("cannot build the loop")

    agent = await durable.open(broken, store=store, session_id="bad")
    with pytest.raises(RuntimeError, match="cannot build"):
        await agent.run("x").collect()
    # The input was stored (RunStarted was due) and the agent still works.
    assert messages_of(agent.entries) == [UserMessage.of("x")]
    with pytest.raises(AgentError, match="run input"):
        agent.run([UserMessage.of("ok"), 42])  # type: ignore[list-item]
    await agent.append(UserMessage.of("still fine"))


async def test_s11_mutating_from_inside_the_run_fails_instead_of_deadlocking(
    store: Store,
) -> None:
    agent = await durable.open(weather_factory(), store=store, session_id="inside")
    async with asyncio.timeout(10):
        async with agent.run("weather?") as run:
            async for ev in run:
                if isinstance(ev, RunStarted):
                    (entry,) = ev.entries
                    with pytest.raises(AgentError, match="inside its own run"):
                        await agent.append(UserMessage.of("no"))
                    with pytest.raises(AgentError, match="inside its own run"):
                        await agent.fork()
                    with pytest.raises(AgentError, match="inside its own run"):
                        await agent.compact("s", entry.id)
        # A run that was left but is still referenced must be closed first.
        held = agent.run("again")
        async for _ in held:
            break
        with pytest.raises(AgentError, match="inside its own run"):
            await agent.append(UserMessage.of("no"))
        await held.aclose()
        (after,) = await agent.append(UserMessage.of("yes"))
    assert agent.leaf_id == after.id
    assert_calls_answered(agent.path())


async def test_s11_repeated_cancellation_still_stores_the_tail_first(backend: Backend) -> None:
    entered = asyncio.Event()

    @tool
    async def stubborn() -> str:
        """Takes a while to clean up when cancelled."""
        entered.set()
        try:
            await never().wait()
        finally:
            await asyncio.sleep(0.05)
        return "never"

    script = [Turn.tool_calls(("stubborn", {}), ("stubborn", {}))]
    agent = await durable.open(durable.model(ScriptedModel(script), [stubborn]),
                               store=backend.reopen(), session_id="cc")
    task = asyncio.create_task(consume_until(agent, "go", 10_000, "async_with"))
    async with asyncio.timeout(10):
        await entered.wait()
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # a second cancel lands while the run winds down
        with pytest.raises(asyncio.CancelledError):
            await task
        await agent.append(UserMessage.of("next"))
    stored = await backend.reopen().load_entries("cc")
    assert_calls_answered(stored)
    results = [m for m in messages_of(stored) if isinstance(m, ToolResultMessage)]
    assert [r.synthesized for r in results] == ["aborted", "aborted"]
    assert messages_of(stored)[-1] == UserMessage.of("next")


# -- S12 -------------------------------------------------------------------------


def _orphan_call_message() -> AssistantMessage:
    return AssistantMessage(
        content=(TextPart(text="checking"),
                 ToolCall(id="c1", name="get_weather", arguments={"city": "Lisbon"}),
                 ToolCall(id="c2", name="get_weather", arguments={"city": "Porto"})),
        stop_reason="tool_use",
    )


def _snapshot(backend: Backend, sid: str) -> bytes | None:
    if backend.name != "file":
        return None
    store = backend.reopen()
    assert isinstance(store, FileStore)
    return store.path_for(sid).read_bytes()


async def test_s12_orphaned_calls_get_interrupted_results_appended(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s12")
    await agent.append(UserMessage.of("weather?"))
    await agent.append(_orphan_call_message())
    (partial,) = await agent.append(
        ToolResultMessage(tool_call_id="c1", tool_name="get_weather",
                          content=(TextPart(text="18C"),))
    )
    before_entries = await backend.reopen().load_entries("s12")
    before_bytes = _snapshot(backend, "s12")

    resumed = await durable.open(None, store=backend.reopen(), session_id="s12")
    (fix,) = resumed.repaired
    assert isinstance(fix, MessageEntry) and fix.parent_id == partial.id
    result = fix.message
    assert isinstance(result, ToolResultMessage)
    assert result.tool_call_id == "c2" and result.synthesized == "interrupted"
    assert result.is_error and "interrupted" in result.text and "unknown" in result.text
    after = await backend.reopen().load_entries("s12")
    assert after[: len(before_entries)] == before_entries and after[-1] == fix
    if before_bytes is not None:
        now = _snapshot(backend, "s12")
        assert now is not None and now.startswith(before_bytes) and now.count(b"\n") == \
            before_bytes.count(b"\n") + 1
    assert_calls_answered(resumed.path())
    assert_valid_for_providers(resumed.messages())

    # Idempotent: a repaired session has nothing left to repair.
    repaired_bytes = _snapshot(backend, "s12")
    again = await durable.open(None, store=backend.reopen(), session_id="s12")
    assert again.repaired == ()
    assert await backend.reopen().load_entries("s12") == after
    assert _snapshot(backend, "s12") == repaired_bytes


async def test_s12_repair_looks_at_the_active_path_only(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s12b")
    (u,) = await agent.append(UserMessage.of("weather?"))
    await agent.append(_orphan_call_message())
    agent.branch(u.id)
    await agent.append(AssistantMessage(content=(TextPart(text="no tools"),)))
    resumed = await durable.open(None, store=backend.reopen(), session_id="s12b")
    assert resumed.repaired == ()
    # Off repair leaves an orphan alone; the context is still valid.
    agent.branch(agent.entries[1].id)
    await agent.append(UserMessage.of("after orphan"))
    raw = await durable.open(None, store=backend.reopen(), session_id="s12b", repair=False)
    assert raw.repaired == ()
    assert_valid_for_providers(raw.messages())
    with pytest.raises(AssertionError):
        assert_calls_answered(raw.path())


async def test_s12_repair_failure_is_raised(backend: Backend) -> None:
    agent = await durable.open(None, store=backend.reopen(), session_id="s12c")
    await agent.append(_orphan_call_message())
    faulty = FaultyStore(backend.reopen(), fail_append_on=1)
    with pytest.raises(StoreError, match="injected"):
        await durable.open(None, store=faulty, session_id="s12c")
    resumed = await durable.open(None, store=backend.reopen(), session_id="s12c")
    assert len(resumed.repaired) == 2


# -- S13 -------------------------------------------------------------------------


class Recorder:
    """A publisher object; checks in ``publish`` that each effect is stored."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.events: list[LifecycleEvent] = []
        self.agent: DurableAgent | None = None
        self.locked_during_publish: list[bool] = []

    def publish(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        if self.agent is not None:
            self.locked_during_publish.append(self.agent._lock.locked())
        stored = in_thread(lambda: self._load(event.session_id))
        if isinstance(event, SessionCreated):
            assert stored is not None
        elif isinstance(event, SessionCompacted):
            assert stored is not None and event.entry in stored
        elif isinstance(event, SessionForked):
            child = in_thread(lambda: self._load(event.child_id))
            assert child is not None and len(child) == event.entries_copied
        elif isinstance(event, SessionBranched):
            assert self.agent is None or self.agent.leaf_id == event.to_id

    async def _load(self, session_id: str) -> list[Entry] | None:
        store = self.backend.reopen()
        try:
            return await store.load_entries(session_id)
        except SessionNotFound:
            return None
        finally:
            if isinstance(store, SQLiteStore):
                await store.close()


async def test_s13_events_published_after_effect_is_stored(backend: Backend) -> None:
    rec = Recorder(backend)
    agent = await durable.open(None, store=backend.reopen(), session_id="s13", publisher=rec)
    rec.agent = agent
    u, _a = await agent.append(UserMessage.of("q"),
                               AssistantMessage(content=(TextPart(text="a"),)))
    agent.branch(u.id)
    entry = await agent.compact("summary", u.id, tokens_before=10)
    child = await agent.fork()
    assert [type(e) for e in rec.events] == [
        SessionCreated, SessionBranched, SessionCompacted, SessionForked, SessionCreated,
    ]
    assert rec.events[2] == SessionCompacted(session_id="s13", entry=entry)
    assert rec.events[4] == SessionCreated(session_id=child.session_id, parent_id="s13")
    assert rec.locked_during_publish == [False, False, False, False]


async def test_s13_publisher_may_use_the_agent(store: Store) -> None:
    tasks: list[asyncio.Task[list[Entry]]] = []
    holder: list[DurableAgent] = []

    def publish(event: LifecycleEvent) -> None:
        if isinstance(event, SessionCompacted):
            note = CustomEntry(kind="test_durable.bookmark",
                               data=Bookmark(label="compacted", entry_id=event.entry.id))
            tasks.append(asyncio.ensure_future(holder[0].append(note)))

    agent = await durable.open(None, store=store, session_id="s13p", publisher=publish)
    holder.append(agent)
    (u,) = await agent.append(UserMessage.of("q"))
    entry = await agent.compact("s", u.id)
    async with asyncio.timeout(5):
        (note,) = await tasks[0]
    assert note.parent_id == entry.id


async def test_s13_plain_callable_and_object_publishers(store: Store) -> None:
    calls: list[LifecycleEvent] = []

    class Obj:
        def publish(self, event: LifecycleEvent) -> None:
            calls.append(event)

    await durable.open(None, store=store, session_id="p1", publisher=calls.append)
    await durable.open(None, store=store, session_id="p2", publisher=Obj())
    assert calls == [SessionCreated(session_id="p1", parent_id=None),
                     SessionCreated(session_id="p2", parent_id=None)]


async def test_s13_raising_publisher_keeps_the_effect(backend: Backend) -> None:
    seen: list[LifecycleEvent] = []

    def boom(event: LifecycleEvent) -> None:
        seen.append(event)
        raise ValueError("subscriber down")

    with pytest.raises(PublishError, match="ValueError: subscriber down") as opened:
        await durable.open(None, store=backend.reopen(), session_id="s13r", publisher=boom)
    agent = opened.value.result
    assert isinstance(agent, DurableAgent) and agent.session_id == "s13r"
    assert isinstance(opened.value.__cause__, ValueError)
    (u,) = await agent.append(UserMessage.of("q"))  # append publishes nothing: no error
    with pytest.raises(PublishError) as compacted:
        await agent.compact("s", u.id)
    entry = compacted.value.result
    assert isinstance(entry, CompactionEntry) and agent.leaf_id == entry.id
    with pytest.raises(PublishError) as branched:
        agent.branch(u.id)
    assert branched.value.result is None and agent.leaf_id == u.id
    seen.clear()
    with pytest.raises(PublishError) as forked:
        await agent.fork("s13r-child")
    child = forked.value.result
    assert isinstance(child, DurableAgent) and child.session_id == "s13r-child"
    assert [type(e) for e in seen] == [SessionForked, SessionCreated]  # both still delivered
    resumed = await durable.open(None, store=backend.reopen(), session_id="s13r")
    assert [e.id for e in resumed.entries] == [u.id, entry.id]
    (copy,) = await backend.reopen().load_entries("s13r-child")
    assert isinstance(copy, MessageEntry) and copy.origin_id == u.id


async def test_s13_nothing_published_on_append_or_run(backend: Backend) -> None:
    await durable.open(None, store=backend.reopen(), session_id="quiet")
    published: list[LifecycleEvent] = []
    agent = await durable.open(weather_factory(), store=backend.reopen(), session_id="quiet",
                               publisher=published.append)
    await agent.append(UserMessage.of("hello"))
    await agent.append(CustomEntry(kind="test_durable.bookmark",
                                   data=Bookmark(label="meta", entry_id="x")))
    events = await agent.run("weather?").collect()
    assert isinstance(events[-1], AgentEnd)
    lifecycle = (SessionCreated, SessionBranched, SessionForked, SessionCompacted)
    assert not any(isinstance(ev, lifecycle) for ev in events)
    assert published == []

