"""Compaction: token estimates, safe cut points, model-written summaries, automatic
compaction, and how a compaction survives reopen and fork.

The pure parts (estimates, cut points) are tested on hand-built paths and with
hypothesis; the agent-level tests run over the memory store and the file store
(real files, fsync on) with ``ScriptedModel``, which records what the summariser
was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import durable
from threadline.agent._events import AgentEnd
from threadline.ai._messages import (
    AssistantMessage,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from threadline.ai._model import ModelInfo
from threadline.durable import (
    CompactionPolicy,
    DurableAgent,
    LifecycleEvent,
    SessionCompacted,
    TokenEstimate,
    estimate_path,
    plan_compaction,
    summarize,
)
from threadline.durable._compaction import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    SUMMARY_SYSTEM_PROMPT,
    TRUNCATE_CHARS,
    estimate_tokens,
)
from threadline.errors import AgentError, ConfigError, ModelError, RateLimitError
from threadline.session import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    build_context,
)
from threadline.session._context import BRANCH_SUMMARY_PREFIX, COMPACTION_PREFIX
from threadline.stores import FileStore, MemoryStore, Store
from threadline.testing import ScriptedModel, Turn, assert_valid_for_providers

TS = datetime(2025, 1, 1, tzinfo=UTC)


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def asst(text: str = "", *calls: str, usage: Usage | None = None,
         stop: Any = None) -> AssistantMessage:
    content: list[Any] = [TextPart(text=text)] if text else []
    content += [ToolCall(id=c, name=f"tool_{c}", arguments={"q": c}) for c in calls]
    return AssistantMessage(content=tuple(content), usage=usage or Usage(),
                            stop_reason=stop or ("tool_use" if calls else "stop"))


def result(call_id: str, text: str = "ok") -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name=f"tool_{call_id}",
                             content=(TextPart(text=text),))


def chain(*items: Message | Entry) -> list[Entry]:
    """Entries e0, e1, ... each the child of the one before; messages get wrapped."""
    out: list[Entry] = []
    for i, item in enumerate(items):
        parent = f"e{i - 1}" if i else None
        if isinstance(item, UserMessage | AssistantMessage | ToolResultMessage):
            out.append(MessageEntry(id=f"e{i}", parent_id=parent, timestamp=TS, message=item))
        else:
            out.append(msgspec.structs.replace(cast(Any, item), id=f"e{i}", parent_id=parent))
    return out


def compaction(summary: str, kept: str) -> CompactionEntry:
    return CompactionEntry(summary=summary, first_kept_entry_id=kept, timestamp=TS)


def cut_point(path: list[Entry], keep_recent_tokens: int) -> str | None:
    plan = plan_compaction(path, keep_recent_tokens)
    return plan.first_kept_entry_id if plan is not None else None


def context_tokens(messages: list[Message]) -> int:
    return estimate_path(chain(*messages)).tokens


def text_cost(text: str) -> int:
    return MESSAGE_OVERHEAD_TOKENS + -(-len(text.encode()) // 4)


# -- token estimates -----------------------------------------------------------


def test_estimate_tokens_counts_text_bytes_images_calls_and_results() -> None:
    assert estimate_tokens(user("abcd" * 10)) == MESSAGE_OVERHEAD_TOKENS + 10
    assert estimate_tokens(user("abcde")) == MESSAGE_OVERHEAD_TOKENS + 2  # rounds up
    # Bytes, not characters: 4 CJK characters are 12 bytes.
    assert estimate_tokens(user("日本語字")) == MESSAGE_OVERHEAD_TOKENS + 3
    image = ImagePart(data="A" * 100_000, mime_type="image/png")
    assert estimate_tokens(UserMessage.of("", image)) == MESSAGE_OVERHEAD_TOKENS + IMAGE_TOKENS
    call = ToolCall(id="c1", name="read", arguments={"path": "a/b.txt"})
    args = len(msgspec.json.encode(call.arguments))
    thinking = ThinkingPart(thinking="x" * 40)
    assert estimate_tokens(AssistantMessage(content=(thinking, call))) == (
        MESSAGE_OVERHEAD_TOKENS + -(-(40 + len("read") + args) // 4)
    )
    r = ToolResultMessage(tool_call_id="c1", tool_name="read",
                          content=(TextPart(text="y" * 400),))
    assert estimate_tokens(r) == MESSAGE_OVERHEAD_TOKENS + 101


def test_estimate_prefers_the_last_reported_usage_plus_heuristic_after_it() -> None:
    reported = Usage(input_tokens=900, output_tokens=50, cache_read_tokens=40)
    after: list[Message] = [result("c1", "z" * 80), user("next question")]
    messages: list[Message] = [user("q"), asst("", "c1", usage=reported), *after]
    assert context_tokens(messages) == 990 + sum(estimate_tokens(m) for m in after)
    # No usage anywhere: the heuristic for everything.
    plain: list[Message] = [user("q"), asst("a"), user("r")]
    assert context_tokens(plain) == sum(estimate_tokens(m) for m in plain)
    # An aborted or failed reply's usage is partial: the one before it counts.
    aborted = asst("partial", usage=Usage(input_tokens=5), stop="aborted")
    later: list[Message] = [aborted, user("again")]
    assert context_tokens([*messages, *later]) == (
        990 + sum(estimate_tokens(m) for m in [*after, *later])
    )


def test_estimate_path_ignores_usage_billed_before_the_latest_compaction() -> None:
    big = asst("old reply", usage=Usage(input_tokens=100_000))
    path = chain(user("u0"), big, user("u2"), asst("a3"),
                 compaction("S", kept="e1"), user("u5"))
    # The kept reply e1 was billed for the whole pre-compaction context.
    est = estimate_path(path)
    assert est == TokenEstimate(0, sum(estimate_tokens(m) for m in build_context(path)))
    assert est.method == "heuristic"
    # A reply after the compaction is trusted again.
    fresh = asst("new", usage=Usage(input_tokens=700, output_tokens=20))
    path2 = chain(*path, fresh, user("u7"))
    assert estimate_path(path2) == TokenEstimate(720, estimate_tokens(user("u7")))
    assert estimate_path(path2).method == "usage+heuristic"


# -- cut points ----------------------------------------------------------------


def test_cut_keeps_about_keep_recent_tokens_starting_at_a_user_message() -> None:
    turn = "w" * 400  # 104 tokens per message
    path = chain(user(turn), asst(turn), user(turn), asst(turn), user(turn), asst(turn))
    assert cut_point(path, 150) == "e4"   # last turn holds 208 >= 150
    assert cut_point(path, 250) == "e3"   # an assistant message starts a turn too
    assert cut_point(path, 0) == "e5"
    plan = plan_compaction(path, 150)
    assert plan is not None
    assert plan.messages == tuple(build_context(path[:4]))
    assert plan.previous_summary is None
    assert plan.kept_tokens == 208
    assert plan.tokens_before.tokens == 6 * 104


def test_cut_never_separates_a_tool_call_from_its_results() -> None:
    big = "r" * 4000
    path = chain(
        user("do it"),                        # e0
        asst("", "c1", "c2"),                 # e1
        result("c1", big), result("c2", big),  # e2 e3: a run of results
        asst("done"),                         # e4
    )
    # The reply costs 5 tokens; keeping one more token means keeping the
    # huge results, and with them the call that asked for them.
    assert cut_point(path, 5) == "e4"
    assert cut_point(path, 6) == "e1"
    # e1 onwards is 13 + 2 * 1006 + 5 tokens; beyond that only e0 could
    # start the tail, which would fold nothing.
    assert cut_point(path, 2030) == "e1"
    assert cut_point(path, 2031) is None
    for keep in range(0, 2200, 10):
        assert cut_point(path, keep) in {"e4", "e1", None}


def test_cut_skips_points_between_a_call_and_a_late_result() -> None:
    # A user message was appended while the tool ran; the result came after it.
    path = chain(user("start"), asst("", "c1"), user("meanwhile"), result("c1"),
                 asst("answer"), user("thanks"))
    # e2 is a user message but cutting there would strand the result of c1.
    cuts = {cut_point(path, keep) for keep in range(0, 200)}
    assert "e2" not in cuts and "e3" not in cuts
    assert cuts <= {"e5", "e4", "e1", None}


def test_nothing_to_compact_returns_none() -> None:
    assert cut_point([], 0) is None
    assert cut_point(chain(user("only")), 0) is None
    path = chain(user("a"), asst("b"))
    assert cut_point(path, 10_000) is None
    # Only invisible entries before the cut: nothing would be folded.
    path2 = chain(CustomEntry(kind="k", data=None, timestamp=TS), user("a"))
    assert cut_point(path2, 0) is None
    with pytest.raises(ConfigError):
        cut_point(path, -1)


def test_cut_respects_an_earlier_compaction_and_carries_its_summary() -> None:
    w = "w" * 400
    path = chain(user(w), asst(w), user(w), asst(w),      # e0-e3
                 compaction("first summary", kept="e2"),  # e4: kept e2, e3
                 user(w), asst(w), user(w), asst(w))      # e5-e8
    plan = plan_compaction(path, 200)
    assert plan is not None
    assert plan.first_kept_entry_id == "e7"
    assert plan.previous_summary == "first summary"
    # Only what the context still shows verbatim is folded: e2 e3 e5 e6, not e0 e1.
    assert plan.messages == (user(w), asst(w), user(w), asst(w))
    # A cut can go back into the previous kept tail, but never before it.
    assert {cut_point(path, k) for k in range(0, 2000, 25)} <= {
        "e8", "e7", "e6", "e5", "e3", None
    }


# A property over random paths: whatever the cut, the compacted context is
# valid for providers, keeps its tail verbatim, and folds exactly the rest.

_ids = st.sampled_from(["c1", "c2", "c3"])
_texts = st.sampled_from(["", "x", "y" * 40, "z" * 400])


@st.composite
def _assistant(draw: st.DrawFn) -> AssistantMessage:
    calls = draw(st.lists(_ids, max_size=3, unique=True))
    text = draw(_texts)
    content: list[Any] = [TextPart(text=text)] if draw(st.booleans()) else []
    content += [ToolCall(id=c, name="t", arguments={"n": len(text)}) for c in calls]
    usage = Usage(input_tokens=draw(st.sampled_from([0, 0, 50, 5000])))
    return AssistantMessage(
        content=tuple(content), usage=usage,
        stop_reason=draw(st.sampled_from(["stop", "tool_use", "error", "aborted", "length"])),
    )


_items: st.SearchStrategy[Message | Entry] = st.one_of(
    st.builds(user, _texts),
    _assistant(),
    _assistant(),
    st.builds(result, _ids, _texts),
    st.builds(result, _ids, _texts),
    st.just(CustomEntry(kind="k", data=None, timestamp=TS)),
    st.just(CustomMessageEntry(kind="k", content=(TextPart(text="cm"),), timestamp=TS)),
    st.just(BranchSummaryEntry(from_id="x", summary="b", timestamp=TS)),
)


@st.composite
def _paths(draw: st.DrawFn) -> list[Entry]:
    items = draw(st.lists(_items, max_size=40))
    path = chain(*items)
    if draw(st.booleans()) and path:
        # An earlier compaction somewhere in the middle, keeping any entry
        # before it (or one that is not on the path).
        at = draw(st.integers(0, len(path)))
        kept = draw(st.sampled_from([e.id for e in path[:at]] + ["missing"]))
        path = chain(*path[:at], compaction("earlier", kept), *path[at:])
    return path


def _check_compaction(path: list[Entry], keep: int, summary: str) -> list[Entry] | None:
    old = build_context(path)
    plan = plan_compaction(path, keep)
    if plan is None:
        return None
    cut = next(e for e in path if e.id == plan.first_kept_entry_id)
    assert isinstance(cut, MessageEntry | CustomMessageEntry | BranchSummaryEntry)
    if isinstance(cut, MessageEntry):
        assert not isinstance(cut.message, ToolResultMessage)
    assert plan.kept_tokens >= keep
    assert plan.messages, "a plan folds something"
    assert_valid_for_providers(plan.messages)
    entry = CompactionEntry(id=f"c{len(path)}", parent_id=path[-1].id, timestamp=TS,
                            summary=summary, first_kept_entry_id=plan.first_kept_entry_id)
    new_path = [*path, entry]
    new = build_context(new_path)
    assert_valid_for_providers(new)
    assert new[0] == user(COMPACTION_PREFIX + summary)
    tail = new[1:]
    assert tail, "the cut entry itself is kept"
    assert old[len(old) - len(tail):] == tail, "every kept message is kept verbatim"
    start = 1 if plan.previous_summary is not None else 0
    if start:
        assert old[0] == user(COMPACTION_PREFIX + plan.previous_summary)  # type: ignore[operator]
    assert list(plan.messages) == old[start:len(old) - len(tail)], "nothing lost or doubled"
    return new_path


@settings(max_examples=400, deadline=None)
@given(_paths(), st.lists(_items, max_size=15), st.integers(0, 250), st.integers(0, 250))
def test_property_compaction_never_splits_tool_pairs_and_keeps_tail_verbatim(
    path: list[Entry], later: list[Message | Entry], keep1: int, keep2: int
) -> None:
    once = _check_compaction(path, keep1, "first")
    if once is not None:
        # The conversation goes on, then is compacted again: the second plan
        # starts from the first one's kept point and carries its summary.
        grown = chain(*once, *later)
        plan = plan_compaction(grown, keep2)
        if plan is not None:
            assert plan.previous_summary == "first"
        _check_compaction(grown, keep2, "second")


# -- the durable agent ---------------------------------------------------------


@dataclass
class Storage:
    name: str
    tmp: Path
    memory: MemoryStore | None = None

    def reopen(self) -> Store:
        if self.name == "memory":
            self.memory = self.memory or MemoryStore()
            return self.memory
        return FileStore(self.tmp / "sessions")


@pytest.fixture(params=["memory", "file"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    yield Storage(request.param, tmp_path)


SUMMARY = "## Goal\nShip it.\n\n## Decisions\nNone."
BIG = "b" * 6000


async def seeded(storage: Storage, session_id: str = "s", **kw: Any) -> DurableAgent:
    """A session with a tool round trip, then two plain turns."""
    agent = await durable.open(None, store=storage.reopen(), session_id=session_id)
    await agent.append(
        user("Please read notes.txt and plan the release."),
        asst("Reading it.", "c1"),
        result("c1", "line\n" * 1000),         # a large tool result
        asst("The notes say to ship on Friday."),
        user("Good. Draft the announcement."),
        asst("Here is a draft: " + "d" * 800),
        user("Shorter please."),
        asst("Ship Friday."),
    )
    # Reopened, so the tests see what is stored (and a publisher hears no session_init).
    return await durable.open(None, store=storage.reopen(), session_id=session_id, **kw)


async def test_compact_with_sends_a_structured_summary_request(storage: Storage) -> None:
    published: list[LifecycleEvent] = []
    agent = await seeded(storage, publisher=published.append)
    before = agent.messages()
    model = ScriptedModel([Turn.text(SUMMARY)])
    entry = await agent.compact_with(model, keep_recent_tokens=5)
    assert entry is not None
    # The summariser got one provider-valid request: a system prompt and one
    # user message holding the transcript of what is folded.
    (request,) = model.requests
    assert request.system == SUMMARY_SYSTEM_PROMPT and request.tools == ()
    assert_valid_for_providers(request.messages)
    (prompt,) = request.messages
    assert isinstance(prompt, UserMessage)
    text = prompt.text
    for section in ("## Goal", "## Decisions", "## Progress", "## Open items",
                    "## Key facts and files"):
        assert section in text
    assert "[user]\nPlease read notes.txt and plan the release." in text
    assert '[assistant tool call: tool_c1]\n{"q":"c1"}' in text
    assert "[tool result: tool_c1]" in text
    # The 5,000-character tool result was cut to TRUNCATE_CHARS characters.
    assert f"[... {5000 - TRUNCATE_CHARS} characters omitted ...]" in text
    assert "line\n" * 1000 not in text
    assert "Shorter please." in text               # folded: the cut is at the last reply
    assert "Ship Friday." not in text              # kept verbatim, not summarised
    assert "<previous-summary>" not in text
    # The stored entry and what the model sees from now on.
    assert entry.summary == SUMMARY
    assert entry.first_kept_entry_id == agent.path()[-2].id
    assert entry.tokens_before == context_tokens(before) > 0
    assert entry.details["trigger"] == "manual"
    assert entry.details["estimate"] == "heuristic"
    assert entry.details["model"] == "scripted:scripted-model"
    assert entry.details["summarized_messages"] == 7
    assert agent.messages() == [user(COMPACTION_PREFIX + SUMMARY), asst("Ship Friday.")]
    assert published == [SessionCompacted(session_id="s", entry=entry)]
    # Stored: a new handle on the same storage sees the compaction.
    reopened = await durable.open(None, store=storage.reopen(), session_id="s")
    assert reopened.path()[-1] == entry
    assert reopened.messages() == agent.messages()


async def test_compact_with_returns_none_and_asks_nothing_when_nothing_to_fold(
    storage: Storage,
) -> None:
    published: list[LifecycleEvent] = []
    agent = await seeded(storage, publisher=published.append)
    model = ScriptedModel([Turn.text(SUMMARY)])
    assert await agent.compact_with(model, keep_recent_tokens=1_000_000) is None
    assert model.requests == [] and published == []


async def test_repeated_compaction_feeds_the_previous_summary(storage: Storage) -> None:
    agent = await seeded(storage)
    model = ScriptedModel([Turn.text("FIRST SUMMARY"), Turn.text("SECOND SUMMARY")])
    # The last four messages are 7 + 8 + 209 + 12 tokens.
    first = await agent.compact_with(model, keep_recent_tokens=230)
    assert first is not None
    kept = agent.get(first.first_kept_entry_id)
    assert isinstance(kept, MessageEntry) and kept.message == user("Good. Draft the announcement.")
    await agent.append(user("Now the changelog."), asst("Changelog: " + "c" * 800),
                       user("Thanks."), asst("Welcome."))
    second = await agent.compact_with(model, keep_recent_tokens=5, instructions="Be terse.")
    assert second is not None
    text = model.requests[1].messages[0].content[0].text  # type: ignore[union-attr]
    assert "<previous-summary>\nFIRST SUMMARY\n</previous-summary>" in text
    assert "Additional instructions:\nBe terse." in text
    # The tail the first compaction kept is folded now; what the first summary
    # covers is not sent again.
    assert "Draft the announcement." in text and "Now the changelog." in text
    assert "Please read notes.txt" not in text
    assert agent.messages() == [user(COMPACTION_PREFIX + "SECOND SUMMARY"), asst("Welcome.")]
    assert_valid_for_providers(agent.messages())


async def test_model_error_leaves_the_session_untouched(storage: Storage) -> None:
    published: list[LifecycleEvent] = []
    agent = await seeded(storage, publisher=published.append)
    path = agent.path()
    limited = RateLimitError("slow down", provider="scripted", retry_after=3.0)
    model = ScriptedModel([Turn.error("slow down", error=limited), Turn.text("   ")])
    with pytest.raises(RateLimitError) as caught:
        await agent.compact_with(model, keep_recent_tokens=20)
    assert caught.value is limited and caught.value.retry_after == 3.0
    assert any("session 's'" in note for note in caught.value.__notes__)
    with pytest.raises(ModelError, match="empty summary"):
        await agent.compact_with(model, keep_recent_tokens=20)
    assert agent.path() == path and published == []
    stored = await storage.reopen().load_entries("s")
    assert list(stored) == agent.entries


async def test_s13_publisher_hears_exactly_one_session_compacted(storage: Storage) -> None:
    published: list[LifecycleEvent] = []
    agent = await seeded(storage, publisher=published.append)
    model = ScriptedModel([Turn.text(SUMMARY)])
    entry = await agent.compact_with(model, keep_recent_tokens=20)
    assert published == [SessionCompacted(session_id="s", entry=entry)]  # type: ignore[arg-type]


async def test_compact_with_from_inside_a_run_is_refused(storage: Storage) -> None:
    run_model = ScriptedModel([Turn.text("hi")])
    agent = await durable.open(durable.model(run_model), store=storage.reopen(), session_id="s")
    summariser = ScriptedModel([Turn.text(SUMMARY)])
    with pytest.raises(AgentError, match="inside its own run"):
        async for _ in agent.run("hello"):
            await agent.compact_with(summariser, keep_recent_tokens=0)
    assert summariser.requests == []


async def test_compaction_survives_reopen_and_fork(storage: Storage) -> None:
    agent = await seeded(storage)
    entry = await agent.compact_with(ScriptedModel([Turn.text(SUMMARY)]), keep_recent_tokens=300)
    assert entry is not None
    view = agent.messages()
    reopened = await durable.open(None, store=storage.reopen(), session_id="s")
    assert reopened.messages() == view
    child = await reopened.fork("child")
    copied = child.path()[-1]
    assert isinstance(copied, CompactionEntry) and copied.origin_id == entry.id
    # The kept point is remapped to the child's copy of that entry.
    kept = child.get(copied.first_kept_entry_id)
    assert kept.origin_id == entry.first_kept_entry_id  # type: ignore[union-attr]
    assert child.messages() == view
    reopened_child = await durable.open(None, store=storage.reopen(), session_id="child")
    assert reopened_child.messages() == view
    # A compaction in the child builds on the copied one.
    await reopened_child.append(user("more"), asst("sure " + "s" * 800), user("ok"), asst("k"))
    model = ScriptedModel([Turn.text("CHILD SUMMARY")])
    assert await reopened_child.compact_with(model, keep_recent_tokens=10) is not None
    assert SUMMARY in model.requests[0].messages[0].content[0].text  # type: ignore[union-attr]


async def test_summarize_renders_images_and_reasoning_and_honours_abort() -> None:
    image = ImagePart(data="QUJD" * 1000, mime_type="image/png")
    messages: list[Message] = [
        UserMessage.of("what is this?", image),
        AssistantMessage(content=(ThinkingPart(thinking="t" * 5000),
                                  ThinkingPart(thinking="", signature="opaque", redacted=True),
                                  TextPart(text="a cat"))),
    ]
    model = ScriptedModel([Turn.text("  the summary  ")])
    assert await summarize(model, messages) == "the summary"
    text = model.requests[0].messages[0].content[0].text  # type: ignore[union-attr]
    assert "[user]\nwhat is this?\n[image: image/png]" in text
    assert "QUJD" not in text and "opaque" not in text
    assert f"[... {5000 - TRUNCATE_CHARS} characters omitted ...]" in text
    assert "[assistant]\na cat" in text
    abort = asyncio.Event()
    abort.set()
    with pytest.raises(ModelError, match="aborted"):
        await summarize(ScriptedModel([Turn.text("never")]), messages, abort=abort)


# -- automatic compaction ------------------------------------------------------


async def test_auto_compaction_triggers_above_the_threshold_and_not_at_or_below(
    storage: Storage,
) -> None:
    seed = await seeded(storage)
    context = estimate_path(seed.path()).tokens + estimate_tokens(user("go on"))
    for window, expect in ((context, True), (context * 2, False), (context * 2 - 1, True)):
        # threshold 0.5: compaction iff context > window / 2
        sid = f"auto-{window}"
        agent = await seeded(storage, sid)
        lm = ScriptedModel([Turn.text(SUMMARY), Turn.text("continuing")],
                           info=ModelInfo(provider="scripted", id="m", context_window=window))
        published: list[LifecycleEvent] = []
        agent = await durable.open(
            durable.model(lm), store=storage.reopen(), session_id=sid,
            publisher=published.append,
            compaction=CompactionPolicy(threshold=0.5, keep_recent_tokens=20),
        )
        events = await agent.run("go on").collect()
        assert isinstance(events[-1], AgentEnd) and events[-1].error is None
        compacted = [e for e in agent.path() if isinstance(e, CompactionEntry)]
        if expect:
            # The run's own model wrote the summary, then answered on the
            # compacted context.
            assert len(compacted) == 1 and len(published) == 1
            assert lm.requests[0].system == SUMMARY_SYSTEM_PROMPT
            run_request = lm.requests[1]
            assert run_request.messages[0] == user(COMPACTION_PREFIX + SUMMARY)
            assert run_request.messages[-1] == user("go on")
            assert_valid_for_providers(run_request.messages)
            details = compacted[0].details
            assert details["trigger"] == "auto"
            assert details["context_tokens"] == context
            assert details["context_window"] == window
            assert compacted[0].tokens_before == context - estimate_tokens(user("go on"))
        else:
            assert compacted == [] and published == []
            assert lm.requests[0].messages[-1] == user("go on")
            assert lm.remaining == 1


async def test_auto_compaction_uses_reported_usage(storage: Storage) -> None:
    # A reply that reported 9,000 tokens of context in a 10,000 window
    # triggers compaction at 0.8 even though the text is short.
    agent = await durable.open(None, store=storage.reopen(), session_id="u")
    await agent.append(user("q1"), asst("a1"), user("q2"),
                       asst("a2", usage=Usage(input_tokens=8_990, output_tokens=10)))
    lm = ScriptedModel([Turn.text(SUMMARY), Turn.text("ok")],
                       info=ModelInfo(provider="p", id="m", context_window=10_000))
    agent = await durable.open(durable.model(lm), store=storage.reopen(), session_id="u",
                               compaction=CompactionPolicy(keep_recent_tokens=0))
    await agent.run("q3").collect()
    (entry,) = [e for e in agent.path() if isinstance(e, CompactionEntry)]
    assert entry.details["estimate"] == "usage+heuristic"
    assert entry.tokens_before == 9_000
    # Right after compaction the old usage no longer counts: no second compaction.
    lm.extend([Turn.text("fine")])
    await agent.run("q4").collect()
    assert len([e for e in agent.path() if isinstance(e, CompactionEntry)]) == 1


async def test_auto_compaction_failure_fails_the_run_before_storing_input(
    storage: Storage,
) -> None:
    seed = await seeded(storage)
    lm = ScriptedModel([Turn.error("down")],
                       info=ModelInfo(provider="p", id="m", context_window=100))
    agent = await durable.open(durable.model(lm), store=storage.reopen(), session_id="s",
                               compaction=CompactionPolicy(keep_recent_tokens=20))
    with pytest.raises(ModelError, match="down"):
        await agent.run("go").collect()
    assert agent.path() == seed.path()


async def test_auto_compaction_with_a_separate_summariser_and_window_override(
    storage: Storage,
) -> None:
    await seeded(storage)
    runner = ScriptedModel([Turn.text("ok")])
    summariser = ScriptedModel([Turn.text(SUMMARY)])

    def factory() -> Any:
        return durable.model(runner)()

    policy = CompactionPolicy(model=summariser, context_window=500, keep_recent_tokens=20)
    agent = await durable.open(factory, store=storage.reopen(), session_id="s",
                               compaction=policy)
    await agent.run("go").collect()
    assert len(summariser.requests) == 1
    assert runner.requests[0].messages[0] == user(COMPACTION_PREFIX + SUMMARY)
    # The fork inherits the policy.
    child = await agent.fork("kid")
    await child.append(user("x" * 4000), asst("y"))
    summariser.extend([Turn.text("KID")])
    runner.extend([Turn.text("ok")])
    await child.run("again").collect()
    assert len(summariser.requests) == 2


def test_compaction_policy_is_checked_up_front() -> None:
    for bad in ({"threshold": 0}, {"threshold": 1.5}, {"keep_recent_tokens": -1},
                {"context_window": 0}):
        with pytest.raises(ConfigError):
            CompactionPolicy(**bad)


async def test_auto_compaction_without_a_model_is_a_config_error() -> None:
    def factory() -> Any:
        raise AssertionError("never built")

    with pytest.raises(ConfigError, match=r"CompactionPolicy\(model=\.\.\.\)"):
        await durable.open(factory, store=MemoryStore(), compaction=CompactionPolicy())
    # Without a factory there are no runs, so nothing to check.
    agent = await durable.open(None, store=MemoryStore(), compaction=CompactionPolicy())
    assert agent.session_id


def test_branch_summary_prefix_is_what_the_cut_counts() -> None:
    # A branch summary is a safe cut point and costs what the model sees.
    entry = BranchSummaryEntry(from_id="x", summary="s" * 40, timestamp=TS)
    path = chain(user("a"), asst("b"), entry, asst("c"))
    plan = plan_compaction(path, text_cost(BRANCH_SUMMARY_PREFIX + "s" * 40))
    assert plan is not None and plan.first_kept_entry_id == "e2"
    assert plan.kept_tokens == text_cost(BRANCH_SUMMARY_PREFIX + "s" * 40) + text_cost("c")
