"""The session file format: how a file store frames entry lines in a file.

Line 1 of a session file is a ``session_init`` object: the format version
and the session record. Every later line holds what one ``append_entries``
call added: one entry line, or (format version 2 on) a ``batch`` line holding
all the entries of a call of several, so a writer killed mid-write leaves a
torn last line, never part of a call. From version 3 on, a message entry is
written in its compact form. ``decode_lines`` reads a file body of any
version; an export file reads the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import CorruptLog
from threadline.session._codec import (
    _body,
    _Compact,
    _corrupt,
    _custom,
    _encoder,
    _line,
    _preview,
    _Where,
    _WireEntry,
    compact_line,
    decode_entry,
    expand_line,
)
from threadline.session._entries import (
    FORMAT_VERSION,
    CustomEntry,
    Entry,
    MessageEntry,
    SessionRecord,
)

__all__ = [
    "decode_body",
    "decode_init",
    "decode_lines",
    "encode_init",
    "export_lines",
    "format_version",
    "frame",
    "ids_in",
    "stored_entries",
]


class _InitLine(msgspec.Struct, frozen=True, kw_only=True, tag_field="type",
                tag="session_init", gc=False):
    """The first line of a session file: the record plus the format version."""

    version: int = 1
    id: str
    parent_id: str | None = None
    created_at: datetime


class _Version(msgspec.Struct, gc=False):
    version: int = 1



class _Batch(msgspec.Struct, tag_field="type", tag="batch", gc=False):
    """Several entries appended by one call, as one line (format version 2)."""

    entries: list[_WireEntry | _Compact]


class _RawBatch(msgspec.Struct, tag_field="type", tag="batch", gc=False):
    entries: list[msgspec.Raw]



class _Type(msgspec.Struct, gc=False):
    type: str


_type_decoder = msgspec.json.Decoder(_Type)
_line_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Batch | _Compact)
_raw_batch_decoder = msgspec.json.Decoder(_RawBatch)
_init_decoder = msgspec.json.Decoder(_InitLine)
_version_decoder = msgspec.json.Decoder(_Version)


def frame(lines: Sequence[bytes], *, version: int = FORMAT_VERSION,
          compact: Sequence[bytes] | None = None) -> bytes:
    """What one ``append_entries`` call of these lines adds to a session file.

    ``lines`` are what ``encode_entry`` gave. One line is written as it is.
    Several become one ``batch`` line (format version 2 on), so a reader sees
    all of them or, if the writer died, a torn last line; a version 1 file
    gets them one per line. From version 3 on, a message entry is written in
    its compact form (``compact_line``; ``compact``, if given, holds those
    lines already, as ``encode_compact`` made them).
    """
    if version >= 3:
        lines = [compact_line(line) for line in lines] if compact is None else compact
    if len(lines) > 1 and version >= 2:
        return b'{"type":"batch","entries":[' + b",".join(lines) + b"]}\n"
    return b"".join(line + b"\n" for line in lines)



def export_lines(entries: Sequence[Entry]) -> bytes:
    """Entries one per line, as a version 3 file holds them (no checks, no batch lines).

    For export: after ``encode_init``'s line, the result reads as a session file.
    """
    return b"".join([compact_line(_line(entry)) + b"\n" for entry in entries])


def encode_init(record: SessionRecord) -> bytes:
    return _encoder.encode(_InitLine(version=FORMAT_VERSION, id=record.id,
                                     parent_id=record.parent_id, created_at=record.created_at))


# -- reading ------------------------------------------------------------------


def decode_init(
    line: bytes, *, session_id: str | None = None, path: str | None = None, lineno: int = 1
) -> SessionRecord:
    try:
        init = _init_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CorruptLog(
            f"expected a session_init line, got {_preview(line)} ({exc})",
            session_id=session_id, path=path, line=lineno,
        ) from exc
    if init.version > FORMAT_VERSION:
        # A newer writer changed the format in a way this reader cannot follow;
        # refusing here beats failing (or misreading) somewhere mid-log.
        raise CorruptLog(
            f"session format version {init.version} is newer than this threadline "
            f"reads ({FORMAT_VERSION}); upgrade threadline to open it",
            session_id=init.id, path=path, line=lineno,
        )
    return SessionRecord(id=init.id, parent_id=init.parent_id, created_at=init.created_at)


def format_version(init_line: bytes) -> int:
    """The format version a (valid) ``session_init`` line declares."""
    return _version_decoder.decode(init_line).version



def decode_lines(
    data: bytes | memoryview, *, session_id: str | None = None, path: str | None = None,
    first_line: int = 1,
) -> list[Entry]:
    """Every entry in JSON lines (a session file after its first line, an export).

    ``batch`` lines yield their entries. ``first_line`` numbers the first line
    in error messages.
    """
    buf = bytes(data)
    if buf and not buf.endswith(b"\n"):
        buf += b"\n"
    return decode_body(buf, 0, len(buf), session_id=session_id, path=path,
                       first_line=first_line)


def decode_body(
    data: bytes, start: int, end: int, *, session_id: str | None = None,
    path: str | None = None, first_line: int = 1,
) -> list[Entry]:
    """``decode_lines`` of ``data[start:end]``, which ends in a newline, without a copy."""
    try:
        return _decode_chunks(data, start, end, _CHUNK)
    except (msgspec.DecodeError, RecursionError, _Recheck, CorruptLog):
        # Line by line: slower, but it settles every line the bulk decode
        # cannot, and names the line of the first one that is corrupt.
        return _decode_each(data[start:end], (session_id, path, first_line))


_CHUNK = 1 << 18
"""How many bytes of lines a load decodes, builds entries from and checks at a time.

