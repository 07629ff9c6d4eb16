"""The JSON-lines codec: every byte a store writes or reads passes through here.

One entry encodes to one line of compact JSON with a ``type`` discriminator
(its canonical line). The SQL and memory stores keep each entry's line as it
is; the file store writes the lines of one ``append_entries`` call with
``frame`` (a call of several entries becomes one ``batch`` line, so a crash
cannot leave half of it; from format version 3 on, a message entry becomes
the array ``[id, parent_id, timestamp, body]``, see ``compact_line``), and
reads a file body with ``decode_lines``, which reads every version.

Writing is strict: ``encode_entry`` refuses, with ``InvalidEntry``, anything
that would not load back exactly as it was given (bad ids, lone surrogates,
nesting beyond ``MAX_DEPTH``, values JSON cannot carry such as NaN or bytes),
so no store ever holds a line it cannot read.

Reading is strict about what this version knows and faithful to what it does
not: a known ``type`` with bad fields is ``CorruptLog``; an unknown ``type``
becomes an ``OpaqueEntry``; a line this version would not write byte for byte
(fields it does not know, a timestamp spelled ``.12Z`` or ``+00:00``, another
key order) decodes to its usual class but remembers the line, and encodes
back to exactly those bytes until it is changed (``msgspec.structs.replace``
gives a plain entry again).
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Annotated, Any, TypeAlias

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import CorruptLog, InvalidEntry
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
    registered,
)

__all__ = [
    "KNOWN_TYPES",
    "MAX_DEPTH",
    "check_entry",
    "compact_checked",
    "compact_line",
    "decode_body",
    "decode_entry",
    "decode_init",
    "decode_lines",
    "encode_compact",
    "encode_entry",
    "encode_init",
    "expand_line",
    "export_lines",
    "format_version",
    "frame",
    "rechain_opaque",
    "stored_form",
]

MAX_DEPTH = 100
"""Deepest JSON nesting an entry's line may have, its own object included.

Far below what the decoder's recursion can take, so a stored line always
loads, whatever the caller's stack depth."""

KNOWN_TYPES = frozenset(
    {"message", "compaction", "branch_summary", "custom", "custom_message"}
)
# Line types that are not entries; a line claiming one of them is never opaque.
_FRAMING_TYPES = frozenset({"session_init", "batch"})


class _InitLine(msgspec.Struct, frozen=True, kw_only=True, tag_field="type",
                tag="session_init", gc=False):
    """The first line of a session file: the record plus the format version."""

    version: int = 1
    id: str
    parent_id: str | None = None
    created_at: datetime


class _Version(msgspec.Struct, gc=False):
    version: int = 1


_WireEntry: TypeAlias = (
    MessageEntry | CompactionEntry | BranchSummaryEntry | CustomEntry[msgspec.Raw]
    | CustomMessageEntry
)


_NonEmpty: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]
_Compact: TypeAlias = tuple[_NonEmpty, _NonEmpty | None, datetime, str | tuple[str] | Message]
"""A message entry in format version 3: ``[id, parent_id, timestamp, body]``."""


class _Batch(msgspec.Struct, tag_field="type", tag="batch", gc=False):
    """Several entries appended by one call, as one line (format version 2)."""

    entries: list[_WireEntry | _Compact]


class _RawBatch(msgspec.Struct, tag_field="type", tag="batch", gc=False):
    entries: list[msgspec.Raw]


class _Header(msgspec.Struct, gc=False):
    type: str
    id: str
    parent_id: str | None = None
    timestamp: datetime | None = None


class _Type(msgspec.Struct, gc=False):
    type: str


_entry_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Compact)
_line_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Batch | _Compact)
_message_decoder = msgspec.json.Decoder(MessageEntry)
_raw_batch_decoder = msgspec.json.Decoder(_RawBatch)
_header_decoder = msgspec.json.Decoder(_Header)
_type_decoder = msgspec.json.Decoder(_Type)
_init_decoder = msgspec.json.Decoder(_InitLine)
_version_decoder = msgspec.json.Decoder(_Version)
_encoder = msgspec.json.Encoder()

