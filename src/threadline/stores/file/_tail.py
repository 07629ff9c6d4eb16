"""Reading the end of a session file: what came after a point in it.

A watcher follows the file from a byte offset (``WatchPosition``), the
entries after an id are found by reading back from the end, and
``lines_backwards`` gives the lines before an offset, last first. The store
(``_store.py``) opens and locks the file; these only read it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from threadline.errors import EntryNotFound
from threadline.session._entries import Entry
from threadline.stores._rules import lines_after
from threadline.stores._watch import unknown_after
from threadline.stores.file._format import decode_lines
from threadline.stores.file._names import check_head, read_head

__all__ = ["Opener", "WatchPosition", "entries_after", "lines_backwards", "watch_read",
           "watch_start"]

Opener = Callable[[str, int], tuple[int, os.stat_result, Path]]
"""Opens a session's file: ``(session_id, flags) -> (fd, stat, path)``, ``SessionNotFound``
if there is none."""


class WatchPosition(NamedTuple):
    """Where a watcher is in a session file."""

    offset: int
    """Byte offset of the next line not delivered in full (after a complete line)."""
    line: int
    """Line number (1-based) of that line, for error messages."""
    skip: int = 0
    """How many of that line's entries were delivered already (a ``batch`` line)."""
    ino: int = 0
    """The inode read: another one means a prune replaced the file."""
    last: str | None = None
    """The id of the last entry delivered."""


def watch_start(open_file: Opener, session_id: str, after: str | None) -> WatchPosition:
    """The position after ``after`` (``None``: the first entry line) in the session's file."""
    fd, st, path = open_file(session_id, os.O_RDONLY)
    try:
        head = read_head(fd)
        check_head(head, session_id, path)
    finally:
        os.close(fd)
    at = WatchPosition(head.find(b"\n") + 1, 2, ino=st.st_ino)
    while after is not None:
        entries, nxt = watch_read(open_file, session_id, at)
        if not entries:
            raise unknown_after(session_id, after, str(path))
        for n, entry in enumerate(entries):
            if entry.id == after:
                return watch_read(open_file, session_id, at, limit=n + 1)[1]
        at = nxt
    return at


def watch_read(open_file: Opener, session_id: str, at: WatchPosition,
               limit: int = 1000) -> tuple[list[Entry], WatchPosition]:
    """Up to ``limit`` entries after ``at``, and the position after them.

    A line may hold many entries (a ``batch`` line): the position can sit
    inside one, after its first ``at.skip`` entries, so that a resume
    after an entry there neither repeats nor skips its neighbours.
    """
    fd, st, path = open_file(session_id, os.O_RDONLY)
    if at.ino and st.st_ino != at.ino:
        # A prune rewrote the file: offsets changed, so find the place again
        # after the last entry delivered (gone too, it ends the watch).
        os.close(fd)
        return watch_read(open_file, session_id, watch_start(open_file, session_id, at.last),
                          limit)
    try:
        size = st.st_size
        data = os.pread(fd, min(size - at.offset, 1 << 22), at.offset) if size > at.offset \
            else b""
        if b"\n" not in data and at.offset + len(data) < size:
            data = os.pread(fd, size - at.offset, at.offset)  # one line over 4 MiB
    finally:
        os.close(fd)
    entries: list[Entry] = []
    offset, line, skip = at.offset, at.line, at.skip
    for raw in data.split(b"\n")[:-1]:  # the last piece has no newline yet: wait for it
        got = decode_lines(raw, session_id=session_id, path=str(path), first_line=line)[skip:]
        room = limit - len(entries)
        if len(got) > room:
            entries.extend(got[:room])
            return entries, WatchPosition(offset, line, skip + room, st.st_ino,
                                          entries[-1].id)
        entries.extend(got)
        offset, line, skip = offset + len(raw) + 1, line + 1, 0
        if len(entries) == limit:
            break
    last = entries[-1].id if entries else at.last
    return entries, WatchPosition(offset, line, skip, st.st_ino, last)


def entries_after(fd: int, path: Path, session_id: str, entry_id: str) -> list[Entry]:
    """The entries after ``entry_id`` in the session file open (and share-locked) at ``fd``.

    It reads back from the end, a growing chunk at a time, until the line of
    ``entry_id`` is in view: the cost follows what is new, not the log.
    """
    size = os.fstat(fd).st_size
    spelled = msgspec.json.encode(entry_id)
    # An object line names it as "id"; a compact line starts with it.
    needles = (b'"id":' + spelled, b"[" + spelled + b",")
    chunk = 1 << 16
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
        lines = lines[1:]  # cut by the chunk's start, or the session_init line
        if start == 0 or any(n in line for line in lines for n in needles):
            try:
                return lines_after(
                    lines, entry_id, session_id, str(path),
                    lambda line: decode_lines(line, session_id=session_id,
                                              path=str(path)))
            except EntryNotFound:
                if start == 0:
                    raise
                # The id was only mentioned in a later entry: look further back.
        chunk *= 4


def lines_backwards(fd: int, start: int, end: int) -> Iterator[bytes]:
    """The lines of the file between ``start`` and ``end`` (after a newline), last first."""
    if end <= start:
        return
    end -= 1  # the last line's newline
    rest = b""
    chunk = 1 << 16
    while True:
        begin = max(start, end - chunk)
        pieces = (os.pread(fd, end - begin, begin) + rest).split(b"\n")
        if begin == start:
            yield from reversed(pieces)
            return
        rest = pieces[0]  # cut by the chunk's start: joined with the next chunk
        yield from reversed(pieces[1:])
        end, chunk = begin, chunk * 4
