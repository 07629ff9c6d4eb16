"""The SQL stores' compact row: an entry's line split into typed columns.

A line as the codec writes it starts with a header the row can hold in
columns: ``{"type":T,"id":I[,"parent_id":P],"timestamp":TS`` then the rest.
A row keeps ``kind`` (the type, and optionally a common start and end of the rest),
the ids as keys (16 bytes for a canonical UUID, see ``id_key``), the
timestamp as integer microseconds, and ``data``: only what follows.

A row is stored compact only when ``expand`` of it gives back the line's
exact bytes (checked on every write); any other line, such as one another
program wrote with its own key order or timestamp spelling, is stored whole
as ``kind`` 0. So a row always reads back byte for byte.

A load (``decode_compact``) builds the entry of a compact row straight from
its columns where its data is spelled as the codec spells it; a custom
entry, a verbatim row and any other row are decoded from their line.

``KINDS`` is part of the stored format: append to it, never change an item.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from threadline.ai._messages import AssistantMessage, TextPart, UserMessage
from threadline.errors import CorruptLog
from threadline.session._codec import decode_entry
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
)
from threadline.stores._contract import EntryLog
from threadline.stores._rules import entry_type, from_micros, to_micros

__all__ = ["KINDS", "Row", "compact", "decode_compact", "expand", "id_key", "id_text"]

VERBATIM = 0

# (type, start and end of the rest after the timestamp). Item 0: data is the whole line.
KINDS: tuple[tuple[str, bytes, bytes], ...] = (
    ("", b"", b""),
    ("message", b"", b""),
    ("compaction", b"", b""),
    ("branch_summary", b"", b""),
    ("custom", b"", b""),
    ("custom_message", b"", b""),
    ("message", b',"message":{"role":"user","content":[{"type":"text","text":"', b'"}]}}'),
    ("message", b',"message":{"role":"assistant","content":[{"type":"text","text":"',
     b'"}]}}'),
    ("sealed", b"", b""),
    ("erased", b"", b""),
)

_HEADS = [b'{"type":' + msgspec.json.encode(t) + b',"id":' for t, _, _ in KINDS]
# Per type: (kind, start, end, len(start) + len(end)) for its kinds, longest
# start and end first (the last has neither); and the same per entry class.
_Kinds = list[tuple[int, bytes, bytes, int]]
_BY_TYPE: dict[str, _Kinds] = {}
for _k, (_t, _start, _end) in enumerate(KINDS):
    if _k:
        _BY_TYPE.setdefault(_t, []).append((_k, _start, _end, len(_start) + len(_end)))
for _ks in _BY_TYPE.values():
    _ks.sort(key=lambda k: -k[3])
_BY_CLASS: dict[type[Any], _Kinds] = {
    cls: _BY_TYPE[str(cls.__struct_config__.tag)]
    for cls in (MessageEntry, CompactionEntry, BranchSummaryEntry, CustomEntry, CustomMessageEntry,
                SealedEntry, ErasedEntry)}

_encode = msgspec.json.Encoder().encode
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

Row = tuple[int, bytes, bytes | None, int | None, bytes]
"""``(kind, id key, parent key, timestamp in microseconds, data)``."""


def id_key(entry_id: str) -> bytes:
    """An id as stored: 16 bytes for a canonical (lowercase) UUID, else its text.

    Text is UTF-8 after one NUL (two when that would make 16 bytes), so no
    text key ever has a UUID key's length; ids never hold NUL themselves.
    """
    if len(entry_id) == 36 and _UUID.fullmatch(entry_id):
        return bytes.fromhex(entry_id.replace("-", ""))
    raw = entry_id.encode("utf-8", "surrogatepass")
    return (b"\0\0" if len(raw) == 15 else b"\0") + raw


def id_text(key: bytes) -> str:
    if len(key) == 16:
        h = key.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return key.lstrip(b"\0").decode("utf-8", "surrogatepass")


def _header(kind: int, entry_id: str, parent_id: str | None, stamp: datetime) -> bytes:
    """A line's start, up to and with its kind's start of the rest (``stamp``: in UTC)."""
    parent = b"" if parent_id is None else b',"parent_id":' + _encode(parent_id)
    return (_HEADS[kind] + _encode(entry_id) + parent + b',"timestamp":'
            + _encode(stamp) + KINDS[kind][1])


def compact(entry: Entry, line: bytes) -> Row:
    """The row for ``entry`` whose exact line is ``line``."""
    # Every append runs this: the rest of the line is checked in place rather
    # than sliced first, and the kinds are looked up by class first.
    entry_id, parent_id = entry.id, entry.parent_id
    key = id_key(entry_id)
    parent = None if parent_id is None else id_key(parent_id)
    kinds = _BY_CLASS.get(type(entry))
    if kinds is None and not isinstance(entry, OpaqueEntry):
        kinds = _BY_TYPE.get(entry_type(entry))
    stamp: datetime | None = entry.timestamp
    if kinds and stamp is not None:
        ts = to_micros(stamp)
        # A stamp in UTC is the one from_micros(ts) gives back, and spells the same.
        base = _header(kinds[-1][0], entry_id, parent_id,  # the kind with no start
                       stamp if stamp.tzinfo is UTC else from_micros(ts))
        if line.startswith(base):
            at, size = len(base), len(line)
            for kind, start, end, both in kinds:
                if (size - at >= both and line.startswith(start, at)
                        and line.endswith(end)):
                    return kind, key, parent, ts, line[at + len(start):size - len(end)]
    return VERBATIM, key, parent, None, line


def expand(kind: int, key: bytes, parent: bytes | None, ts: int | None, data: bytes) -> bytes:
    """The exact line a row holds."""
    if kind == VERBATIM:
        return data
    if ts is None or not 0 < kind < len(KINDS):
        raise ValueError(f"kind {kind} with timestamp {ts!r} is not a row this version wrote")
    return (_header(kind, id_text(key), None if parent is None else id_text(parent),
                    from_micros(ts)) + data + KINDS[kind][2])


def decode_compact(rows: Iterable[Sequence[Any]], session_id: str, where: str) -> EntryLog:
    """Entries from ``(seq, kind, id, parent, ts, data)`` rows, in order.

    A row whose ``seq`` is NULL (a session without entries, from a
    ``LEFT JOIN``) ends the log.
    """
    log = EntryLog()
    append = log.append
    # A row's parent is mostly the row before it: its id's text is made once.
    texts: dict[bytes, str] = {}
    for row in rows:
        seq, kind, key, parent, ts, data = row
        if seq is None:
            break
        message = _TEXT_MESSAGES.get(kind)
        rest = None if message is not None else _RESTS.get(kind)
        if message is not None or rest is not None:
            # The entry straight from the row's columns, with no line rebuilt
            # and decoded (that cost ~3 us a row). It is what decoding the
            # line gives exactly when the row's data is spelled as the codec
            # spells it, which the checks below prove; any other row takes the
            # long way, which also says what is wrong with it.
            try:
                key, data = bytes(key), bytes(data)  # a driver may give buffers
                entry_id = texts.get(key) or texts.setdefault(key, _plain_id(key))
                if parent is None:
                    parent_id = None
                else:
                    parent = bytes(parent)
                    parent_id = texts.get(parent) or _plain_id(parent)
                if message is not None:
                    quoted = b'"' + data + b'"'
                    text = _decode_text(quoted)
                    # Without a backslash there is one spelling of the text;
                    # with one, the escapes must be the codec's own.
                    if b"\\" not in data or _encode(text) == quoted:
                        append(MessageEntry(id=entry_id, parent_id=parent_id,
                                            timestamp=from_micros(ts),
                                            message=message(content=(TextPart(text=text),))))
                        continue
                elif rest is not None and data[:1] == b",":
                    cls, decode = rest
                    obj = b"{" + data[1:]
                    fields = decode(obj)
                    if _encode(fields) == obj:
                        if cls is MessageEntry:  # the common one, without a dict
                            append(MessageEntry(id=entry_id, parent_id=parent_id,
                                                timestamp=from_micros(ts),
                                                origin_id=fields.origin_id,
                                                message=fields.message))
                        else:
                            append(cls(id=entry_id, parent_id=parent_id,
                                       timestamp=from_micros(ts),
                                       **msgspec.structs.asdict(fields)))
                        continue
            except (msgspec.DecodeError, TypeError, ValueError, OverflowError, RecursionError):
                pass
        append(_decode_row(row, texts, session_id, where))
    return log


# The kinds whose data is the JSON-escaped text of a message's one text part.
_TEXT_MESSAGES: dict[int, type[UserMessage] | type[AssistantMessage]] = {
    6: UserMessage, 7: AssistantMessage}
_decode_text = msgspec.json.Decoder(str).decode


def _rest(cls: type[Any]) -> tuple[type[Any], Callable[[bytes], Any]]:
    """``cls`` and a decoder of its fields after the header, as one object.

    The fields keep their order, types and defaults, so the object encodes
    as the rest of ``cls``'s line does (after its first comma).
    """
    fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default)
              for f in msgspec.structs.fields(cls) if f.name not in _HEADER_FIELDS]
    rest = msgspec.defstruct(f"{cls.__name__}Rest", fields, kw_only=True, omit_defaults=True,
                             gc=False)
    return cls, msgspec.json.Decoder(rest).decode


_HEADER_FIELDS = frozenset({"id", "parent_id", "timestamp"})
# The kinds whose data is the rest of an entry's object. Custom entries (4)
# are not here: their data is typed by a registry that can change, so they
# take the line's way.
_RESTS = {1: _rest(MessageEntry), 2: _rest(CompactionEntry), 3: _rest(BranchSummaryEntry),
          5: _rest(CustomMessageEntry)}


def _plain_id(key: bytes) -> str:
    """``id_text``, or ValueError for a key whose line would not load (empty, a surrogate)."""
    if len(key) == 16:
        return id_text(key)
    text = key.lstrip(b"\0").decode("utf-8")
    if not text:
        raise ValueError("empty id")
    return text


def _decode_row(row: Sequence[Any], texts: dict[bytes, str], session_id: str,
                where: str) -> Entry:
    """The entry of one row by its line (``expand``), or ``CorruptLog`` naming the row."""
    seq, kind, key, parent, ts, data = row
    try:
        if kind == VERBATIM:
            line = bytes(data)
        else:
            if ts is None or not 0 < kind < len(KINDS):
                raise ValueError(f"kind {kind} with timestamp {ts!r} is not a row this "
                                 f"version wrote")
            key = bytes(key)
            text = texts.get(key) or texts.setdefault(key, id_text(key))
            if parent is None:
                parent_text = None
            else:
                parent = bytes(parent)
                parent_text = texts.get(parent) or id_text(parent)
            line = (_header(kind, text, parent_text, from_micros(ts)) + bytes(data)
                    + KINDS[kind][2])
    except (TypeError, ValueError, OverflowError) as exc:
        raise CorruptLog(f"not a stored entry: {exc}", session_id=session_id,
                         path=_row_where(where, session_id, seq)) from exc
    try:
        return decode_entry(line, session_id=session_id)
    except CorruptLog:  # decoded again only to name the row
        return decode_entry(line, session_id=session_id,
                            path=_row_where(where, session_id, seq))


def row_line(row: Sequence[Any], session_id: str, where: str) -> bytes:
    """``expand`` of a ``(seq, kind, id, parent, ts, data)`` row read back, or
    ``CorruptLog`` naming the row."""
    seq, kind, key, parent, ts, data = row
    try:
        return expand(kind, bytes(key), None if parent is None else bytes(parent), ts,
                      bytes(data))
    except (TypeError, ValueError, OverflowError) as exc:
        raise CorruptLog(f"not a stored entry: {exc}", session_id=session_id,
                         path=_row_where(where, session_id, seq)) from exc


def _row_where(where: str, session_id: str, seq: int) -> str:
    return f"{where} table entries row (session_id={session_id!r}, seq={seq})"
