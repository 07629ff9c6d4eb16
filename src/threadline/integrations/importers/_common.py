"""What every importer shares: the result type, source-derived ids, line reading.

Re-importing is safe because nothing an importer writes depends on when or
where it runs: session ids are the source's own, entry ids are name-based
UUIDs of (format, session, source id), timestamps come from the source. The
same file therefore yields the same bytes, and ``copy_sessions`` skips it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

from threadline.errors import CorruptLog
from threadline.session._entries import CustomEntry, Entry, SessionRecord

__all__ = ["Collector", "Imported", "Lines", "detect", "entry_id", "parse_time"]

_NAMESPACE = uuid.UUID("5b0f3c1e-7d2a-4c55-9e61-0a8f2d4b7c39")


class Imported(NamedTuple):
    """One session read from a file, ready to be appended in one batch."""

    record: SessionRecord
    entries: list[Entry]
    kept_raw: int = 0
    """How many of ``entries`` are raw ``CustomEntry`` copies of source data
    threadline has no type for (the rest are mapped)."""
    extra_fields: dict[str, int] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    """Source fields with no place in a mapped entry, by name, with counts;
    their values are in the ``<format>.extra`` entry after that entry."""
    notes: tuple[str, ...] = ()
    """Things the reader should know, such as a torn last line left out."""
    blobs: dict[str, bytes] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    """Blob bytes by SHA-256 that came with the sessions (a bundle, or an export
    with its blobs inline), to be stored before the entries that reference them."""


def entry_id(fmt: str, session_id: str, source_id: str) -> str:
    """The threadline entry id for a source record: stable across imports."""
    return _name_id(f"{fmt}\x00{session_id}\x00{source_id}")


def _name_id(name: str) -> str:
    # uuid.uuid5's value, without building UUID objects (a third of an import's time).
    h = bytearray(hashlib.sha1(_NAMESPACE.bytes + name.encode(), usedforsecurity=False)
                  .digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50
    h[8] = (h[8] & 0x3F) | 0x80
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def parse_time(value: object, *, where: str, line: int | None) -> datetime:
    """An ISO 8601 string, or Unix milliseconds, as an aware UTC datetime."""
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000, UTC)
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise CorruptLog(f"bad timestamp {value!r}", path=where, line=line) from exc
    raise CorruptLog(f"expected a timestamp, got {value!r}", path=where, line=line)


class Collector:
    """Counts what an importer maps and keeps whatever it cannot map.

    A source record with no threadline type becomes a raw entry (its bytes);
    fields of a mapped record that have no place are gathered with ``drop``
    and become one ``<format>.extra`` entry right after the mapped entry, so
    the data stays in the log, out of the model's context.
    """

    def __init__(self, fmt: str, name: str) -> None:
        self.fmt, self.name = fmt, name
        self.notes: list[str] = []
        self.fields: Counter[str] = Counter()
        self.raw = 0
        self._extra: dict[str, Any] = {}

    def fail(self, line: int | None, detail: str) -> CorruptLog:
        return CorruptLog(detail, path=self.name, line=line)

    def drop(self, obj: dict[str, Any], mapped: set[str], prefix: str) -> None:
        """Keep the keys of ``obj`` outside ``mapped`` for the next extra entry."""
        for key in obj.keys() - mapped:
            self._extra[f"{prefix}{key}"] = obj[key]

    def keep_raw(self, kind: str, raw: bytes, *, id: str, parent_id: str | None,
                 timestamp: datetime) -> CustomEntry[Any]:
        """A source record threadline has no place for, kept byte for byte."""
        self.raw += 1
        return CustomEntry(kind=f"{self.fmt}.{kind}", data=msgspec.Raw(raw), id=id,
                           parent_id=parent_id, timestamp=timestamp)

    def extra(self, after: Entry) -> list[Entry]:
        """The fields gathered since the last call, as an entry following ``after``."""
        if not self._extra:
            return []
        fields, self._extra = dict(sorted(self._extra.items())), {}
        self.fields.update(fields.keys())
        return [self.keep_raw("extra", msgspec.json.encode(fields),
                              id=_name_id(f"extra\x00{after.id}"),
                              parent_id=after.id, timestamp=after.timestamp
                              or datetime.min.replace(tzinfo=UTC))]

    def forget(self) -> None:
        """Fields gathered for a record that ends up kept raw as a whole."""
        self._extra = {}

    def imported(self, record: SessionRecord, entries: list[Entry]) -> Imported:
        return Imported(record, entries, self.raw, dict(sorted(self.fields.items())),
                        tuple(self.notes))


class Lines(Collector):
    """The JSON objects of a JSON-lines file, with their line numbers.

    A last line with no newline that is not JSON is what a writer killed
    mid-append leaves: it is left out and noted (the rest is complete and a
    later import picks up the finished line). Any other line that is not a
    JSON object is an error naming the file and line.
    """

    def __init__(self, fmt: str, data: bytes, name: str) -> None:
        super().__init__(fmt, name)
        lines = data.split(b"\n")  # never a universal-newline split: see docs/design.md
        self._torn = lines[-1] != b""
        self._lines = lines if self._torn else lines[:-1]

    def __iter__(self) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        last = len(self._lines)
        for lineno, line in enumerate(self._lines, 1):
            if not line.strip():
                continue
            try:
                obj = msgspec.json.decode(line)
            except msgspec.DecodeError as exc:
                if lineno == last and self._torn:
                    self.notes.append(f"{self.name} line {lineno}: torn last line (no newline, "
                                      "not JSON) left out; import again once it is complete")
                    return
                raise self.fail(lineno, f"not JSON: {exc}") from exc
            if not isinstance(obj, dict):
                raise self.fail(lineno, f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, line, obj


SQLITE_MAGIC = b"SQLite format 3\x00"


def detect(head: bytes) -> str | None:
    """The format a file's first bytes show: ``threadline``, ``pi``, ``claude-code``,
    ``openai-agents-sqlite``, or None when they show none of them.

    Each is told by what only it writes: threadline's ``session_init`` line, pi's
    ``session`` header, the ``sessionId`` or ``uuid``/``parentUuid`` Claude Code
    puts on its lines, SQLite's file header.
    """
    if head.startswith(SQLITE_MAGIC):
        return "openai-agents-sqlite"
    for n, line in enumerate(head.split(b"\n")[:50]):
        if not line.strip():
            continue
        try:
            obj = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        if n == 0 and obj.get("type") == "session_init":
            return "threadline"
        if n == 0 and obj.get("type") == "session" and isinstance(obj.get("id"), str):
            return "pi"
        if isinstance(obj.get("sessionId"), str) or ("uuid" in obj and "parentUuid" in obj):
            return "claude-code"
    return None


_NAMES = {"threadline": "a threadline export", "pi": "a pi session file",
          "claude-code": "a Claude Code transcript",
          "openai-agents-sqlite": "an Agents SDK SQLite database"}


def not_the_format(name: str, data: bytes, expected: str) -> CorruptLog | None:
    """An error for a file that reads as another known format than ``expected``."""
    found = detect(data[:1 << 16])
    if found is None or found == expected:
        return None
    return CorruptLog(f"this is {_NAMES[found]}, not {_NAMES[expected]}", path=name)
