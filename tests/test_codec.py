"""The JSON-lines codec: round trips, defaults, versioning, custom and unknown kinds (S6, S9)."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.codec import (
    TODO_KIND,
    Todo,
    compactable,
    entries,
    entry_header,
    json_values,
    uuid7,
)
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
from threadline.errors import ConfigError, CorruptLog, InvalidEntry
from threadline.session._codec import (
    compact_line,
    decode_entry,
    encode_compact,
    encode_entry,
    expand_line,
)
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
    custom_kinds,
    register_custom,
)
from threadline.stores.file._format import _InitLine, decode_init, decode_lines, encode_init, frame
from threadline.stores.file._format import export_lines as encode_entries


@dataclasses.dataclass(frozen=True)
class Note:
    text: str
    score: float


NOTE_KIND = "test_codec.note"
register_custom(NOTE_KIND, Note)

TS = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

NESTED_ARGS: dict[str, Any] = {
    "path": "/tmp/ü.txt",
    "options": {"depth": 3, "filters": [{"re": "^a.*$", "neg": False}, None], "ratio": 0.25},
    "empty": {},
    "big": 2**62,
}

ALL_PARTS_ASSISTANT = AssistantMessage(
    content=(
        ThinkingPart(thinking="let me think", signature="sig==", provider="anthropic"),
        ThinkingPart(thinking="", signature="opaque-blob", redacted=True),
        TextPart(text="Héllo 👋\nworld"),
        ToolCall(id="call_1", name="read", arguments=NESTED_ARGS),
        ToolCall(id="call_2", name="noop"),
    ),
    model="m-1",
    provider="p",
    api="chat",
    usage=Usage(
        input_tokens=10, output_tokens=5, cache_read_tokens=2, cache_write_tokens=1,
        reasoning_tokens=3,
    ),
    stop_reason="tool_use",
    response_id="resp_1",
)

SAMPLES: dict[str, Entry] = {
    "user_text_and_image": MessageEntry(
        id="e1", timestamp=TS,
        message=UserMessage.of("look", ImagePart(data="iVBORw0KGgo=", mime_type="image/png")),
    ),
    "assistant_all_parts": MessageEntry(
        id="e2", parent_id="e1", timestamp=TS, message=ALL_PARTS_ASSISTANT
    ),
    "assistant_error": MessageEntry(
        id="e2b", parent_id="e1", timestamp=TS,
        message=AssistantMessage(stop_reason="error", error_message="boom"),
    ),
    "tool_result": MessageEntry(
        id="e3", parent_id="e2", timestamp=TS,
        message=ToolResultMessage(
            tool_call_id="call_1", tool_name="read",
            content=(TextPart(text="ok"), ImagePart(data="AAAA", mime_type="image/jpeg")),
            is_error=True, synthesized="interrupted", details={"exit": 1, "lines": [1, 2]},
        ),
    ),
    "compaction": CompactionEntry(
        id="e4", parent_id="e3", timestamp=TS, summary="so far", first_kept_entry_id="e2",
        tokens_before=12345, details={"files": ["a.py"]},
    ),
    "branch_summary": BranchSummaryEntry(
        id="e5", parent_id="e4", timestamp=TS, from_id="e3", summary="tried X"
    ),
    "custom_struct": CustomEntry(
        id="e6", parent_id="e5", timestamp=TS, kind=TODO_KIND,
        data=Todo(title="ship", tags=["x"]),
    ),
    "custom_dataclass": CustomEntry(
        id="e7", parent_id="e6", timestamp=TS, kind=NOTE_KIND, data=Note(text="n", score=0.5)
    ),
    "custom_message": CustomMessageEntry(
        id="e8", parent_id="e7", timestamp=TS, kind="reminder",
        content=(TextPart(text="remember"),), display=False, details=[1],
    ),
    "forked_copy": MessageEntry(
        id="e9", parent_id="e8", timestamp=TS, origin_id="src-e1",
        message=UserMessage.of("copied"),
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_entry_kind_round_trips(name: str) -> None:
    entry = SAMPLES[name]
    line = encode_entry(entry)
    assert b"\n" not in line
    back = decode_entry(line)
    assert type(back) is type(entry)
    assert back == entry
    assert encode_entry(back) == line


def test_encode_entries_writes_one_terminated_line_per_entry() -> None:
    entries = list(SAMPLES.values())
    blob = encode_entries(entries)
    assert blob.endswith(b"\n")
    lines = blob.split(b"\n")[:-1]
    assert lines == [compact_line(encode_entry(e)) for e in entries]  # as a v3 file holds them
    assert [decode_entry(x) for x in lines] == entries
    assert encode_entries([]) == b""


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_line_starts_with_its_type(name: str) -> None:
    obj = msgspec.json.decode(encode_entry(SAMPLES[name]))
    assert next(iter(obj)) == "type"
    assert obj["type"] in {
        "message", "compaction", "branch_summary", "custom", "custom_message"
    }


def test_defaults_are_omitted() -> None:
    entry = MessageEntry(
        id="a", timestamp=TS,
        message=AssistantMessage(content=(TextPart(text="hi"), ToolCall(id="c", name="t"))),
    )
    obj = msgspec.json.decode(encode_entry(entry))
    # Header fields with a default (parent_id, origin_id) are left out, id and
    # timestamp never are.
    assert set(obj) == {"type", "id", "timestamp", "message"}
    assert obj["message"] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}, {"type": "tool_call", "id": "c", "name": "t"}],
    }
    result = msgspec.json.decode(encode_entry(MessageEntry(
        id="b", timestamp=TS, message=ToolResultMessage(tool_call_id="c", tool_name="t"),
    )))
    assert result["message"] == {"role": "tool_result", "tool_call_id": "c", "tool_name": "t"}
    thinking = msgspec.json.encode(ThinkingPart(thinking="t"))
    assert msgspec.json.decode(thinking) == {"type": "thinking", "thinking": "t"}


def test_header_defaults_fill_in_id_and_timestamp() -> None:
    with pytest.raises(CorruptLog):  # decoding never fills them in ...
        decode_entry(b'{"type":"message","message":{"role":"user","content":[]}}')
    # ... but constructing an entry still does, in this thread and in others.
    before = datetime.now(UTC)
    a, b = MessageEntry(message=UserMessage.of("x")), MessageEntry(message=UserMessage.of("y"))
    assert a.id != b.id
    assert a.id < b.id
    assert before <= a.timestamp <= datetime.now(UTC)
    assert decode_entry(encode_entry(a)) == a
    made: list[MessageEntry] = []
    worker = threading.Thread(target=lambda: made.append(MessageEntry(message=b.message)))
    worker.start()
    worker.join()
    assert made[0].id > b.id
    assert made[0].timestamp >= b.timestamp


def test_line_separators_inside_text_stay_on_one_line() -> None:
    # JSON allows U+2028/U+2029 unescaped; readers must split on b"\n" only.
    entry = MessageEntry(id="a", timestamp=TS, message=UserMessage.of("a\u2028b\u2029c\r\nd\x00"))
    blob = encode_entries([entry, entry])
    assert blob.count(b"\n") == 2
    assert decode_entry(blob.split(b"\n")[0]) == entry


# -- session_init -----------------------------------------------------------------


def test_session_init_carries_format_version_and_record() -> None:
    record = SessionRecord(id="sess/ü", parent_id="parent", created_at=TS)
    line = encode_init(record)
    obj = msgspec.json.decode(line)
    assert list(obj)[:2] == ["type", "version"]
    assert obj == {
        "type": "session_init", "version": FORMAT_VERSION, "id": "sess/ü",
        "parent_id": "parent", "created_at": "2025-01-02T03:04:05.678901Z",
    }
    assert decode_init(line) == record
    root = SessionRecord(id="r", created_at=TS)
    assert msgspec.json.decode(encode_init(root))["parent_id"] is None
    assert decode_init(encode_init(root)) == root


def test_session_init_from_a_newer_format_is_refused_with_where() -> None:
    line = msgspec.json.encode(_InitLine(version=FORMAT_VERSION + 1, id="s", created_at=TS))
    with pytest.raises(CorruptLog) as info:
        decode_init(line, path="root/s.jsonl")
    assert str(info.value).startswith("root/s.jsonl line 1: ")
    assert f"version {FORMAT_VERSION + 1}" in str(info.value)
    assert info.value.session_id == "s"


@pytest.mark.parametrize(
    "line",
    [b"", b"{", b'{"type":"message","id":"a","message":{"role":"user","content":[]}}',
     b'{"type":"session_init","id":"s"}'],
)
def test_bad_session_init_is_corrupt_log_naming_file_and_line(line: bytes) -> None:
    with pytest.raises(CorruptLog) as info:
        decode_init(line, session_id="s", path="root/s.jsonl")
    assert str(info.value).startswith("root/s.jsonl line 1: expected a session_init line")
    assert (info.value.path, info.value.line, info.value.session_id) == ("root/s.jsonl", 1, "s")


# -- custom entries (S9) ----------------------------------------------------------


def test_s9_registered_struct_kind_decodes_to_its_class() -> None:
    line = encode_entry(SAMPLES["custom_struct"])
    back = decode_entry(line)
    assert isinstance(back, CustomEntry)
    assert back.data == Todo(title="ship", tags=["x"])
    assert type(back.data) is Todo


def test_s9_registered_dataclass_kind_decodes_to_its_class() -> None:
    back = decode_entry(encode_entry(SAMPLES["custom_dataclass"]))
    assert isinstance(back, CustomEntry)
    assert type(back.data) is Note
    assert back.data == Note(text="n", score=0.5)


def test_s9_unregistered_kind_keeps_raw_fields_and_reencodes_byte_for_byte() -> None:
    kind = f"test_codec.late.{uuid.uuid4().hex}"
    # What a process that registered `kind` wrote:
    payload: dict[str, Any] = {
        "title": "ünï ✓", "nested": {"a": [1, 2.5, None, {"b": True}]}, "n": -7
    }
    written = encode_entry(
        CustomEntry(id="c1", parent_id="p", timestamp=TS, kind=kind, data=payload)
    )
    # ... read by a process that never registered it:
    bare = decode_entry(written)
    assert type(bare) is CustomEntry
    assert (bare.id, bare.parent_id, bare.timestamp, bare.kind) == ("c1", "p", TS, kind)
    assert isinstance(bare.data, msgspec.Raw)
    assert msgspec.json.decode(bare.data) == payload
    assert encode_entry(bare) == written
    assert encode_entries([bare]) == written + b"\n"

    @dataclasses.dataclass
    class Late:
        title: str
        nested: dict[str, Any]
        n: int

    register_custom(kind, Late)
    assert custom_kinds()[kind] is Late
    typed = decode_entry(written)
    assert isinstance(typed, CustomEntry)
    assert typed.data == Late(**payload)
    assert encode_entry(typed) == written
    # The bare entry decoded before registration is unaffected and still lossless.
    assert encode_entry(bare) == written


def test_s9_unregistered_payload_does_not_pin_the_input_buffer() -> None:
    line = bytearray(encode_entry(
        CustomEntry(id="c", timestamp=TS, kind=f"k.{uuid.uuid4().hex}", data={"x": 1})
    ))
    bare = decode_entry(memoryview(line))
    assert isinstance(bare, CustomEntry)
    line[:] = b"X" * len(line)  # the reader reuses its buffer
    assert bytes(bare.data) == b'{"x":1}'


def test_s9_registering_a_kind_to_another_class_is_an_error() -> None:
    register_custom(TODO_KIND, Todo)  # same class again: a no-op
    with pytest.raises(ConfigError, match=TODO_KIND):
        register_custom(TODO_KIND, Note)
    assert custom_kinds()[TODO_KIND] is Todo
    with pytest.raises(ConfigError):
        register_custom("", Todo)


def test_s9_custom_kinds_is_a_copy() -> None:
    kinds = custom_kinds()
    kinds[TODO_KIND] = Note
    assert custom_kinds()[TODO_KIND] is Todo


def test_s9_registered_kind_with_data_that_does_not_fit_is_corrupt_log() -> None:
    entry = CustomEntry(id="c", timestamp=TS, kind=TODO_KIND, data={"title": 3})
    with pytest.raises(InvalidEntry, match="Todo"):  # never stored ...
        encode_entry(entry)
    line = msgspec.json.encode(entry)  # ... but another program may write it
    with pytest.raises(CorruptLog) as info:
        decode_entry(line, path="s.jsonl", lineno=9)
    assert str(info.value).startswith("s.jsonl line 9: custom entry of kind 'test_codec.todo'")
    assert "Todo" in str(info.value)


# -- unknown entry types ----------------------------------------------------------


def test_unknown_type_is_kept_as_opaque_and_reencoded_unchanged() -> None:
    line = (
        b'{"type":"model_change","id":"o1","parent_id":"e1",'
        b'"timestamp":"2025-01-02T03:04:05Z","model":{"name":"x","\\u00fc":[1,{"z":null}]}}'
    )
    entry = decode_entry(line)
    assert isinstance(entry, OpaqueEntry)
    assert (entry.type, entry.id, entry.parent_id) == ("model_change", "o1", "e1")
    assert entry.timestamp == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert encode_entry(entry) == line
    assert encode_entries([SAMPLES["branch_summary"], entry]) == (
        encode_entry(SAMPLES["branch_summary"]) + b"\n" + line + b"\n"
    )
    assert decode_entry(line.decode()) == entry  # str input too
    root = decode_entry(b'{"type":"future","id":"o2"}')
    assert isinstance(root, OpaqueEntry)
    assert (root.parent_id, root.timestamp) == (None, None)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"type":"message","id":"a"', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "expected an entry"),
        (b'"message"', "expected an entry"),
        (b'{"id":"a","message":{"role":"user","content":[]}}', "expected an entry"),
        (b'{"type":"message","id":"a"}', "expected an entry"),
        (b'{"type":"message","id":"a","message":{"role":"robot","content":[]}}',
         "expected an entry"),
        (b'{"type":"compaction","id":"a","summary":"s","first_kept_entry_id":5}',
         "expected an entry"),
        (b'{"type":"custom","id":"a","kind":"k"}', "expected an entry"),
        (b'{"type":"session_init","version":1,"id":"s","created_at":"2025-01-01T00:00:00Z"}',
         "expected an entry"),
        (b'{"type":"future_kind"}', "expected an entry"),  # unknown type without a header
        # A missing id or timestamp must not be invented anew on every load.
        (b'{"type":"message","timestamp":"2025-01-01T00:00:00Z",'
         b'"message":{"role":"user","content":[]}}', "expected an entry with an id"),
        (b'{"type":"custom","id":"","timestamp":"2025-01-01T00:00:00Z","kind":"k","data":1}',
         "expected an entry"),
        (b'{"type":"future","id":"","timestamp":"2025-01-01T00:00:00Z"}',
         "expected an entry"),
        (b'{"type":"compaction","id":"a","summary":"s","first_kept_entry_id":"b"}',
         "expected an entry with an id and a timestamp"),
    ],
)
def test_bad_line_is_corrupt_log_naming_file_and_line(line: bytes, expected: str) -> None:
    with pytest.raises(CorruptLog) as info:
        decode_entry(line, session_id="s1", path="sessions/s1.jsonl", lineno=17)
    assert str(info.value).startswith(f"sessions/s1.jsonl line 17: {expected}")
    assert (info.value.path, info.value.line, info.value.session_id) == (
        "sessions/s1.jsonl", 17, "s1"
    )


# -- property: any message or entry survives a round trip ----------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries)
def test_property_any_entry_round_trips(entry: Entry) -> None:
    line = encode_entry(entry)
    assert b"\n" not in line
    back = decode_entry(line)
    assert back == entry
    assert encode_entry(back) == line


@settings(max_examples=100, deadline=None)
@given(st.lists(entries, max_size=8))
def test_property_encode_entries_splits_back_into_the_same_entries(batch: list[Entry]) -> None:
    blob = encode_entries(batch)
    assert [decode_entry(x) for x in blob.split(b"\n")[:-1]] == batch


@settings(max_examples=150, deadline=None)
@given(st.builds(CustomEntry, kind=st.text(min_size=1).map(lambda k: "unreg." + k),
                 data=json_values, **entry_header))
def test_property_unregistered_custom_entries_are_lossless(entry: CustomEntry[Any]) -> None:
    line = encode_entry(entry)
    bare = decode_entry(line)
    assert isinstance(bare, CustomEntry)
    assert isinstance(bare.data, msgspec.Raw)
    assert encode_entry(bare) == line


def test_design_doc_example_session_file_decodes_and_reencodes_unchanged() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text("utf-8")
    block = doc.split("<!-- example-session-file")[1].split("```jsonl\n")[1].split("```")[0]
    first, *rest = block.encode().splitlines()
    record = decode_init(first)
    assert record.id == "user-42"
    assert encode_init(record) == first
    decoded = decode_lines(b"\n".join(rest))
    assert [type(e).__name__ for e in decoded] == ["MessageEntry"] * 3 + ["CustomEntry"]
    assert [e.parent_id for e in decoded[1:]] == [e.id for e in decoded[:-1]]
    # Written again as the file store writes them: two single calls, then one of two.
    lines = [encode_entry(e) for e in decoded]
    assert [frame(lines[:1]), frame(lines[1:2]), frame(lines[2:])] == [
        line + b"\n" for line in rest]
    assert all(line.startswith(b"[") for line in rest[:2])  # compact message entries


# -- foreign lines byte for byte (S15) ------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        # a field this version does not know, on each kind of entry
        b'{"type":"message","id":"a","timestamp":"2025-01-01T00:00:00Z","message":'
        b'{"role":"user","content":[]},"new_field":{"x":[1,2]}}',
        b'{"type":"custom","id":"a","timestamp":"2025-01-01T00:00:00Z","kind":"unreg.k",'
        b'"data":1,"extra":true}',
        b'{"type":"compaction","id":"a","timestamp":"2025-01-01T00:00:00Z","summary":"s",'
        b'"first_kept_entry_id":"b","model":"m"}',
        # registered data with a field its class lacks, and in another key order
        b'{"type":"custom","id":"a","timestamp":"2025-01-01T00:00:00Z","kind":"test_codec.todo",'
        b'"data":{"done":true,"title":"t","due":"friday"}}',
        # timestamps spelled another way
        b'{"type":"message","id":"a","timestamp":"2025-01-01T00:00:00.12Z","message":'
        b'{"role":"user","content":[]}}',
        b'{"type":"message","id":"a","timestamp":"2025-01-01T00:00:00+00:00","message":'
        b'{"role":"user","content":[]}}',
        # key order, spacing and escapes this version would not write
        b'{"id":"a", "type":"message","timestamp":"2025-01-01T00:00:00Z","message":'
        b'{"content":[{"text":"\\u00e9\\/","type":"text"}],"role":"user"}}',
    ],
)
def test_s15_line_this_version_would_write_differently_reencodes_byte_for_byte(
    line: bytes,
) -> None:
    entry = decode_entry(line)
    assert encode_entry(entry) == line
    assert decode_lines(line + b"\n" + line.replace(b'"a"', b'"b"', 1)) == [
        entry, decode_entry(line.replace(b'"a"', b'"b"', 1))]
    assert encode_entry(decode_lines(line)[0]) == line
    # Values are decoded as usual ...
    assert not isinstance(entry, OpaqueEntry)
    plain = type(entry).__mro__[1]
    assert isinstance(entry, plain) and type(entry).__name__ == plain.__name__
    # ... and a changed copy is written as this version writes.
    changed = msgspec.structs.replace(entry, parent_id="p")
    assert encode_entry(changed) == msgspec.json.encode(plain(**msgspec.structs.asdict(changed)))


def test_s15_batch_line_entries_keep_their_own_bytes() -> None:
    odd = (b'{"type":"message","id":"x","timestamp":"2025-01-01T00:00:00.5Z","message":'
           b'{"role":"user","content":[]},"k":1}')
    plain = encode_entry(SAMPLES["branch_summary"])
    batch = b'{"type":"batch","entries":[' + plain + b"," + odd + b"]}"
    entries = decode_lines(batch + b"\n")
    assert [encode_entry(e) for e in entries] == [plain, odd]


# -- what may be stored (S16) -----------------------------------------------------------


def test_s16_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = "[" * 500 + "{" * 500 + '\\"]' + "}" * 10
    entry = MessageEntry(id="a", timestamp=TS, message=UserMessage.of(text))
    assert decode_entry(encode_entry(entry)) == entry


def test_s16_line_numbers_and_blank_lines_in_many_lines() -> None:
    line = encode_entry(SAMPLES["branch_summary"])
    with pytest.raises(CorruptLog) as info:
        decode_lines(line + b"\n\n" + line + b"\n", path="x.jsonl", first_line=2)
    assert (info.value.path, info.value.line) == ("x.jsonl", 3)
    deep = b"[" * 10_000 + b"]" * 10_000
    with pytest.raises(CorruptLog) as info:
        decode_lines(line + b"\n" + deep, path="x.jsonl")
    assert info.value.line == 2 and len(str(info.value)) < 300


def test_s15_an_entry_read_from_a_foreign_line_pickles_with_its_line() -> None:
    import copy
    import pickle

    line = (b'{"type":"message","id":"a","timestamp":"2025-01-01T00:00:00.1Z","message":'
            b'{"role":"user","content":[]},"x":1}')
    entry = decode_entry(line)
    for clone in (pickle.loads(pickle.dumps(entry)), copy.deepcopy(entry), copy.copy(entry)):
        assert clone == entry
        assert encode_entry(clone) == line


# -- format version 3: compact message entries (S35, S36) -------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compactable)
def test_s35_a_compact_line_gives_back_exactly_the_entry(entry: MessageEntry) -> None:
    line = encode_entry(entry)
    compact = compact_line(line)
    back = decode_entry(compact)
    assert back == entry
    assert (back.id, back.parent_id, back.timestamp) == (entry.id, entry.parent_id,
                                                         entry.timestamp)
    assert back.timestamp.utcoffset() == entry.timestamp.utcoffset()
    assert expand_line(compact) == line
    assert decode_lines(compact + b"\n") == [entry]
    assert compact_line(encode_entry(back)) == compact  # the same bytes every time
    assert compact.startswith(b"[") is (entry.origin_id is None)
    assert encode_compact(entry) == (line, compact)  # the file store's one-pass form


@settings(max_examples=100, deadline=None)
@given(st.lists(compactable | entries, min_size=1, max_size=8))
def test_s35_version_3_framing_loads_back_the_same_entries(batch: list[Entry]) -> None:
    lines = [encode_entry(e) for e in batch]
    one_call = frame(lines, version=3)
    assert one_call.count(b"\n") == 1  # still one line per call (S14)
    compact = [compact_line(line) for line in lines]
    assert [encode_compact(e) for e in batch] == list(zip(lines, compact, strict=True))
    assert frame(lines, version=3, compact=compact) == one_call
    each = b"".join(frame([line], version=3) for line in lines)
    assert decode_lines(one_call) == batch
    assert decode_lines(each) == batch
    assert frame(lines, version=2) == (b'{"type":"batch","entries":[' + b",".join(lines) + b"]}\n"
                                       if len(lines) > 1 else lines[0] + b"\n")


def test_s35_a_text_message_costs_half_its_canonical_framing() -> None:
    text = "x" * 400
    entry = MessageEntry(parent_id=uuid7(1, 2), message=UserMessage.of(text))
    compact = compact_line(encode_entry(entry))
    assert compact == msgspec.json.encode([entry.id, entry.parent_id, entry.timestamp, text])
    assert len(compact) - len(text) < 120  # against about 220 for the canonical line
    assert len(encode_entry(entry)) - len(text) > 200
    reply = MessageEntry(parent_id=entry.id,
                         message=AssistantMessage(content=(TextPart(text=text),)))
    assert compact_line(encode_entry(reply)).endswith(b',["' + text.encode() + b'"]]')
    # Anything more than one text part, or a set field, keeps the message object.
    tool = MessageEntry(message=AssistantMessage(content=(TextPart(text="t"),), model="m"))
    assert compact_line(encode_entry(tool)).endswith(
        b',{"role":"assistant","content":[{"type":"text","text":"t"}],"model":"m"}]')


def test_s35_a_compact_line_is_checked_like_any_line() -> None:
    with pytest.raises(CorruptLog) as info:
        decode_entry(b'["a",null,"yesterday","hi"]', path="f.jsonl", lineno=3)
    assert (info.value.path, info.value.line) == ("f.jsonl", 3)
    for bad in (b'["",null,"2025-01-01T00:00:00Z","hi"]', b'["a",""]', b'["a",null,1,"hi"]'):
        with pytest.raises(CorruptLog):
            decode_lines(bad + b"\n")


@pytest.mark.parametrize("line", [
    # a foreign message line, however close to what this version writes
    b'{"type":"message","id":"0195510a-8e20-7c11-9a2b-3f0e6c1d2a01","timestamp":'
    b'"2025-03-01T09:30:01.12025Z","message":{"role":"user","content":[{"type":"text",'
    b'"text":"hi"}]}}',
    b'{"type":"message","id":"0195510a-8e20-7c11-9a2b-3f0e6c1d2a01","timestamp":'
    b'"2025-03-01T09:30:01.120250Z","message":{"role":"user","content":[{"type":"text",'
    b'"text":"hi"}]},"extra":1}',
])
def test_s36_foreign_lines_keep_their_bytes_in_a_version_3_file(line: bytes) -> None:
    assert compact_line(line) == line
    entry = decode_entry(line)
    assert frame([encode_entry(entry)], version=3) == line + b"\n"


@pytest.mark.parametrize("line", [
    # a message object where this version writes the bare text
    b'["0195510a-8e20-7c11-9a2b-3f0e6c1d2a01",null,"2025-03-01T09:30:01.120250Z",'
    b'{"role":"user","content":[{"type":"text","text":"hi"}]}]',
    # another spelling of the timestamp, other spacing, another escape
    b'["0195510a-8e20-7c11-9a2b-3f0e6c1d2a01",null,"2025-03-01T09:30:01.12025+00:00","hi"]',
    b'["0195510a-8e20-7c11-9a2b-3f0e6c1d2a01", null, "2025-03-01T09:30:01.120250Z", "hi"]',
    b'["0195510a-8e20-7c11-9a2b-3f0e6c1d2a01",null,"2025-03-01T09:30:01.120250Z","\\u0068i"]',
])
def test_s36_a_compact_line_this_version_would_write_otherwise_is_kept(line: bytes) -> None:
    entry = decode_entry(line)
    assert isinstance(entry, MessageEntry)
    assert entry.message == UserMessage.of("hi")
    assert entry.timestamp == datetime(2025, 3, 1, 9, 30, 1, 120250, tzinfo=UTC)
    assert encode_entry(entry) == line
    assert frame([encode_entry(entry)], version=3) == line + b"\n"
    assert decode_lines(line + b"\n" + line.replace(b"0195510a-8e20", b"0195510a-8e21")) == [
        entry, decode_entry(line.replace(b"0195510a-8e20", b"0195510a-8e21"))]


def test_s35_a_loaded_chain_holds_each_id_once() -> None:
    # The retained memory of a load: a compact entry's parent id is the
    # previous entry's id string itself, in a plain run and in a mixed one.
    chain: list[Entry] = []
    for n in range(6):
        parent = chain[-1].id if chain else None
        chain.append(MessageEntry(parent_id=parent, message=UserMessage.of(f"m{n}")))
    lines = [encode_entry(e) for e in chain]
    for body in (b"".join(frame([line], version=3) for line in lines),
                 frame(lines[:1], version=3) + frame(lines[1:4], version=3)
                 + frame(lines[4:], version=2)):
        loaded = decode_lines(body)
        assert loaded == chain
        assert all(loaded[n].parent_id is loaded[n - 1].id for n in range(1, 4))
