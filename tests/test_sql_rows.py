"""The SQL stores' compact rows (S37): every entry reads back byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.session import CustomEntry, MessageEntry, new_id
from threadline.session._codec import decode_entry, encode_entry
from threadline.session._rows import KINDS, compact, expand, id_key, id_text

ODD_IDS = ["e1", "x" * 15, "y" * 16, "z" * 14, "01A23141-0157-7019-BE70-6DDC5098B7BD",
           "01a23141-0157-7019-be70-6ddc5098b7b", "été-💬", 'quote"and\\slash', "\t\x01ctl",
           "01a23141015770 19be706ddc5098b7bd"]


@pytest.mark.parametrize("entry_id", [new_id(), *ODD_IDS])
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
