"""The bulk load path: a file body decoded a chunk of lines at a time.

``decode_body`` decodes, builds and checks ``_CHUNK`` bytes of lines at a
time and falls back to decoding line by line (``_decode_each``) for anything
it cannot settle. The line-by-line decode is the reference: whatever the
lines and wherever the chunks end, the bulk path gives exactly its entries.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.codec import compactable, entries
from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.errors import CorruptLog
from threadline.session import MessageEntry, SessionRecord, _codec
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry
from threadline.stores import FileStore
from threadline.stores.file import _format as codec
from threadline.stores.file._format import decode_body, frame

_ID = "0195510a-8e20-7c11-9a2b-3f0e6c1d2a0"

# Lines another program could have written: each loads, but not as the bulk
# path's "exactly what this version writes", so a body holding one is
# decoded line by line.
FOREIGN = [
    # another spelling of the timestamp; a message object where the text would do
    b'["' + _ID.encode() + b'1",null,"2025-03-01T09:30:01.12025+00:00","hi"]',
    b'["' + _ID.encode() + b'2",null,"2025-03-01T09:30:01.120250Z",'
    b'{"role":"user","content":[{"type":"text","text":"hi"}]}]',
    # a type this version does not know, a field it does not know
    b'{"type":"future_kind","id":"f1","timestamp":"2025-01-01T00:00:00Z","x":[1]}',
    b'{"type":"message","id":"f2","timestamp":"2025-01-01T00:00:00Z",'
    b'"message":{"role":"user","content":[]},"extra":1}',
    # a batch line with a foreign element between two of this version's
    b'{"type":"batch","entries":[["b1",null,"2025-01-01T00:00:00Z","x"],'
    b'["b2","b1","2025-01-01T00:00:00.000000Z","y"],["b3","b2","2025-01-01T00:00:00Z",["z"]]]}',
]


def _body(appends: list[tuple[int, list[Entry]]], foreign: list[tuple[int, bytes]]) -> bytes:
    calls = [frame([encode_entry(e) for e in batch], version=v) for v, batch in appends]
    for at, line in foreign:
        calls.insert(at % (len(calls) + 1), line + b"\n")
    return b"".join(calls)


def assert_same_load(got: list[Entry], want: list[Entry]) -> None:
    """The same entries, of the same classes, writing back the same bytes."""
    assert got == want
    assert [type(e) for e in got] == [type(e) for e in want]
    assert [encode_entry(e) for e in got] == [encode_entry(e) for e in want]
    for g, w in zip(got, want, strict=True):
        assert (g.id, g.parent_id, g.timestamp) == (w.id, w.parent_id, w.timestamp)
        if g.timestamp is not None and w.timestamp is not None:
            assert g.timestamp.utcoffset() == w.timestamp.utcoffset()
        message = getattr(g, "message", None)
        if message is not None:
            assert type(message) is type(w.message)  # type: ignore[union-attr]
            assert [type(p) for p in message.content] == [
                type(p) for p in w.message.content]  # type: ignore[union-attr]


def _reference(body: bytes) -> list[Entry]:
    return codec._decode_each(body, (None, None, 1))


_appends = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 3]), st.lists(compactable | entries, min_size=1,
                                                       max_size=5)),
    min_size=1, max_size=8,
)
_chunks = st.integers(1, 3000) | st.just(codec._CHUNK)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_appends, _chunks)
def test_s35_a_load_in_chunks_gives_what_the_line_by_line_decode_gives(
    appends: list[tuple[int, list[Entry]]], chunk: int,
) -> None:
    body = _body(appends, [])
    want = _reference(body)
    assert want == [e for _, batch in appends for e in batch]
    # This version's own lines never need the slow path, wherever a chunk ends.
    assert_same_load(codec._decode_chunks(body, 0, len(body), chunk), want)
    assert_same_load(decode_body(body, 0, len(body)), want)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_appends, st.lists(st.tuples(st.integers(0, 20), st.sampled_from(FOREIGN)),
                          min_size=1, max_size=3), _chunks)
def test_s36_foreign_lines_load_as_the_line_by_line_decode_loads_them(
    appends: list[tuple[int, list[Entry]]], foreign: list[tuple[int, bytes]], chunk: int,
) -> None:
    body = _body(appends, foreign)
    want = _reference(body)
    assert_same_load(decode_body(body, 0, len(body)), want)
    try:
        got = codec._decode_chunks(body, 0, len(body), chunk)
    except (codec._Recheck, msgspec.DecodeError, CorruptLog):
        return  # what decode_body then does is checked above
    assert_same_load(got, want)


def _chain(n: int, text: str) -> list[MessageEntry]:
    chain: list[MessageEntry] = []
    for i in range(n):
        message = (UserMessage.of(f"{i} {text}") if i % 2 == 0
                   else AssistantMessage(content=(TextPart(text=f"{i} {text}"),)))
        chain.append(MessageEntry(parent_id=chain[-1].id if chain else None, message=message))
    return chain


def test_s35_a_load_of_many_chunks_holds_each_id_once() -> None:
    # The retained memory of a load: a compact entry's parent id is the
    # previous entry's id string, across the chunks' ends too.
    chain = _chain(1500, "x" * 400)
    body = b"".join(frame([encode_entry(e)], version=3) for e in chain[:1000])
    body += frame([encode_entry(e) for e in chain[1000:]], version=3)  # one batch line
    assert len(body) > 2 * codec._CHUNK
    for chunk in (1, 997, codec._CHUNK):
        loaded = codec._decode_chunks(body, 0, len(body), chunk)
        assert_same_load(loaded, chain)
        assert all(loaded[n].parent_id is loaded[n - 1].id for n in range(1, len(loaded)))


_BAD_LINES = [
    (b'["a",null,"yesterday","hi"]', msgspec.ValidationError),
    (b'["a",null,"2025-01-01T00:00:00Z"', msgspec.DecodeError),
    (b'["",null,"2025-01-01T00:00:00Z","hi"]', msgspec.ValidationError),
    (b'["a",null,"2025-01-01T00:00:00Z",["hi","there"]]', msgspec.ValidationError),
    (b"", msgspec.DecodeError),  # a blank line
]


@pytest.mark.parametrize(("bad", "cause"), _BAD_LINES)
@pytest.mark.parametrize("where", ["first chunk", "later chunk", "last line"])
async def test_s16_a_corrupt_line_anywhere_names_session_file_and_line(
    tmp_path: Path, bad: bytes, cause: type[Exception], where: str,
) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    chain = _chain(1200, "y" * 400)  # about 600 KB: several chunks
    for entry in chain:
        await store.append_entries("s", [entry])
    path = store.path_for("s")
    lines = path.read_bytes().split(b"\n")
    index = {"first chunk": 5, "later chunk": 900, "last line": len(lines) - 2}[where]
    lines[index] = bad
    path.write_bytes(b"\n".join(lines))
    assert sum(map(len, lines[1:index])) > codec._CHUNK or where == "first chunk"

    with pytest.raises(CorruptLog) as info:
        await FileStore(tmp_path).load_entries("s")
    assert (info.value.session_id, info.value.path, info.value.line) == ("s", str(path),
                                                                         index + 1)
    assert str(info.value).startswith(f"{path} line {index + 1}: ")
    assert isinstance(info.value.__cause__, cause)


def test_s35_a_load_gives_the_public_types_with_their_timestamps() -> None:
    ts = datetime(2025, 3, 1, 9, 30, 1, 120250, tzinfo=UTC)
    user = MessageEntry(id="u", timestamp=ts, message=UserMessage.of("hi"))
    reply = MessageEntry(id="r", parent_id="u", timestamp=ts,
                         message=AssistantMessage(content=(TextPart(text="yo"),)))
    body = frame([encode_entry(user)], version=3) + frame([encode_entry(reply)], version=3)
    assert body.startswith(b'["u",null,"2025-03-01T09:30:01.120250Z","hi"]\n')
    got: list[Any] = decode_body(body, 0, len(body))
    assert_same_load(got, [user, reply])
    assert [type(e) for e in got] == [MessageEntry, MessageEntry]
    assert type(got[0].message) is UserMessage and type(got[1].message) is AssistantMessage
    assert got[1].message == AssistantMessage(content=(TextPart(text="yo"),))
    assert got[0].timestamp.tzinfo is UTC


# Texts holding what a batch line's pieces are cut before, so that a cut can
# fall inside a string or a nested value: the bulk path then decodes the rest
# of the line whole, and still gives the line-by-line decode's entries.
_TRAPS = [',["', ',{"type":"message",', '"],["', '\\",["x',
          ',["a",null,"2025-01-01T00:00:00Z","b"]']


@pytest.mark.parametrize("trap", _TRAPS)
def test_s35_a_long_batch_line_is_cut_only_between_its_entries(trap: str) -> None:
    chain = _chain(40, "t" * 50)
    chain[7] = msgspec.structs.replace(chain[7], message=UserMessage.of(trap * 30))
    nested = AssistantMessage(content=(ToolCall(id="c", name="n", arguments={
        "rows": [["a"], ["b"]], "m": [{"a": 1}, {"type": "message", "x": trap}]}),))
    chain[20] = msgspec.structs.replace(chain[20], message=nested)
    old = MessageEntry(id="v2", parent_id=chain[-1].id, message=UserMessage.of(trap))
    body = (frame([encode_entry(e) for e in chain], version=3)
            + frame([encode_entry(e) for e in [old, *_chain(3, trap)]], version=2))
    want = _reference(body)
    for chunk in (1, 5, 64, 300, 997, codec._CHUNK):
        got = codec._decode_chunks(body, 0, len(body), chunk)
        assert_same_load(got, want)
        assert all(got[n].parent_id is got[n - 1].id for n in range(1, len(chain)))


@pytest.mark.parametrize("at", [5, 1500, 2999])
async def test_s14_a_corrupt_entry_in_a_long_batch_line_fails_the_load_naming_the_line(
    tmp_path: Path, at: int,
) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    first = _chain(2, "first")
    await store.append_entries("s", first)
    chain = _chain(3000, "z" * 200)
    await store.append_entries("s", chain)  # line 3: one batch line of about 2.5 chunks
    path = store.path_for("s")
    assert_same_load(await FileStore(tmp_path).load_entries("s"), [*first, *chain])
    data = path.read_bytes()
    good = _codec.compact_line(encode_entry(chain[at]))
    bad = good.replace(b'"' + chain[at].id.encode() + b'"', b'""', 1)  # an empty id
    assert data.count(good) == 1 and len(bad) < len(good)
    path.write_bytes(data.replace(good, bad))
    assert len(data.split(b"\n")[2]) > 2 * codec._CHUNK

    with pytest.raises(CorruptLog) as info:
        await FileStore(tmp_path).load_entries("s")
    assert (info.value.session_id, info.value.path, info.value.line) == ("s", str(path), 3)
    assert isinstance(info.value.__cause__, msgspec.ValidationError)
