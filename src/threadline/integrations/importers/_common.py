"""What every importer shares: the result type, source-derived ids, line reading (S30).

Re-importing is safe because nothing an importer writes depends on when or
where it runs: session ids are the source's own, entry ids are name-based
UUIDs of (format, session, source id), timestamps come from the source. The
same file therefore yields the same bytes, and ``copy_sessions`` skips it.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

from threadline.errors import CorruptLog
from threadline.session._entries import CustomEntry, Entry, SessionRecord

__all__ = ["Imported", "Lines", "entry_id", "parse_time"]

_NAMESPACE = uuid.UUID("5b0f3c1e-7d2a-4c55-9e61-0a8f2d4b7c39")


class Imported(NamedTuple):
    """One session read from a file, ready to be appended in one batch."""

    record: SessionRecord
    entries: list[Entry]
    kept_raw: int = 0
    """How many of ``entries`` are raw ``CustomEntry`` copies of source records
    threadline has no place for (the rest are mapped)."""
    dropped_fields: dict[str, int] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    """Source fields with no place in a mapped entry, by name, with counts."""
    notes: tuple[str, ...] = ()
    """Things the reader should know, such as a torn last line left out."""


def entry_id(fmt: str, session_id: str, source_id: str) -> str:
    """The threadline entry id for a source record: stable across imports."""
    return str(uuid.uuid5(_NAMESPACE, f"{fmt}\x00{session_id}\x00{source_id}"))


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


class Lines:
    """The JSON objects of a JSON-lines file, with their line numbers.

    A last line with no newline that is not JSON is what a writer killed
    mid-append leaves: it is left out and noted (the rest is complete and a
    later import picks up the finished line). Any other line that is not a
    JSON object is an error naming the file and line.
    """

    def __init__(self, data: bytes, name: str) -> None:
        self.name = name
        self.notes: list[str] = []
        self.dropped: Counter[str] = Counter()
        self.raw = 0
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
                raise CorruptLog(f"not JSON: {exc}", path=self.name, line=lineno) from exc
            if not isinstance(obj, dict):
                raise CorruptLog(f"expected a JSON object, got {type(obj).__name__}",
                                 path=self.name, line=lineno)
            yield lineno, line, obj

    def fail(self, line: int, detail: str) -> CorruptLog:
        return CorruptLog(detail, path=self.name, line=line)

    def drop(self, obj: dict[str, Any], mapped: set[str], prefix: str) -> None:
        """Count the keys of ``obj`` outside ``mapped`` as dropped fields."""
        for key in obj.keys() - mapped:
            self.dropped[f"{prefix}{key}"] += 1

    def keep_raw(self, kind: str, raw: bytes, *, id: str, parent_id: str | None,
                 timestamp: datetime) -> CustomEntry[Any]:
        """A source record threadline has no place for, kept byte for byte."""
        self.raw += 1
        return CustomEntry(kind=kind, data=msgspec.Raw(raw), id=id, parent_id=parent_id,
                           timestamp=timestamp)

    def imported(self, record: SessionRecord, entries: list[Entry]) -> Imported:
        return Imported(record, entries, self.raw, dict(sorted(self.dropped.items())),
                        tuple(self.notes))
