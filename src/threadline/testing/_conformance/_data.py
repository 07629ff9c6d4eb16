"""What the conformance tests append and how they compare what comes back.

Entries of every kind, the entries no store may accept, the odd session ids
every store must keep, and the checks shared by the tests (same entries,
a log written by concurrent writers). The custom kind the suite round-trips
is registered only while a test needs it: the custom-entry registry is the
library's one global, and importing the suite leaves it as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import msgspec

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
from threadline.session import _entries
from threadline.session._codec import MAX_DEPTH, decode_entry, encode_entry
from threadline.session._entries import (
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

__all__ = [
    "INVALID_ENTRIES",
    "NOTE_KIND",
    "UNICODE_IDS",
    "UNREGISTERED_KIND",
    "ConformanceNote",
    "assert_same_entries",
    "at",
    "chain",
    "chain_entry",
    "check_concurrent_log",
    "fields",
    "nested",
    "note_registered",
    "sample_entries",
]


class ConformanceNote(msgspec.Struct, frozen=True, kw_only=True):
    """The registered custom kind the suite round-trips."""

    text: str
    tags: tuple[str, ...] = ()
    score: float = 0.0


NOTE_KIND = "threadline.conformance.note"
UNREGISTERED_KIND = "threadline.conformance.never-registered"


@contextlib.contextmanager
def note_registered() -> Iterator[None]:
    """``NOTE_KIND`` decodes to ``ConformanceNote`` inside the block, and not after it.

    The registry has no public way to forget a kind (an application registers
    for good), so the suite removes its own kind itself, and only if the
    block added it.
    """
    added = NOTE_KIND not in _entries.custom_kinds()
    register_custom(NOTE_KIND, ConformanceNote)
    try:
        yield
    finally:
        if added:
            _entries._CUSTOM.pop(NOTE_KIND, None)


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


def at(seconds: int) -> datetime:
    return datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def sample_entries() -> list[Entry]:
    """One chain holding every entry kind and every content part.

    The seventh entry is of the suite's registered custom kind: its data is a
    ``ConformanceNote`` while that kind is registered (inside the suite's
    tests that need it), and the same JSON, raw, otherwise, so the entries
    can be stored either way and encode to the same bytes.
    """
    ids = [new_id() for _ in range(9)]
    note = ConformanceNote(text="registered", tags=("a", "b"), score=0.5)
    opaque = decode_entry(
        b'{"type":"future.kind","id":"' + ids[8].encode() + b'","parent_id":"'
        + ids[7].encode() + b'","timestamp":"2024-05-01T12:00:00Z",'
        b'"payload":{"z":1, "a":[1.50,"\\u00e9",null]}}'
    )
    assert isinstance(opaque, OpaqueEntry)
    return [
        MessageEntry(
            id=ids[0], timestamp=at(0),
            message=UserMessage(content=(
                TextPart(text="What is in this picture? é ☃ 😀"),
                ImagePart(data="iVBORw0KGgo=", mime_type="image/png"),
            )),
        ),
        MessageEntry(
            id=ids[1], parent_id=ids[0], timestamp=at(1),
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
            id=ids[2], parent_id=ids[1], timestamp=at(2),
            message=ToolResultMessage(
                tool_call_id="call_1", tool_name="lookup",
                content=(TextPart(text="3 cats"), ImagePart(data="R0lG", mime_type="image/gif")),
                is_error=True, synthesized="interrupted", details={"exit": 1},
            ),
        ),
        MessageEntry(
            id=ids[3], parent_id=ids[2], timestamp=at(3),
            message=AssistantMessage(stop_reason="error", error_message="boom"),
        ),
        CompactionEntry(
            id=ids[4], parent_id=ids[3], timestamp=at(4), summary="Earlier: cats.",
            first_kept_entry_id=ids[2], tokens_before=1234, details={"files": ["a.py"]},
        ),
        BranchSummaryEntry(
            id=ids[5], parent_id=ids[4], timestamp=at(5), from_id=ids[3],
            summary="Tried a branch.", origin_id=new_id(),
        ),
        CustomEntry(
            id=ids[6], parent_id=ids[5], timestamp=at(6), kind=NOTE_KIND,
            data=note if NOTE_KIND in _entries.custom_kinds()
            else msgspec.Raw(msgspec.json.encode(note)),
        ),
        CustomEntry(
            id=ids[7], parent_id=ids[6], timestamp=at(7), kind=UNREGISTERED_KIND,
            data=msgspec.Raw(b'{"keep" : [1.0, 2.50, "\\u00e9"],  "order":{"b":1,"a":2}}'),
        ),
        opaque,
        CustomMessageEntry(
            parent_id=ids[8], timestamp=at(9), kind="reminder",
            content=(TextPart(text="remember"), ImagePart(data="AAAA", mime_type="image/png")),
            display=False, details=[1, "two"],
        ),
    ]


def nested(depth: int) -> object:
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
    "nested one level too deep": _custom(nested(MAX_DEPTH)),
    "nested 1,000 levels deep": _custom(nested(1_000)),
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


def fields(record: SessionRecord) -> tuple[str, str | None, datetime]:
    return record.id, record.parent_id, record.created_at


def chain(count: int, parent_id: str | None = None, writer: int = 0) -> list[Entry]:
    """``count`` entries, each the child of the one before."""
    out: list[Entry] = []
    for n in range(count):
        entry = chain_entry(parent_id, writer, n)
        parent_id = entry.id
        out.append(entry)
    return out


def chain_entry(parent_id: str | None, writer: int, n: int) -> MessageEntry:
    return MessageEntry(
        parent_id=parent_id,
        message=UserMessage(content=(TextPart(text=f"writer {writer} entry {n} " + "ä" * 40),)),
    )