Small enough that the lines, their decoded values and the entries stay in
the CPU's cache between the three steps. Decoding a whole file first, then
building, then checking reads every byte and value back from memory: a load
of 100,000 single-append lines took 1.3 to 1.5 times as long (1 MiB chunks
did as well, 4 MiB no better than the whole file; docs/benchmarks.md,
"Session file format")."""


def _decode_chunks(data: bytes, start: int, end: int, chunk: int) -> list[Entry]:
    """``decode_body``'s common case, ``chunk`` bytes (rounded up to a line) at a time.

    Raises, for ``decode_body`` to decode line by line, as soon as a line is
    anything but exactly what this version writes for what was decoded.
    """
    entries: list[Entry] = []
    pos = start
    while pos < end:
        stop = data.find(b"\n", min(pos + chunk, end) - 1, end) + 1
        begin = data.rfind(b"\n", pos, stop - 1) + 1 or pos  # of the chunk's last line
        last = entries[-1].id if entries else None
        pieces: Iterable[list[Entry]]
        if stop - begin <= chunk:
            pieces = (_lines(data, pos, stop, last),)
        elif begin > pos:  # a long line: the lines before it first, then that line alone
            stop = begin
            pieces = (_lines(data, pos, stop, last),)
        elif (data.startswith(_BATCH_HEAD, pos)
              and data.startswith(_BATCH_TAIL, stop - len(_BATCH_TAIL))
              and stop - len(_BATCH_TAIL) >= pos + len(_BATCH_HEAD)):
            pieces = _batch_pieces(data, pos, stop, chunk, last)
        else:
            pieces = (_lines(data, pos, stop, last),)
        for built in pieces:
            entries += built
        pos = stop
    return entries


def _lines(data: bytes, pos: int, stop: int, last: str | None) -> list[Entry]:
    """The entries of the lines ``data[pos:stop]`` (``last``: the id before them)."""
    items: list[Any] = _line_decoder.decode_lines(memoryview(data)[pos:stop])
    built = _flatten(items, last)
    # Encoding back costs far less than decoding, and it also catches
    # what decode_lines lets by: a blank line, a header field that was
    # missing and got its default, another spelling of the same value.
    if not _written_as_decoded(items, data, pos, stop):
        raise _Recheck
    return built


_BATCH_HEAD = b'{"type":"batch","entries":['
_BATCH_TAIL = b"]}\n"
# Where, in a batch line this version wrote, one entry ends and the next
# begins: before a compact entry, or a message entry kept whole.
_SEPARATORS = (b',["', b',{"type":"message",')
_piece_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[_WireEntry | _Compact])


def _batch_pieces(data: bytes, pos: int, stop: int, chunk: int,
                  last: str | None) -> Iterator[list[Entry]]:
    """The entries of the batch line ``data[pos:stop]``, about ``chunk`` bytes of it at a time.

    A batch line of many entries is megabytes long; decoded whole, its
    values leave the CPU's cache before they are built into entries and
    encoded back, and the load cost 1.3-1.6 times its floor. So each piece
    of its array is decoded, built and checked in turn, as a chunk of lines
    is. A piece ends before a separator; ``[`` + piece + ``]`` is valid JSON
    only if that separator lies between two of the array's elements (inside
    a string or a nested value it leaves something open), so a separator
    found in an entry's text costs one failed decode, never a wrong entry.
    """
    view = memoryview(data)
    p = pos + len(_BATCH_HEAD)
    close = stop - len(_BATCH_TAIL)
    while p < close:
        q = _separator(data, p + chunk, close, chunk)
        piece = b"".join((b"[", view[p:q], b"]"))
        try:
            items: list[Any] = _piece_decoder.decode(piece)
        except (msgspec.DecodeError, RecursionError):
            if q == close:
                raise
            q = close  # a separator inside an entry: the rest of the line as one piece
            piece = b"".join((b"[", view[p:q], b"]"))
            items = _piece_decoder.decode(piece)
        built: list[Entry] = []
        _other(_Batch(items), built, last)
        if _encoder.encode(items) != piece:
            raise _Recheck
        yield built
        if built:
            last = built[-1].id
        p = q + 1


def _separator(data: bytes, at: int, close: int, window: int) -> int:
    """The first separator at or after ``at`` (``close`` if none), a window at a time."""
    while at < close:
        until = min(close, at + window)
        for separator in _SEPARATORS:
            found = data.find(separator, at, until + len(separator) - 1)
            if 0 <= found < close:
                return found
        at = until
    return close


class _Recheck(Exception):
    """A line the bulk decode cannot settle: decode the lines one by one."""


_RECHECKED: _Where = (None, None, None)
"""Where a bulk decode's error lies: unsaid, as the line-by-line decode that follows says it."""


