"""The JSON-lines codec shared by every store.

One entry encodes to one line of compact JSON with a ``type`` discriminator.
The file store writes these lines as they are; the SQL stores keep the same
bytes in a column, so a session copied between stores stays byte-identical.

Decoding is strict about what it knows and lenient about what it does not:
a known ``type`` with bad fields is an error (``CorruptLog``); an unknown
``type`` becomes an ``OpaqueEntry`` and an unregistered custom kind keeps its
raw payload, both written back unchanged. A ``session_init`` line from a newer
format version is refused up front rather than misread line by line.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from threadline.errors import CorruptLog
from threadline.session._entries import (
    _MISSING_TIMESTAMP,
    FORMAT_VERSION,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
    _decoding,
    _registered,
)

__all__ = [
    "KNOWN_TYPES",
    "SessionInit",
    "decode_entry",
    "decode_init",
    "encode_entries",
    "encode_entry",
    "encode_init",
]

KNOWN_TYPES = frozenset(
    {"message", "compaction", "branch_summary", "custom", "custom_message"}
)


class SessionInit(msgspec.Struct, frozen=True, kw_only=True, tag_field="type",
                  tag="session_init", gc=False):
    """The first line of a session file: the record plus the format version."""

    version: int = FORMAT_VERSION
    id: str
    parent_id: str | None = None
    created_at: datetime


_WireEntry = (
    MessageEntry | CompactionEntry | BranchSummaryEntry | CustomEntry[msgspec.Raw]
    | CustomMessageEntry
)
_entry_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry)
_init_decoder = msgspec.json.Decoder(SessionInit)
_encoder = msgspec.json.Encoder()


class _LooseHeader(msgspec.Struct, gc=False):
    type: str
    id: str
    parent_id: str | None = None
    timestamp: datetime | None = None


_loose_decoder = msgspec.json.Decoder(_LooseHeader)


def encode_entry(entry: Entry) -> bytes:
    if isinstance(entry, OpaqueEntry):
        return entry.raw
    return _encoder.encode(entry)


def encode_entries(entries: Iterable[Entry]) -> bytes:
    """Entries as JSON lines, each terminated by a newline."""
    buf = bytearray()
    for entry in entries:
        if isinstance(entry, OpaqueEntry):
            buf += entry.raw
        else:
            _encoder.encode_into(entry, buf, len(buf))
        buf += b"\n"
    return bytes(buf)


def encode_init(record: SessionRecord) -> bytes:
    return _encoder.encode(
        SessionInit(id=record.id, parent_id=record.parent_id, created_at=record.created_at)
    )


def decode_init(
    line: bytes, *, session_id: str | None = None, path: str | None = None, lineno: int = 1
) -> SessionRecord:
    try:
        init = _init_decoder.decode(line)
    except msgspec.DecodeError as exc:
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


def decode_entry(
    line: bytes | memoryview | str, *, session_id: str | None = None, path: str | None = None,
    lineno: int | None = None,
) -> Entry:
    """Decode one line. ``path`` and ``lineno`` only shape the error message."""
    _decoding.active = True
    try:
        entry = _entry_decoder.decode(line)
    except msgspec.ValidationError as exc:
        opaque = _opaque(line)
        if opaque is not None:
            return opaque
        raise CorruptLog(
            f"expected an entry, got {_preview(line)} ({exc})",
            session_id=session_id, path=path, line=lineno,
        ) from exc
    except msgspec.DecodeError as exc:
        raise CorruptLog(
            f"not valid JSON: {_preview(line)} ({exc})",
            session_id=session_id, path=path, line=lineno,
        ) from exc
    finally:
        _decoding.active = False
    if not entry.id or entry.timestamp is _MISSING_TIMESTAMP:
        raise CorruptLog(
            f"expected an entry with an id and a timestamp, got {_preview(line)}",
            session_id=session_id, path=path, line=lineno,
        )
    if type(entry) is CustomEntry:
        cls = _registered(entry.kind)
        if cls is not None:
            try:
                data = msgspec.json.decode(entry.data, type=cls)
            except msgspec.DecodeError as exc:
                raise CorruptLog(
                    f"custom entry of kind {entry.kind!r} does not decode into "
                    f"{cls.__qualname__}: {exc}",
                    session_id=session_id, path=path, line=lineno,
                ) from exc
            entry = msgspec.structs.replace(entry, data=data)
        else:
            # A decoded Raw is a view into the input; copy it so one unregistered
            # entry does not keep a whole session file's buffer alive.
            entry = msgspec.structs.replace(entry, data=entry.data.copy())
    return entry  # type: ignore[no-any-return]


def _opaque(line: bytes | memoryview | str) -> OpaqueEntry | None:
    """An entry of a type this version does not know, or None if it is just broken."""
    try:
        header = _loose_decoder.decode(line)
    except msgspec.DecodeError:
        return None
    if header.type in KNOWN_TYPES or header.type == "session_init":
        return None
    raw = line.encode() if isinstance(line, str) else bytes(line)
    return OpaqueEntry(
        type=header.type, id=header.id, parent_id=header.parent_id,
        timestamp=header.timestamp, raw=raw.strip(),
    )


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
