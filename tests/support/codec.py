"""Hypothesis strategies for entries and messages, shared by the codec tests.

Importing this registers one custom kind, ``TODO_KIND`` (a msgspec ``Todo``),
so that generated custom entries decode to it."""

from __future__ import annotations

from datetime import UTC, timedelta, timezone

import msgspec
from hypothesis import strategies as st

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
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    MessageEntry,
    register_custom,
)


class Todo(msgspec.Struct, frozen=True):
    title: str
    done: bool = False
    tags: list[str] = []


TODO_KIND = "test_codec.todo"


register_custom(TODO_KIND, Todo)


json_scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)


json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


entry_ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1,
                    max_size=20)


optional_text = st.none() | st.text(max_size=20)


timestamps = st.datetimes(timezones=st.just(UTC))


text_parts = st.builds(TextPart, text=st.text())


image_parts = st.builds(ImagePart, data=st.text(), mime_type=st.sampled_from(["image/png", "a/b"]))


thinking_parts = st.builds(
    ThinkingPart, thinking=st.text(), signature=optional_text, redacted=st.booleans(),
    provider=optional_text,
)


tool_calls = st.builds(
    ToolCall, id=entry_ids, name=st.text(min_size=1),
    arguments=st.dictionaries(st.text(), json_values, max_size=5),
)


user_content = st.lists(text_parts | image_parts, max_size=4).map(tuple)


usages = st.builds(
    Usage, input_tokens=st.integers(0, 10**9), output_tokens=st.integers(0, 10**9),
    cache_read_tokens=st.integers(0, 10**9), cache_write_tokens=st.integers(0, 10**9),
    reasoning_tokens=st.integers(0, 10**9),
)


messages = st.one_of(
    st.builds(UserMessage, content=user_content),
    st.builds(
        AssistantMessage,
        content=st.lists(text_parts | thinking_parts | tool_calls, max_size=5).map(tuple),
        model=st.text(), provider=st.text(), api=st.text(), usage=usages,
        stop_reason=st.sampled_from(["stop", "length", "tool_use", "error", "aborted"]),
        error_message=optional_text, response_id=optional_text,
    ),
    st.builds(
        ToolResultMessage, tool_call_id=entry_ids, tool_name=st.text(), content=user_content,
        is_error=st.booleans(), synthesized=st.sampled_from([None, "aborted", "interrupted"]),
        details=json_values,
    ),
)


entry_header = {
    "id": entry_ids, "parent_id": st.none() | entry_ids, "timestamp": timestamps,
    "origin_id": st.none() | entry_ids,
}


entries = st.one_of(
    st.builds(MessageEntry, message=messages, **entry_header),
    st.builds(
        CompactionEntry, summary=st.text(), first_kept_entry_id=entry_ids,
        tokens_before=st.integers(0, 2**40), details=json_values, **entry_header,
    ),
    st.builds(BranchSummaryEntry, from_id=entry_ids, summary=st.text(), details=json_values,
              **entry_header),
    st.builds(
        CustomMessageEntry, kind=st.text(), content=user_content, display=st.booleans(),
        details=json_values, **entry_header,
    ),
    st.builds(
        CustomEntry, kind=st.just(TODO_KIND),
        data=st.builds(Todo, title=st.text(), done=st.booleans(), tags=st.lists(st.text())),
        **entry_header,
    ),
)


def uuid7(ms: int, rest: int) -> str:
    value = (ms << 80) | (0x7 << 76) | ((rest >> 62) & 0xFFF) << 64 | (0b10 << 62) | (
        rest & ((1 << 62) - 1))
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


v7_ids = st.builds(uuid7, st.integers(0, 2**48 - 1), st.integers(0, 2**74 - 1))


utc_offsets = st.sampled_from([timezone(timedelta(hours=2)),
                               timezone(-timedelta(hours=5, minutes=30))])


any_timestamps = st.datetimes(timezones=utc_offsets) | st.datetimes()  # an offset, or none


text_messages = st.one_of(
    st.builds(UserMessage.of, st.text()),
    st.builds(lambda t: AssistantMessage(content=(TextPart(text=t),)), st.text()),
    messages,
)


compactable = st.builds(
    MessageEntry, id=v7_ids | entry_ids, parent_id=st.none() | v7_ids | entry_ids,
    timestamp=timestamps | any_timestamps, message=text_messages, origin_id=st.none() | entry_ids,
)