def _flatten(items: list[Any], last: str | None) -> list[Entry]:
    """The entries of decoded lines, custom data typed (``items`` changed to match).

    ``last`` is the id of the entry before them. Compact lines stay in
    ``items`` as read, so that they can be compared with the file; their
    entries share the previous entry's id string as their parent id where
    they can (one string, not two, per entry).
    """
    if items and type(items[0]) is tuple:
        # Most likely a version 3 file of single appends: the tightest loop,
        # without first looking at every item's type (a tenth of the build).
        # A later item that is no compact entry cannot be unpacked into four.
        try:
            return _compact_run(items, last)
        except TypeError:
            pass
    kinds = set(map(type, items))  # one pass in C, instead of a Python loop per line
    if _Batch not in kinds and CustomEntry not in kinds and tuple not in kinds:
        return items
    entries: list[Entry] = []
    for i, item in enumerate(items):
        if type(item) is tuple:
            entries += _compact_run((item,), last)
        elif type(item) is _Batch or type(item) is CustomEntry:
            items[i] = _other(item, entries, last)
        else:
            entries.append(item)
        if entries:
            last = entries[-1].id
    return entries


def _compact_run(items: Sequence[tuple[Any, ...]], last: str | None) -> list[Entry]:
    """The entries of compact lines (``last``: the id before them), built inline.

    A call per entry is a fair part of the cost of a load, and so is every
    name stored and loaded again: the message is built inside the entry's
    call. The parts and messages are built positionally: msgspec matches no
    keyword that way. Raises ``TypeError`` for an item that is not a compact
    entry (``_flatten`` relies on it).
    """
    entries: list[Entry] = []
    append = entries.append
    user, assistant, text, entry = UserMessage, AssistantMessage, TextPart, MessageEntry
    str_, tuple_ = str, tuple
    for entry_id, stored_parent, timestamp, body in items:
        append(entry(id=entry_id, parent_id=last if stored_parent == last else stored_parent,
                     timestamp=timestamp,
                     message=(user((text(body),)) if type(body) is str_
                              else assistant((text(body[0]),)) if type(body) is tuple_
                              else _whole(body))))
        last = entry_id
    return entries


def _whole(message: Message) -> Message:
    """A compact entry's message written whole; ``_Recheck`` if it has a shorthand."""
    # Only a message of one part can have a shorthand.
    if (type(message) is not ToolResultMessage and len(message.content) == 1
            and _body(message) is not message):
        raise _Recheck
    return message


