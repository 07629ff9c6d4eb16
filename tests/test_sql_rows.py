"""The SQL stores' compact rows (S37): every entry reads back byte for byte."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.errors import CorruptLog
from threadline.session import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    SessionRecord,
    new_id,
)
from threadline.session._codec import _line, decode_entry, encode_entry, stored_form
from threadline.stores import PostgresStore, SQLiteStore, _rows
from threadline.stores._rows import (
    KINDS,
    compact,
    decode_compact,
    expand,
    id_key,
    id_text,
    row_line,
)

ODD_IDS = ["e1", "x" * 15, "y" * 16, "z" * 14, "01A23141-0157-7019-BE70-6DDC5098B7BD",
           "01a23141-0157-7019-be70-6ddc5098b7b", "été-💬", 'quote"and\\slash', "\t\x01ctl",
           "01a23141015770 19be706ddc5098b7bd"]


@pytest.mark.parametrize("entry_id", [new_id(), *ODD_IDS], ids=["uuid7", *map(repr, ODD_IDS)])
def test_s37_every_id_round_trips_and_no_two_share_a_key(entry_id: str) -> None:
    assert id_text(id_key(entry_id)) == entry_id
    keys = {id_key(i) for i in [new_id(), *ODD_IDS]}
    assert len(keys) == len(ODD_IDS) + 1
    # Only a canonical UUID takes the 16-byte form.
    assert (len(id_key(entry_id)) == 16) == (entry_id not in ODD_IDS)


def _entries() -> list[MessageEntry | CustomEntry[object]]:
    root = MessageEntry(message=UserMessage.of("hello"))
    odd = MessageEntry(id="e1", parent_id=root.id, message=UserMessage.of("odd id"),
                       timestamp=datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC))  # not the id's time
    zero = MessageEntry(id="x" * 15, parent_id="e1", message=AssistantMessage(
        content=(TextPart(text="whole second"),)),
        timestamp=datetime(2030, 1, 1, tzinfo=UTC))
    offset = MessageEntry(parent_id=zero.id, message=UserMessage.of("+02:00"),
                          timestamp=datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))))
    naive = MessageEntry(parent_id=offset.id, message=UserMessage.of("naive"),
                         timestamp=datetime(2030, 1, 1, 12))
    tools = MessageEntry(parent_id=naive.id, message=AssistantMessage(
        content=(ToolCall(id="c", name="f", arguments={"a": 1}),)))
    custom: CustomEntry[object] = CustomEntry(parent_id=tools.id, kind="k", data={"x": [1]})
    tricky = MessageEntry(parent_id=custom.id, message=UserMessage.of('"}]}}'))  # ends like one
    return [root, odd, zero, offset, naive, tools, custom, tricky]


def test_s37_rows_rebuild_each_line_exactly_and_compact_the_usual_ones() -> None:
    for entry in _entries():
        line = encode_entry(entry)
        row = compact(entry, line)
        assert expand(*row) == line
        assert decode_entry(expand(*row)) == decode_entry(line)
    kinds = [compact(e, encode_entry(e))[0] for e in _entries()]
    # A time in UTC is held as microseconds; one with an offset, or naive, keeps its line.
    assert [bool(k) for k in kinds] == [True, True, True, False, False, True, True, True]
    text = MessageEntry(message=UserMessage.of("q" * 400))
    kind, _, _, _, data = compact(text, encode_entry(text))
    assert KINDS[kind][1] and data == b"q" * 400  # the common start and end are the kind's


def test_s37_a_line_that_would_not_rebuild_is_kept_whole() -> None:
    entry_id = new_id()
    lines = [  # another timestamp spelling, another key order, an unknown type
        b'{"type":"message","id":"%s","timestamp":"2025-03-01T09:30:01.12Z","message":'
        b'{"role":"user","content":[{"type":"text","text":"hi"}]}}' % entry_id.encode(),
        b'{"id":"%s","type":"message","timestamp":"2025-03-01T09:30:01Z","message":'
        b'{"role":"user","content":[{"type":"text","text":"hi"}]}}' % entry_id.encode(),
        b'{"type":"from.the.future","id":"%s","x":1}' % entry_id.encode(),
    ]
    for line in lines:
        row = compact(decode_entry(line), line)
        assert row[0] == 0 and row[4] == line and expand(*row) == line


# -- a load decodes typed rows straight into entries -----------------------------
#
# The reference is what a load did before: rebuild each row's line (``expand``)
# and decode that line. A direct decode must give the very same entry (same
# class, ids, timestamp and its tzinfo), and where the line would not load,
# CorruptLog naming the row.

WHERE = "/db/x.db"
_UTC_TIMES = st.datetimes(timezones=st.just(UTC))
_TIMES = st.one_of(_UTC_TIMES, _UTC_TIMES, st.datetimes(),  # naive and offset: kept whole
                   st.datetimes(timezones=st.just(timezone(timedelta(hours=-3)))))
_IDS = st.one_of(st.builds(new_id), st.sampled_from(ODD_IDS),
                 st.text(min_size=1).filter(lambda t: "\x00" not in t))
_TEXTS = st.one_of(st.text(), st.sampled_from(
    ['"}]}}', "\\", 'a"b', "line\nbreak\ttab", "\x00\x01\x1f\x7f", "\u2028\u2029", "💬 été",
     "</script>", "\\u00e9", ""]))


def _message(kind: int, text: str) -> UserMessage | AssistantMessage:
    if kind == 0:
        return UserMessage.of(text)
    if kind == 1:
        return AssistantMessage(content=(TextPart(text=text),))
    if kind == 2:
        return AssistantMessage(content=(TextPart(text=text), ToolCall(
            id="c", name="f", arguments={"q": text})), model="m")
    return UserMessage(content=(TextPart(text=text), TextPart(text="second")))


def _draw_entry(draw: st.DrawFn, header: dict[str, Any], shapes: st.SearchStrategy[int]
                ) -> Entry:
    text = draw(_TEXTS)
    shape = draw(shapes)
    if shape < 4:
        return MessageEntry(message=_message(shape, text), **header)
    if shape == 4:
        return CompactionEntry(summary=text, first_kept_entry_id="e1", tokens_before=3,
                               **header)
    if shape == 5:
        return BranchSummaryEntry(from_id="e1", summary=text, **header)
    if shape == 6:
        return CustomEntry(kind="k", data={"t": text}, **header)
    if shape == 7:
        return CustomMessageEntry(kind="k", content=(TextPart(text=text),), **header)
    return MessageEntry(message=UserMessage.of(text), origin_id="o", **header)


@st.composite
def _logs(draw: st.DrawFn) -> list[Entry]:
    entries: list[Entry] = []
    for _ in range(draw(st.integers(1, 6))):
        entry_id = draw(_IDS)
        if entry_id in {e.id for e in entries}:
            continue
        parent = draw(st.one_of(st.none(), st.just(entries[-1].id if entries else None),
                                st.sampled_from(ODD_IDS)))
        header = {"id": entry_id, "parent_id": parent, "timestamp": draw(_TIMES)}
        entries.append(_draw_entry(draw, header, st.integers(0, 8)))
    return entries


@st.composite
def _other_kinds(draw: st.DrawFn) -> Entry:
    """An entry whose row is of kind 1-5 (all but single-text messages)."""
    header = {"id": draw(_IDS), "timestamp": draw(_UTC_TIMES)}
    return _draw_entry(draw, header, st.sampled_from([2, 3, 4, 5, 6, 7, 8]))


def _by_line(rows: list[tuple[Any, ...]], sid: str = "s") -> list[Entry]:
    return [decode_entry(row_line(r, sid, WHERE), session_id=sid) for r in rows]


def _views(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(seq, kind, memoryview(key), None if parent is None else memoryview(parent), ts,
             memoryview(data)) for seq, kind, key, parent, ts, data in rows]


def _assert_same(got: list[Entry], want: list[Entry]) -> None:
    assert got == want
    for a, b in zip(got, want, strict=True):
        assert type(a) is type(b)
        assert (a.id, a.parent_id, a.timestamp) == (b.id, b.parent_id, b.timestamp)
        assert a.timestamp is not None and b.timestamp is not None
        assert a.timestamp.tzinfo == b.timestamp.tzinfo
        assert _line(a) == _line(b)  # what a store would write back


@settings(max_examples=400, deadline=None)
@given(_logs())
def test_s37_a_load_gives_exactly_what_decoding_each_rows_line_gives(entries: list[Entry]) -> None:
    rows = [(seq, *compact(e, encode_entry(e)))
            for seq, e in enumerate(entries, start=1)]
    _assert_same(list(decode_compact(rows, "s", WHERE)), _by_line(rows))
    _assert_same(list(decode_compact(rows, "s", WHERE)), stored_form(entries))


_KEYS = st.one_of(st.builds(lambda: id_key(new_id())), st.sampled_from(
    [b"", b"\0", b"\0\0", b"\0\xff", b"\0\xed\xa0\x80", b"\0a\0b", b"\0" + b"x" * 15]),
    st.binary(max_size=20))
_DATA = st.one_of(
    st.builds(lambda t: msgspec.json.encode(t)[1:-1], _TEXTS),  # as the codec writes it
    st.builds(lambda t: json.dumps(t)[1:-1].encode(), _TEXTS),  # as another program might
    st.sampled_from([b"", b'"', b"\\", b'a","x":"1', b"\\ud800", b"\\ud83d\\udcac", b"\\/",
                     b"\x01", b"\xff", b"\\u0000", b'"}]}},{"a":"']),
    st.binary(max_size=12))


@settings(max_examples=600, deadline=None)
@given(kind=st.sampled_from([6, 7]), key=_KEYS, parent=st.one_of(st.none(), _KEYS),
       ts=st.one_of(st.integers(-(2**62), 2**62), st.integers(-10**17, 10**17), st.none()),
       data=_DATA)
def test_s37_any_single_text_row_loads_as_its_line_would_or_is_corrupt(
    kind: int, key: bytes, parent: bytes | None, ts: int | None, data: bytes
) -> None:
    """Rows that no writer of this version makes, too: each gives what its
    line gives (a verbatim entry for a foreign spelling), or CorruptLog."""
    rows = [(7, kind, key, parent, ts, data)]
    try:
        want = _by_line(rows)
    except CorruptLog:
        for given_rows in (rows, _views(rows)):
            with pytest.raises(CorruptLog) as info:
                decode_compact(given_rows, "s", WHERE)
            assert "table entries row (session_id='s', seq=7)" in str(info.value)
        return
    _assert_same(list(decode_compact(rows, "s", WHERE)), want)
    _assert_same(list(decode_compact(_views(rows), "s", WHERE)), want)


def _respell(rest: bytes, how: int) -> bytes:
    """The rest of a line (kinds 1-5) as the codec writes it, or spelled otherwise."""
    obj = b"{" + rest[1:]
    if how == 1:  # another program's spelling: ASCII escapes, spaces
        return b"," + json.dumps(json.loads(obj), separators=(", ", ": ")).encode()[1:]
    if how == 2:
        return b"," + json.dumps(json.loads(obj)).encode()[1:]
    if how == 3:  # a field this version does not know
        return rest[:-1] + b',"zz":1}'
    if how == 4:  # a header field again
        return b',"id":"other"' + rest
    if how == 5:
        return rest[1:]  # no comma: no line
    if how == 6:
        return rest[:-1]  # cut short
    if how == 7:
        return rest + b',"x":1}'  # after the object
    if how == 8:
        return b" " + rest[1:]  # no comma, but an object if the first byte were taken for one
    return rest


@settings(max_examples=500, deadline=None)
@given(entry=_other_kinds(), how=st.integers(0, 9), key=_KEYS, parent=st.one_of(st.none(), _KEYS),
       ts=st.one_of(st.integers(-(2**62), 2**62), st.integers(-10**17, 10**17), st.none()))
def test_s37_any_row_of_the_other_kinds_loads_as_its_line_would_or_is_corrupt(
    entry: Entry, how: int, key: bytes, parent: bytes | None, ts: int | None
) -> None:
    kind, *_, data = compact(entry, encode_entry(entry))
    assume(0 < kind < 6)  # a user message of texts only may still be a kind 6 row
    rows = [(3, kind, key, parent, ts, _respell(data, how))]
    try:
        want = _by_line(rows)
    except CorruptLog:
        for given_rows in (rows, _views(rows)):
            with pytest.raises(CorruptLog) as info:
                decode_compact(given_rows, "s", WHERE)
            assert "table entries row (session_id='s', seq=3)" in str(info.value)
        return
    _assert_same(list(decode_compact(rows, "s", WHERE)), want)
    _assert_same(list(decode_compact(_views(rows), "s", WHERE)), want)


def test_s37_the_usual_rows_load_without_their_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes the load fast: no line is rebuilt for the common kinds."""
    entries = [e for e in _entries_of_every_kind() if not isinstance(e, CustomEntry)]
    rows = [(seq, *compact(e, encode_entry(e))) for seq, e in enumerate(entries, start=1)]
    usual = [r for r in rows if r[1] in (1, 2, 3, 5, 6, 7)]
    assert {r[1] for r in usual} == {1, 2, 3, 5, 6, 7}
    want = _by_line(usual)

    def no_line(*args: object) -> Entry:
        raise AssertionError("decoded by its line")

    monkeypatch.setattr(_rows, "_decode_row", no_line)
    _assert_same(list(decode_compact(usual, "s", WHERE)), want)