_ENTRY_CLASSES = (MessageEntry, CompactionEntry, BranchSummaryEntry, CustomEntry,
                  CustomMessageEntry, OpaqueEntry)

# -- entries read from lines this version would write differently -------------

def _verbatim_class(cls: type[Any]) -> type[Any]:
    # A subclass with a __dict__ for the line; entry classes themselves stay
    # slot-only and untracked by the garbage collector, which keeps loading
    # fast. It needs gc=True: msgspec requires it for a __dict__.
    options = {"frozen": True, "gc": True, "dict": True, "tag": cls.__struct_config__.tag}
    sub = types.new_class(cls.__name__, (cls,), options,
                          lambda ns: ns.update(__reduce__=_reduce_verbatim,
                                               __copy__=_copy_verbatim))
    sub.__qualname__ = cls.__qualname__
    sub.__module__ = cls.__module__
    return sub


def _verbatim(entry: Any, line: bytes) -> Entry:
    """``entry``, remembering that it was read from ``line``."""
    copy = _VERBATIM[type(entry)](**msgspec.structs.asdict(entry))
    copy.__dict__["_line"] = line
    return copy  # type: ignore[no-any-return]


def _reduce_verbatim(entry: Any) -> tuple[Any, ...]:
    # The subclass is made at run time, so pickle could not find it by name.
    base = type(entry).__mro__[1]
    return (_unpickle_verbatim, (base, msgspec.structs.asdict(entry), entry.__dict__.get("_line")))


def _copy_verbatim(entry: Any) -> Entry:
    return _unpickle_verbatim(*_reduce_verbatim(entry)[1])


def _unpickle_verbatim(base: type[Any], fields: dict[str, Any], line: bytes | None) -> Entry:
    entry = base(**fields)
    return entry if line is None else _verbatim(entry, line)


_VERBATIM = {cls: _verbatim_class(cls) for cls in _ENTRY_CLASSES if cls is not OpaqueEntry}
_VERBATIM_CLASSES = frozenset(_VERBATIM.values())


def _line(entry: Entry) -> bytes:
    if isinstance(entry, OpaqueEntry):
        return entry.raw
    if type(entry) in _VERBATIM_CLASSES:
        line = entry.__dict__.get("_line")
        if line is not None:
            return line  # type: ignore[no-any-return]
        # A changed copy (msgspec.structs.replace): written as this version writes.
        entry = type(entry).__mro__[1](**msgspec.structs.asdict(entry))
    return _encoder.encode(entry)


# -- writing ------------------------------------------------------------------