def _other(item: Any, entries: list[Entry], last: str | None) -> Any:
    """A batch line's entries, or a custom entry, added to ``entries``; the item as kept."""
    if type(item) is CustomEntry:
        item = _custom(item, _RECHECKED)
        entries.append(item)
        return item
    batch: list[Any] = item.entries
    if set(map(type, batch)) == {tuple}:
        entries += _compact_run(batch, last)
        return item
    for j, wire in enumerate(batch):
        if type(wire) is tuple:
            entries += _compact_run((wire,), entries[-1].id if entries else last)
            continue
        if type(wire) is CustomEntry:
            batch[j] = _custom(wire, _RECHECKED)
        entries.append(batch[j])
    return item


def _written_as_decoded(items: list[Any], data: bytes, pos: int, end: int) -> bool:
    """Whether ``items`` encode to exactly ``data[pos:end]``.

    In one call: ``_decode_chunks`` hands over at most two chunks of lines
    or one long line, so the copy stays small next to the file.
    """
    encoded = _encoder.encode_lines(items)
    return len(encoded) == end - pos and data.startswith(encoded, pos)


def _decode_each(body: bytes, where: _Where) -> list[Entry]:
    session_id, path, first = where
    entries: list[Entry] = []
    lines = body.split(b"\n")[:-1]
    for n, line in enumerate(lines, start=first or 1):
        entries.extend(_decode_line(line, (session_id, path, n)))
    return entries


def _decode_line(line: bytes, where: _Where) -> list[Entry]:
    if line.startswith(b"["):  # a compact entry (version 3)
        return [decode_entry(line, session_id=where[0], path=where[1], lineno=where[2])]
    try:
        kind = _type_decoder.decode(line).type
    except msgspec.DecodeError as exc:
        raise _corrupt(f"not an entry: {_preview(line)} ({exc})", where) from exc
    except RecursionError as exc:
        raise _corrupt(f"nested too deeply to decode: {_preview(line)}", where) from exc
    if kind != "batch":
        return [decode_entry(line, session_id=where[0], path=where[1], lineno=where[2])]
    try:
        batch = _raw_batch_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _corrupt(f"expected a batch of entries, got {_preview(line)} ({exc})",
                       where) from exc
    return [decode_entry(raw, session_id=where[0], path=where[1], lineno=where[2])
            for raw in batch.entries]


# -- the ids in stored lines (the repeated-id rule) -----------------------------


class _LineIds(msgspec.Struct, gc=False):
    # Only what the id check needs from a stored line. ``entries`` stays raw
    # JSON: it is parsed only for a ``batch`` line, since an entry of a type
    # this version does not know may have a field of that name of any shape.
    type: Any = None
    id: Any = None
    entries: msgspec.Raw = msgspec.Raw(b"null")


class _EntryId(msgspec.Struct, gc=False):
    id: Any = None


# A compact entry (format version 3) is an array that starts with its id.
_CompactId = tuple[Any, msgspec.Raw, msgspec.Raw, msgspec.Raw]
_line_ids_decoder = msgspec.json.Decoder(_LineIds | _CompactId)
_batch_ids_decoder = msgspec.json.Decoder(list[_EntryId | _CompactId])


def ids_in(lines: bytes | memoryview) -> list[str]:
    """The entry ids in complete lines, those inside ``batch`` lines included.

    A line that does not decode holds no id.
    """
    try:
        items = _line_ids_decoder.decode_lines(lines)
    except msgspec.DecodeError:
        items = []
        for line in bytes(lines).split(b"\n"):
            with contextlib.suppress(msgspec.DecodeError):
                items.append(_line_ids_decoder.decode(line))
    found: list[Any] = []
    for item in items:
        if isinstance(item, tuple):
            found.append(item[0])
        elif item.type != "batch":
            found.append(item.id)
        else:
            with contextlib.suppress(msgspec.DecodeError):
                found.extend(e[0] if isinstance(e, tuple) else e.id
                             for e in _batch_ids_decoder.decode(item.entries))
    return [i for i in found if isinstance(i, str)]


def stored_entries(line: bytes) -> list[bytes]:
    """Each entry of a stored line as ``encode_entry`` gave it (none for a damaged line)."""
    try:
        item = _line_ids_decoder.decode(line)
        if isinstance(item, tuple) or item.type != "batch":
            return [expand_line(line)]
        return [expand_line(bytes(raw)) for raw in _raw_batch_decoder.decode(line).entries]
    except msgspec.DecodeError:
        return []
