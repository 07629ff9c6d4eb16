"""The entry codec: one entry to one line of JSON and back, checked both ways.

An entry encodes to one line of compact JSON with a ``type`` discriminator
(its canonical line); a message entry may also be spelled as the compact
array ``[id, parent_id, timestamp, body]`` (``compact_line``), which the file
store writes and ``decode_entry`` reads. How lines are framed in a session
file lives with the file store (``threadline.stores.file``).

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
from collections.abc import Sequence
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
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
    registered,
)

__all__ = [
    "KNOWN_TYPES",
    "MAX_DEPTH",
    "MAX_ENTRY_ID_BYTES",
    "check_entry",
    "compact_checked",
    "compact_line",
    "decode_compact_body",
    "decode_entry",
    "encode_compact",
    "encode_entry",
    "expand_line",
    "rechain_opaque",
    "stored_form",
]

MAX_DEPTH = 100
"""Deepest JSON nesting an entry's line may have, its own object included.

Far below what the decoder's recursion can take, so a stored line always
loads, whatever the caller's stack depth."""

KNOWN_TYPES = frozenset(
    {"message", "compaction", "branch_summary", "custom", "custom_message", "sealed", "erased"}
)
# Line types that are not entries; a line claiming one of them is never opaque.
_FRAMING_TYPES = frozenset({"session_init", "batch"})


_WireEntry: TypeAlias = (
    MessageEntry | CompactionEntry | BranchSummaryEntry | CustomEntry[msgspec.Raw]
    | CustomMessageEntry | SealedEntry | ErasedEntry
)


_NonEmpty: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]
_Compact: TypeAlias = tuple[_NonEmpty, _NonEmpty | None, datetime, str | tuple[str] | Message]
"""A message entry in format version 3: ``[id, parent_id, timestamp, body]``."""


class _Header(msgspec.Struct, gc=False):
    type: str
    id: str
    parent_id: str | None = None
    timestamp: datetime | None = None


_entry_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Compact)
_message_decoder = msgspec.json.Decoder(MessageEntry)
_header_decoder = msgspec.json.Decoder(_Header)
_encoder = msgspec.json.Encoder()

_ENTRY_CLASSES = (MessageEntry, CompactionEntry, BranchSummaryEntry, CustomEntry,
                  CustomMessageEntry, SealedEntry, ErasedEntry, OpaqueEntry)

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


MAX_ENTRY_ID_BYTES = 1024
"""Longest entry id (and parent id), in UTF-8 bytes, on every store.

PostgreSQL cannot index much more than 2,700 bytes per key; one limit for
every store keeps a session copyable between any two.
"""
# Ids this short in characters cannot be longer in bytes: the fast path's test.
_SHORT_ID = MAX_ENTRY_ID_BYTES // 4


def _id_problem(what: str, value: object, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        return f"has {what} {value!r}, not a non-empty string"
    if "\x00" in value:
        return f"has {what} {value!r}, which contains NUL (not every store can hold it)"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ENTRY_ID_BYTES:
        return (f"has {what} {value[:40]!r}... of {size} bytes in UTF-8; the limit is "
                f"{MAX_ENTRY_ID_BYTES}")
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
                            CustomMessageEntry, SealedEntry, ErasedEntry})


def check_entry(entry: Entry, session_id: str | None = None) -> tuple[bytes, Entry]:
    """The line for ``entry`` and the entry a store gives back for it (``encode_entry``'s check).

    Raises ``InvalidEntry``. The durable agent holds the entry it gives back
    as its copy of what it stored.
    """
    if type(entry) in _PLAIN_CLASSES:
        # The common case, in a few C calls: one encode, one decode back.
        # Decoding back is what proves typed fields hold their types (a
        # struct's constructor checks nothing) and untyped data survived
        # JSON; its result is also what the store gives back.
        ok = (type(entry.id) is str and 0 < len(entry.id) <= _SHORT_ID
              and "\x00" not in entry.id
              and (entry.parent_id is None
                   or (type(entry.parent_id) is str and 0 < len(entry.parent_id) <= _SHORT_ID
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
    compacted: a line read from another program keeps its bytes.
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


_body_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(str | tuple[str] | Message)


def decode_compact_body(
    body: bytes, *, id: str, parent_id: str | None, timestamp: datetime,
    session_id: str | None = None,
) -> MessageEntry:
    """The message entry of a compact line this version wrote, from its ``body`` alone.

    For a reader that keeps the header elsewhere (a sealed entry keeps it in
    plain text): ``body`` is what follows ``[id, parent_id, timestamp,`` in
    the line, without the closing bracket. Raises ``CorruptLog``.
    """
    try:
        wire = _body_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _corrupt(f"expected the body of a message entry, got {_preview(body)} ({exc})",
                       (session_id, None, None)) from exc
    return _expand((id, parent_id, timestamp, wire))[0]


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