_GOOD = MessageEntry(id="e0", message=UserMessage.of("fine"),
                     timestamp=datetime(2030, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(("kind", "change"), [
    (0, {"data": b'{"not'}),
    *((k, {"data": b"!garbage"}) for k in range(1, 6)),
    *((k, {"data": b',"message":1,"summary":2,"from_id":3,"kind":4}'}) for k in range(1, 6)),
    *((k, {"data": b'x"y'}) for k in (6, 7)),
    *((k, {"data": b"\\ud800"}) for k in (6, 7)),
    *((k, {"key": b"\0"}) for k in range(1, 8)),
    *((k, {"key": b"\0\xed\xa0\x80"}) for k in (6, 7)),
    *((k, {"parent": b""}) for k in (6, 7)),
    *((k, {"ts": None}) for k in range(1, 8)),
    *((k, {"ts": 10**18}) for k in (1, 6, 7)),
    (8, {}), (-1, {}),
])
def test_s37_a_corrupt_row_of_each_kind_names_the_session_and_row(
    kind: int, change: dict[str, Any]
) -> None:
    fields = {"kind": kind, "key": b"\0e1", "parent": b"\0e0", "ts": 1_900_000_000_000_000,
              "data": b"text"}
    fields.update(change)
    good = (1, *compact(_GOOD, encode_entry(_GOOD)))
    rows = [good, (2, fields["kind"], fields["key"], fields["parent"], fields["ts"],
                   fields["data"])]
    with pytest.raises(CorruptLog) as info:
        decode_compact(rows, "s", WHERE)
    assert info.value.session_id == "s"
    assert info.value.path == f"{WHERE} table entries row (session_id='s', seq=2)"
    assert info.value.__cause__ is not None


def test_s37_rows_read_as_memoryviews_load_the_same() -> None:
    """A driver may hand back a buffer rather than bytes for a binary column."""
    entries = _entries_of_every_kind()
    rows = [(seq, *compact(e, encode_entry(e))) for seq, e in enumerate(entries, start=1)]
    _assert_same(list(decode_compact(_views(rows), "s", WHERE)), _by_line(rows))


def _entries_of_every_kind() -> list[Entry]:
    entries = [*_entries(), MessageEntry(message=UserMessage.of("tab\there \\ \"q\" 💬")),
               CompactionEntry(summary="s", first_kept_entry_id="e1"),
               BranchSummaryEntry(from_id="e1", summary="b"),
               CustomMessageEntry(kind="k", content=(TextPart(text="c"),))]
    return [msgspec.structs.replace(e, parent_id=None if i % 5 == 0 else entries[i - 1].id)
            for i, e in enumerate(entries)]


async def test_s37_sqlite_loads_rows_as_their_lines(tmp_path: Path) -> None:
    entries = _entries_of_every_kind()
    store = SQLiteStore(tmp_path / "r.db")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", entries)
    loaded = await store.load_entries("s")
    await store.close()
    with sqlite3.connect(tmp_path / "r.db") as conn:
        rows = conn.execute("SELECT seq, kind, id, parent, ts, data FROM entries "
                            "ORDER BY seq").fetchall()
    assert {r[1] for r in rows} >= set(range(8))  # every kind is there
    _assert_same(list(loaded), _by_line(rows))
    _assert_same(list(loaded), stored_form(entries))


async def test_s37_postgres_loads_rows_as_their_lines(pg_url: str, pg_schema: str) -> None:
    import psycopg

    entries = _entries_of_every_kind()
    async with PostgresStore(pg_url, schema=pg_schema) as store:
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", entries)
        loaded = await store.load_entries("s")
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT seq, kind, entry_id, parent_id, ts, data FROM "
                            f"{pg_schema}.entries ORDER BY seq", binary=True).fetchall()
    assert {r[1] for r in rows} >= set(range(8))
    _assert_same(list(loaded), _by_line(rows))
    _assert_same(list(loaded), stored_form(entries))
