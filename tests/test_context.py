"""Building model context from a path: order, compaction, visibility, tool pairing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    synthesized_result,
)
from threadline.session._codec import decode_entry
from threadline.session._context import (
    BRANCH_SUMMARY_PREFIX,
    COMPACTION_PREFIX,
    build_context,
    normalize_tool_pairs,
)
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
)
from threadline.testing import assert_valid_for_providers

TS = datetime(2025, 1, 1, tzinfo=UTC)


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def asst(text: str = "", *calls: str) -> AssistantMessage:
    content: list[Any] = [TextPart(text=text)] if text else []
    content += [ToolCall(id=c, name=f"tool_{c}") for c in calls]
    return AssistantMessage(content=tuple(content), stop_reason="tool_use" if calls else "stop")


def result(call_id: str, text: str = "ok") -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call_id, tool_name=f"tool_{call_id}", content=(TextPart(text=text),)
    )


def chain(*items: Message | Entry) -> list[Entry]:
    """Entries e0, e1, ... each the child of the one before; messages get wrapped."""
    out: list[Entry] = []
    for i, item in enumerate(items):
        parent = f"e{i - 1}" if i else None
        if isinstance(item, UserMessage | AssistantMessage | ToolResultMessage):
            out.append(MessageEntry(id=f"e{i}", parent_id=parent, timestamp=TS, message=item))
        else:
            out.append(item)
    return out


def is_interrupted(m: Message, call_id: str) -> bool:
    return (
        isinstance(m, ToolResultMessage) and m.tool_call_id == call_id
        and m.synthesized == "interrupted" and m.is_error
    )


def test_s5_messages_in_path_order() -> None:
    msgs: list[Message] = [user("hi"), asst("hello"), user("more"), asst("sure")]
    assert build_context(chain(*msgs)) == msgs
    assert build_context([]) == []


def test_latest_compaction_folds_earlier_context_into_summary_plus_kept_tail() -> None:
    path = chain(
        user("u0"), asst("a1"), user("u2"), asst("a3"),
        CompactionEntry(id="c1", parent_id="e3", timestamp=TS, summary="first",
                        first_kept_entry_id="e2"),
        user("u5"), asst("a6"),
        CompactionEntry(id="c2", parent_id="e6", timestamp=TS, summary="second",
                        first_kept_entry_id="e5"),
        user("u8"),
    )
    path[5] = MessageEntry(id="e5", parent_id="c1", timestamp=TS, message=user("u5"))
    path[8] = MessageEntry(id="e8", parent_id="c2", timestamp=TS, message=user("u8"))
    assert build_context(path) == [
        user(COMPACTION_PREFIX + "second"), user("u5"), asst("a6"), user("u8")
    ]
    # With only the first compaction on the path, it is the one that counts.
    assert build_context(path[:7]) == [
        user(COMPACTION_PREFIX + "first"), user("u2"), asst("a3"), user("u5"), asst("a6")
    ]


def test_compaction_whose_kept_entry_is_not_on_the_path_keeps_no_tail() -> None:
    path = chain(
        user("u0"), asst("a1"),
        CompactionEntry(id="e2", parent_id="e1", timestamp=TS, summary="s",
                        first_kept_entry_id="elsewhere"),
        user("u3"),
    )
    assert build_context(path) == [user(COMPACTION_PREFIX + "s"), user("u3")]


def test_kept_tail_starting_with_orphan_results_stays_valid() -> None:
    # The cut fell between a call and its result: the result lost its call.
    path = chain(
        user("u0"), asst("", "c1"), result("c1"), asst("done"),
        CompactionEntry(id="e4", parent_id="e3", timestamp=TS, summary="s",
                        first_kept_entry_id="e2"),
        user("u5"),
    )
    out = build_context(path)
    assert out == [user(COMPACTION_PREFIX + "s"), asst("done"), user("u5")]
    assert_valid_for_providers(out)


def test_branch_summaries_and_custom_messages_are_user_context_custom_entries_are_not() -> None:
    path = chain(
        user("u0"),
        BranchSummaryEntry(id="e1", parent_id="e0", timestamp=TS, from_id="x",
                           summary="tried X"),
        CustomEntry(id="e2", parent_id="e1", timestamp=TS, kind="state", data={"secret": 1}),
        CustomMessageEntry(id="e3", parent_id="e2", timestamp=TS, kind="note",
                           content=(TextPart(text="visible note"),), display=False),
        decode_entry(b'{"type":"future","id":"e4","parent_id":"e3"}'),
        asst("a5"),
    )
    assert build_context(path) == [
        user("u0"), user(BRANCH_SUMMARY_PREFIX + "tried X"), user("visible note"), asst("a5")
    ]


def test_tool_results_follow_their_assistant_message() -> None:
    msgs: list[Message] = [
        user("u"), asst("t", "c1", "c2"), result("c1"), result("c2"), asst("done")
    ]
    assert normalize_tool_pairs(msgs) == msgs
    assert build_context(chain(*msgs)) == msgs


def test_results_are_put_in_call_order() -> None:
    out = normalize_tool_pairs([asst("", "c1", "c2"), result("c2"), result("c1")])
    assert out == [asst("", "c1", "c2"), result("c1"), result("c2")]


def test_result_found_later_is_moved_up() -> None:
    # A user message was appended while the tool ran.
    out = normalize_tool_pairs(
        [user("u"), asst("", "c1"), user("steer"), result("c1"), asst("done")]
    )
    assert out == [user("u"), asst("", "c1"), result("c1"), user("steer"), asst("done")]
    assert_valid_for_providers(out)


def test_missing_result_is_synthesized_as_interrupted() -> None:
    out = normalize_tool_pairs([user("u"), asst("", "c1", "c2"), result("c2"), user("next")])
    assert out[:2] == [user("u"), asst("", "c1", "c2")]
    assert is_interrupted(out[2], "c1")
    assert out[2] == synthesized_result("c1", "tool_c1", "interrupted")
    assert out[3:] == [result("c2"), user("next")]
    assert_valid_for_providers(out)
    # At the very end of the path too (a crash right after the assistant message).
    tail = normalize_tool_pairs([user("u"), asst("", "c9")])
    assert is_interrupted(tail[-1], "c9") and len(tail) == 3


def test_result_without_its_call_is_dropped() -> None:
    out = normalize_tool_pairs([user("u"), result("ghost"), asst("a"), result("ghost2")])
    assert out == [user("u"), asst("a")]


def test_duplicate_results_are_dropped() -> None:
    out = normalize_tool_pairs(
        [asst("", "c1"), result("c1", "first"), result("c1", "second"), user("u")]
    )
    assert out == [asst("", "c1"), result("c1", "first"), user("u")]


def test_result_before_its_call_is_dropped() -> None:
    out = normalize_tool_pairs([result("c1", "early"), asst("", "c1")])
    assert out[0] == asst("", "c1")
    assert is_interrupted(out[1], "c1")


def test_repeated_call_ids_across_turns_pair_with_the_right_turn() -> None:
    # Some models number calls per turn, so "call_0" comes back every turn.
    out = normalize_tool_pairs([
        user("u"),
        asst("t1", "call_0"), result("call_0", "r1"),
        asst("t2", "call_0"), result("call_0", "r2"),
        asst("t3", "call_0"),  # crashed before its result
        user("again"),
        asst("t4", "call_0"), result("call_0", "r4"),
    ])
    assert out[:5] == [
        user("u"), asst("t1", "call_0"), result("call_0", "r1"),
        asst("t2", "call_0"), result("call_0", "r2"),
    ]
    assert out[5] == asst("t3", "call_0")
    assert is_interrupted(out[6], "call_0")
    assert out[7:] == [user("again"), asst("t4", "call_0"), result("call_0", "r4")]
    assert_valid_for_providers(out)


def test_late_result_of_reused_id_goes_to_the_unanswered_turn() -> None:
    out = normalize_tool_pairs([
        asst("t1", "c"),  # no result yet
        asst("t2", "c"),
        result("c", "r"),
    ])
    # The result answers the most recent open call; the older one is interrupted.
    assert out[0] == asst("t1", "c") and is_interrupted(out[1], "c")
    assert out[2:] == [asst("t2", "c"), result("c", "r")]


def test_error_and_empty_assistant_messages_are_dropped_with_their_results() -> None:
    failed = AssistantMessage(
        content=(TextPart(text="partial"), ToolCall(id="cx", name="t")),
        stop_reason="error", error_message="overloaded",
    )
    blank = AssistantMessage(content=(TextPart(text=""),), stop_reason="aborted")
    out = normalize_tool_pairs([
        user("u"), failed, result("cx"), AssistantMessage(), blank, asst("fine"),
    ])
    assert out == [user("u"), asst("fine")]


def test_aborted_assistant_with_content_is_kept() -> None:
    aborted = AssistantMessage(
        content=(ThinkingPart(thinking="hmm"), TextPart(text="")), stop_reason="aborted"
    )
    assert normalize_tool_pairs([user("u"), aborted]) == [user("u"), aborted]


# -- the validity checker itself must catch every violation ----------------------


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([result("c")], "does not directly follow"),
        ([asst("", "c")], "have no result"),
        ([asst("", "c"), user("u"), result("c")], "have no result"),
        ([asst("", "c"), result("d")], "answers no open call"),
        ([asst("", "c"), result("c"), result("c")], "does not directly follow"),
        ([asst("", "c", "c"), result("c"), result("c")], "repeated tool call ids"),
        ([AssistantMessage(content=(TextPart(text="x"),), stop_reason="error")], "'error'"),
        ([AssistantMessage()], "empty assistant"),
    ],
)
def test_validity_checker_rejects(messages: list[Message], why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        assert_valid_for_providers(messages)


def test_validity_checker_accepts_valid_context() -> None:
    assert_valid_for_providers([])
    assert_valid_for_providers(
        [user("u"), asst("", "a", "b"), result("b"), result("a"), asst("x"), user("v")]
    )


# -- property: any path yields provider-valid context -------------------------------

_call_ids = st.sampled_from(["c0", "c1", "c2", "c3"])


@st.composite
def _assistants(draw: st.DrawFn) -> AssistantMessage:
    calls = draw(st.lists(_call_ids, max_size=3, unique=True))
    text = draw(st.sampled_from(["", "text"]))
    content: list[Any] = [TextPart(text=text)] if draw(st.booleans()) else []
    content += [ToolCall(id=c, name="t") for c in calls]
    return AssistantMessage(
        content=tuple(content),
        stop_reason=draw(st.sampled_from(["stop", "tool_use", "error", "aborted", "length"])),
    )


_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(user, st.sampled_from(["u", "v"])),
    _assistants(),
    st.builds(result, _call_ids, st.sampled_from(["r", "s"])),
)


@st.composite
def _paths(draw: st.DrawFn) -> list[Entry]:
    items: list[Message | Entry] = []
    for i, m in enumerate(draw(st.lists(_messages, max_size=30))):
        items.append(m)
        if draw(st.integers(0, 9)) == 0:
            kind = draw(st.sampled_from(["compaction", "branch", "custom", "custom_message"]))
            parent = f"e{i}"
            n = len(items)
            if kind == "compaction":
                kept = f"e{draw(st.integers(0, n))}"
                items.append(CompactionEntry(id=f"e{n}", parent_id=parent, timestamp=TS,
                                             summary="s", first_kept_entry_id=kept))
            elif kind == "branch":
                items.append(BranchSummaryEntry(id=f"e{n}", parent_id=parent, timestamp=TS,
                                                from_id="x", summary="b"))
            elif kind == "custom":
                items.append(CustomEntry(id=f"e{n}", parent_id=parent, timestamp=TS,
                                         kind="k", data=None))
            else:
                items.append(CustomMessageEntry(id=f"e{n}", parent_id=parent, timestamp=TS,
                                                kind="k", content=(TextPart(text="cm"),)))
    return chain(*items)


@settings(max_examples=500, deadline=None)
@given(_paths())
def test_property_context_is_always_valid_for_providers(path: list[Entry]) -> None:
    out = build_context(path)
    assert_valid_for_providers(out)
    # Idempotent: valid context passes through unchanged.
    assert normalize_tool_pairs(out) == out


@settings(max_examples=300, deadline=None)
@given(st.lists(_messages, max_size=30))
def test_property_pairing_keeps_every_real_result_it_can_place(msgs: list[Message]) -> None:
    out = normalize_tool_pairs(msgs)
    assert_valid_for_providers(out)
    kept_real = [m for m in out if isinstance(m, ToolResultMessage) and m.synthesized is None]
    # Every kept result is one of the inputs (nothing invented but interruptions),
    # and user messages survive in order.
    assert all(any(r is m for m in msgs) for r in kept_real)
    assert [m for m in out if isinstance(m, UserMessage)] == [
        m for m in msgs if isinstance(m, UserMessage)
    ]