def _id_problem(what: str, value: object, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        return f"has {what} {value!r}, not a non-empty string"
    if "\x00" in value:
        return f"has {what} {value!r}, which contains NUL (not every store can hold it)"
    return None


def _header_problem(entry: Any) -> str | None:
    return (_id_problem("entry id", entry.id, optional=False)
            or _id_problem("parent_id", entry.parent_id, optional=True))


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def _depth(line: bytes) -> int:
    """How deeply the JSON in ``line`` nests (a bound, when that is clearly enough)."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return MAX_DEPTH  # cannot be deeper
    depth = deepest = 0
    for byte in _STRING.sub(b"", line).translate(None, _NOT_BRACKET):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_PLAIN_CLASSES = frozenset({MessageEntry, CompactionEntry, BranchSummaryEntry,
                            CustomMessageEntry})


def check_entry(entry: Entry, session_id: str | None = None) -> tuple[bytes, Entry]:
    """The line for ``entry`` and the entry a store gives back for it (``encode_entry``'s check).

    Raises ``InvalidEntry``. The durable agent holds the entry and hands a
    store that can take it (``_append_checked``) the line, so each entry is
    checked once.
    """
    if type(entry) in _PLAIN_CLASSES:
        # The common case, in a few C calls: one encode, one decode back.
        # Decoding back is what proves typed fields hold their types (a
        # struct's constructor checks nothing) and untyped data survived
        # JSON; its result is also what the store gives back.
        ok = (type(entry.id) is str and entry.id and "\x00" not in entry.id
              and (entry.parent_id is None
                   or (type(entry.parent_id) is str and entry.parent_id
                       and "\x00" not in entry.parent_id)))
        if ok:
            try:
                line = _encoder.encode(entry)
                back = (_message_decoder if type(entry) is MessageEntry
                        else _entry_decoder).decode(line)
            except (msgspec.DecodeError, UnicodeEncodeError, RecursionError, TypeError,
                    ValueError, OverflowError):
                pass  # the careful path below says what is wrong
            else:
                if back == entry and (_schema_bounded(back) or _depth(line) <= MAX_DEPTH):
                    return line, back
    return _check_carefully(entry, session_id)


def _schema_bounded(entry: Entry) -> bool:
    """Whether ``entry``, as decoded, nests only a few levels (so its line needs no scan).

    Untyped data (tool call ``arguments``, ``details``) is what could nest
    deeply; when it holds no list or dict it adds at most one level.
    """
    message = entry.message if type(entry) is MessageEntry else None
    if type(message) is UserMessage:
        return True
    if type(message) is ToolResultMessage:
        return type(message.details) not in _NESTING
    if type(message) is not AssistantMessage:
        return False
    # Loops rather than all() over a generator: this runs for every message.
    for part in message.content:
        if type(part) is ToolCall:
            for value in part.arguments.values():
                if type(value) in _NESTING:
                    return False
    return True


_NESTING: frozenset[type[Any]] = frozenset({dict, list})


def _check_carefully(entry: Entry, session_id: str | None) -> tuple[bytes, Entry]:
    def refuse(problem: str) -> InvalidEntry:
        entry_id = getattr(entry, "id", None)
        return InvalidEntry(problem, session_id=session_id,
                            entry_id=entry_id if isinstance(entry_id, str) else None)

    if not isinstance(entry, _ENTRY_CLASSES):
        raise refuse(f"is not an entry: got {type(entry).__name__}")
    if type(entry) in _VERBATIM_CLASSES and "_line" not in entry.__dict__:
        entry = type(entry).__mro__[1](**msgspec.structs.asdict(entry))  # type: ignore[arg-type]
    problem = _header_problem(entry)
    if problem is not None:
        raise refuse(problem)
    try:
        line = _line(entry)
    except UnicodeEncodeError as exc:
        raise refuse("holds text that is not valid Unicode (a lone surrogate such as "
                     f"'\\ud800' at position {exc.start} of a string)") from exc
    except RecursionError as exc:
        raise refuse(f"is nested deeper than {MAX_DEPTH} levels") from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise refuse(f"cannot be encoded as JSON: {exc}") from exc
    if _depth(line) > MAX_DEPTH:
        raise refuse(f"is nested deeper than {MAX_DEPTH} levels")
    if b"\n" in line:
        raise refuse("has a raw line that contains a newline")
    try:
        back = decode_entry(line, session_id=session_id)
    except CorruptLog as exc:
        raise refuse(f"would not load back: {exc.detail}") from exc
    if not _same(back, entry):
        raise refuse(
            "would not load back as given: it holds a value JSON cannot carry exactly "
            "(NaN or infinity, bytes, a tuple, a non-string dict key, a datetime in "
            "untyped data, ...)"
        )
    return line, back


def _same(back: Entry, entry: Entry) -> bool:
    if back == entry:
        return True
    if type(back) is not CustomEntry or not isinstance(entry, CustomEntry):
        return False
    if isinstance(entry.data, msgspec.Raw):
        # Raw JSON is written as it is, and its kind's class (if any) read it.
        return msgspec.structs.replace(back, data=entry.data) == entry
    # An unregistered kind loads as raw JSON: compare what that JSON holds.
    return (isinstance(back.data, msgspec.Raw)
            and msgspec.structs.replace(back, data=msgspec.json.decode(back.data)) == entry)


def encode_entry(entry: Entry, *, session_id: str | None = None) -> bytes:
    """``entry`` as one line of compact JSON, without the newline.

    Raises ``InvalidEntry`` (naming ``session_id`` and the entry) for an
    entry that would not load back exactly as given; stores call this before
    writing anything. An entry decoded from a stored line encodes to that line.
    """
    return check_entry(entry, session_id)[0]


def stored_form(entries: Sequence[Entry], *, session_id: str | None = None) -> list[Entry]:
    """Fresh copies of ``entries``, as a store will give them back (validated)."""
    return [check_entry(entry, session_id)[1] for entry in entries]


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


# -- the compact form of a message entry (format version 3) --------------------
#
# ``[id, parent_id, timestamp, body]``. ``body`` is the text of a user message
# that is one text part, a one-element array holding the text of such an
# assistant message with nothing else set, or the message object as version 2
# writes it. An entry with an ``origin_id`` keeps its version 2 line. The
# timestamp stays a string, which msgspec decodes in C: deriving it from the
# UUIDv7 would save 25 bytes a line but double the cost of a load (see
# docs/benchmarks.md, "Session file format").

def _body(message: Message) -> str | tuple[str] | Message:
    content = message.content
    if len(content) == 1 and type(content[0]) is TextPart:
        if type(message) is UserMessage:
            return content[0].text
        # Compared as bytes: a field equal to its default but not the default
        # object itself (``usage=Usage()``) is written, so it must stay.
        if (type(message) is AssistantMessage
                and _encoder.encode(msgspec.structs.replace(message, content=()))
                == b'{"role":"assistant"}'):
            return (content[0].text,)
    return message


def compact_line(line: bytes) -> bytes:
    """The version 3 line for an ``encode_entry`` line (the line itself if it has none).

    Only a message entry written exactly as this version writes it is
    compacted: a line read from another program keeps its bytes (S15).
    """
    if not line.startswith(b'{"type":"message",'):
        return line
    try:
        entry = _message_decoder.decode(line)
    except msgspec.DecodeError:
        return line
    if entry.origin_id is not None or _encoder.encode(entry) != line:
        return line
    return _compact(entry)


def _compact(entry: MessageEntry) -> bytes:
    return _encoder.encode((entry.id, entry.parent_id, entry.timestamp, _body(entry.message)))


def encode_compact(entry: Entry, *, session_id: str | None = None) -> tuple[bytes, bytes]:
    """``encode_entry(entry)`` and ``compact_line`` of that line, with one encode and decode.

    The entry the check decoded back is what the compact form is made of.
    A plain ``MessageEntry`` there came from a line this version wrote, which
    is what ``compact_line`` re-encodes a line from elsewhere to find out.
    """
    line, back = check_entry(entry, session_id)
    return line, compact_checked(back, line)


def compact_checked(entry: Entry, line: bytes) -> bytes:
    """``compact_line(line)``, where ``entry`` and ``line`` are what ``check_entry`` gave."""
    if type(entry) is MessageEntry and entry.origin_id is None:
        return _compact(entry)
    return line


def expand_line(line: bytes) -> bytes:
    """The ``encode_entry`` line a stored line was made from (inverse of ``compact_line``)."""
    if not line.startswith(b"["):
        return line
    try:
        entry = decode_entry(line)
    except CorruptLog:
        return line
    return _line(entry)


def _expand(wire: tuple[Any, ...]) -> tuple[MessageEntry, bool]:
    """The entry of a compact line, and whether this version writes it so.

    The one spelling a re-encode of the line cannot catch: a message object
    where this version writes the shorthand.
    """
    entry_id, parent_id, timestamp, body = wire
    canonical = True
    if type(body) is str:
        message: Message = UserMessage(content=(TextPart(text=body),))
    elif type(body) is tuple:
        message = AssistantMessage(content=(TextPart(text=body[0]),))
    else:
        message = body
        canonical = _body(body) is body
    entry = MessageEntry(id=entry_id, parent_id=parent_id, timestamp=timestamp, message=message)
    return entry, canonical


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


def decode_entry(
    line: bytes | memoryview | str, *, session_id: str | None = None, path: str | None = None,
    lineno: int | None = None,
) -> Entry:
    """Decode one line. ``path`` and ``lineno`` only shape the error message."""
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)
    where = (session_id, path, lineno)
    try:
        entry = _entry_decoder.decode(data)
    except msgspec.ValidationError as exc:
        opaque = _opaque(data, where)
        if opaque is not None:
            return opaque
        raise _corrupt(f"expected an entry, got {_preview(data)} ({exc})", where) from exc
    except msgspec.DecodeError as exc:
        raise _corrupt(f"not valid JSON: {_preview(data)} ({exc})", where) from exc
    except RecursionError as exc:
        raise _corrupt(f"nested too deeply to decode: {_preview(data)}", where) from exc
    return _settle(entry, data, where)


_Where: TypeAlias = tuple[str | None, str | None, int | None]


def _corrupt(detail: str, where: _Where) -> CorruptLog:
    return CorruptLog(detail, session_id=where[0], path=where[1], line=where[2])


def _settle(entry: Any, line: bytes, where: _Where) -> Entry:
    """Finish a decoded entry: check its header, type its custom data, keep odd bytes."""
    if type(entry) is tuple:
        wire = entry
        entry, canonical = _expand(wire)
        if canonical and _encoder.encode(wire) == line:
            return entry  # type: ignore[no-any-return]
        return _verbatim(entry, line)
    if type(entry) is CustomEntry:
        entry = _custom(entry, where)
    if _encoder.encode(entry) == line:
        return entry  # type: ignore[no-any-return]
    # Not how this version writes it. A header field the line lacks got a
    # default while decoding; that must not pass for a stored value.
    try:
        header = _header_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise _corrupt(f"expected an entry with an id and a timestamp, got {_preview(line)}",
                       where) from exc
    if header.timestamp is None:
        raise _corrupt(f"expected an entry with an id and a timestamp, got {_preview(line)}",
                       where)
    return _verbatim(entry, line)


def _custom(entry: CustomEntry[msgspec.Raw], where: _Where) -> Entry:
    cls = registered(entry.kind)
    if cls is None:
        # A decoded Raw is a view into the input; copy it so one unregistered
        # entry does not keep a whole session file's buffer alive.
        return msgspec.structs.replace(entry, data=entry.data.copy())
    try:
        data = msgspec.json.decode(entry.data, type=cls)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _corrupt(f"custom entry of kind {entry.kind!r} does not decode into "
                       f"{cls.__qualname__}: {exc}", where) from exc
    return msgspec.structs.replace(entry, data=data)


def _opaque(line: bytes, where: _Where) -> OpaqueEntry | None:
    """An entry of a type this version does not know, or None if it is just broken."""
    try:
        header = _header_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    if header.type in KNOWN_TYPES or header.type in _FRAMING_TYPES:
        return None
    if not header.id or header.parent_id == "":
        raise _corrupt(f"expected an entry with an id, got {_preview(line)}", where)
    return OpaqueEntry(type=header.type, id=header.id, parent_id=header.parent_id,
                       timestamp=header.timestamp, raw=line)


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


def rechain_opaque(entry: OpaqueEntry, *, id: str, parent_id: str | None) -> OpaqueEntry:
    """A copy of an opaque entry under a new id and parent (used by fork)."""
    obj = msgspec.json.decode(entry.raw)
    obj["origin_id"] = entry.id
    obj["id"] = id
    obj["parent_id"] = parent_id
    return OpaqueEntry(
        type=entry.type, id=id, parent_id=parent_id, timestamp=entry.timestamp,
        raw=_encoder.encode(obj),
    )


def _preview(line: bytes | memoryview | str, limit: int = 80) -> str:
    text = line if isinstance(line, str) else bytes(line).decode("utf-8", "replace")
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
