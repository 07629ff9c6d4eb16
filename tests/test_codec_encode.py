"""S16 at the edge of the encode fast path: untyped data inside messages.

Tool call ``arguments`` and tool result ``details`` skip the line's nesting
scan only while they hold no list or dict; these tests put nesting right at
and one past ``MAX_DEPTH`` inside them, so a fast path that skipped the scan
for them would store a line that is too deep.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from threadline.ai._messages import (
    AssistantMessage,
    TextPart,
    ToolCall,
    ToolResultMessage,
)
from threadline.errors import InvalidEntry
from threadline.session import SessionRecord
from threadline.session._codec import MAX_DEPTH, decode_entry, encode_entry
from threadline.session._entries import MessageEntry
from threadline.stores import MemoryStore

TS = datetime(2025, 1, 1, tzinfo=UTC)
# Levels above the untyped value: the entry, its message, the content array,
# the tool call, its arguments object.
ARGUMENT_LEVELS = 5
DETAIL_LEVELS = 2  # the entry, its message


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _call_entry(arguments: dict[str, Any]) -> MessageEntry:
    message = AssistantMessage(content=(TextPart(text="calling"),
                                        ToolCall(id="c", name="t", arguments=arguments)),
                               stop_reason="tool_use")
    return MessageEntry(id="a", timestamp=TS, message=message)


def _result_entry(details: Any) -> MessageEntry:
    message = ToolResultMessage(tool_call_id="c", tool_name="t",
                                content=(TextPart(text="done"),), details=details)
    return MessageEntry(id="r", timestamp=TS, message=message)


def test_s16_flat_tool_call_arguments_round_trip() -> None:
    entry = _call_entry({"step": 3, "q": "[{[{", "f": 2.5, "ok": True, "none": None})
    assert decode_entry(encode_entry(entry)) == entry


def test_s16_tool_call_arguments_nested_to_the_limit_are_stored() -> None:
    entry = _call_entry({"x": _nested(MAX_DEPTH - ARGUMENT_LEVELS)})
    assert decode_entry(encode_entry(entry)) == entry


def test_s16_tool_call_arguments_nested_past_the_limit_are_refused() -> None:
    entry = _call_entry({"flat": 1, "x": _nested(MAX_DEPTH - ARGUMENT_LEVELS + 1)})
    with pytest.raises(InvalidEntry, match=f"deeper than {MAX_DEPTH}"):
        encode_entry(entry)


def test_s16_second_tool_call_nested_past_the_limit_is_refused() -> None:
    deep = _nested(MAX_DEPTH - ARGUMENT_LEVELS + 1)
    message = AssistantMessage(content=(ToolCall(id="c1", name="t", arguments={"a": 1}),
                                        ToolCall(id="c2", name="t", arguments={"d": deep})))
    with pytest.raises(InvalidEntry, match=f"deeper than {MAX_DEPTH}"):
        encode_entry(MessageEntry(id="a", timestamp=TS, message=message))


def test_s16_tool_result_details_nested_to_the_limit_are_stored() -> None:
    entry = _result_entry(_nested(MAX_DEPTH - DETAIL_LEVELS))
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize("details", [_nested(MAX_DEPTH - DETAIL_LEVELS + 1),
                                     {"k": _nested(MAX_DEPTH - DETAIL_LEVELS)}],
                         ids=["list", "dict"])
def test_s16_tool_result_details_nested_past_the_limit_are_refused(details: Any) -> None:
    with pytest.raises(InvalidEntry, match=f"deeper than {MAX_DEPTH}"):
        encode_entry(_result_entry(details))


async def test_s16_memory_store_refuses_a_deep_single_append_and_keeps_its_log() -> None:
    store = MemoryStore()
    await store.create_session(SessionRecord(id="s", created_at=TS))
    good = _call_entry({"step": 1})
    await store.append_entries("s", [good])
    bad = _result_entry(_nested(MAX_DEPTH))
    with pytest.raises(InvalidEntry):
        await store.append_entries("s", [bad])
    await store.append_entries("s", [good])  # S25: the same single entry again is a retry
    assert list(await store.load_entries("s")) == [good]
