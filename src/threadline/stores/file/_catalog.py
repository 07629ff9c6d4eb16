"""The file store's listing: the first line of every session file, kept between calls.

Creating, deleting or renaming a session changes the root's mtime, so while
the mtime (and the root itself) is unchanged, no session came or went and
the last scan still holds. A timestamp can repeat for a change made within a
clock tick of the scan, so a scan is served again only if the mtime it saw is
older than that; a busy root is scanned again on every call. A scan after a
change re-reads only files it has not seen, and files whose inode changed or
whose ctime is not a tick older than the scan that read them.

Not noticed: another program rewriting a session file's first line in place.
The store never does; the first line is written once.

Metadata and last activity are derived the same way: each listed
file remembers how far it was read and what its lines held (the metadata
folded so far, the newest entry time). A listing that needs them stats the
file and reads only the complete lines appended since, whoever appended
them; a file that is no longer what was read (another inode, a shorter file,
other bytes just before that point) is read again from its first entry. An
edit in place further back, which the store never makes, is not noticed. Nothing here is
stored: a new handle rebuilds it from the logs, which stay the only truth.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime

from threadline.errors import CorruptLog
from threadline.session._entries import SessionRecord
from threadline.session._metadata import SessionMetadata, fold_metadata, newest_timestamp
from threadline.stores._contract import SessionInfo
from threadline.stores._listing import activity_of
from threadline.stores._rules import sort_key
from threadline.stores.file._format import decode_body
from threadline.stores.file._names import OPEN_FLAGS, SUFFIX, kind, read_head

__all__ = ["Catalog", "scan"]

# How long after a change to a directory (or file) its timestamps may still
# repeat: file systems stamp changes from a clock that ticks in steps, so a
# change made just after a listing read the directory can carry the very
# timestamp the listing saw. Timestamps that are whole seconds suggest a file
# system that keeps no more than seconds.
_RACY_NS = 50_000_000
_RACY_COARSE_NS = 2_000_000_000

Check = Callable[[bytes, str, str], SessionRecord]
"""Reads a session file's first line: (data, path, file name) -> record, or CorruptLog."""


def _settled(stamp_ns: int, seen_at_ns: int) -> bool:
    """True if a change after ``seen_at_ns`` must give a timestamp other than ``stamp_ns``."""
    margin = _RACY_COARSE_NS if stamp_ns % 1_000_000_000 == 0 else _RACY_NS
    return stamp_ns < seen_at_ns - margin


_TAIL = 32
"""Bytes a listed file compares to tell that it still holds what was read."""


class _Listed:
    """One ``*.jsonl`` in the root as a scan found it."""

    __slots__ = ("found", "ino", "meta", "mtime_ns", "newest", "offset", "seen_at", "tail")

    def __init__(self, ino: int, found: SessionRecord | CorruptLog, seen_at: int) -> None:
        self.ino = ino
        self.found = found
        self.seen_at = seen_at  # time.time_ns() before the scan that read it
        self.offset = 0
        """Where the lines read so far end (0: none read yet)."""
        self.mtime_ns = 0
        """The file's mtime when it ended at ``offset``: unchanged since, if both still hold."""
        self.tail = b""
        self.meta = SessionMetadata()
        self.newest: datetime | None = None

    def catch_up(self, path: str) -> bool:
        """Fold the complete lines appended since the last look; False if the file is gone."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if (st.st_ino == self.ino and st.st_size == self.offset
                and st.st_mtime_ns == self.mtime_ns):
            return True  # one stat: nothing was appended or written since
        try:
            fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        except FileNotFoundError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_ino != self.ino:
                return False  # another file took the name: the next scan reads it
            if self.offset and (st.st_size < self.offset or os.pread(
                    fd, len(self.tail), self.offset - len(self.tail)) != self.tail):
                self.offset = 0  # not the bytes read: read it all again
            if self.offset == 0:
                self.meta, self.newest = SessionMetadata(), None
                head = read_head(fd)
                self.offset = head.find(b"\n") + 1
                self.tail = head[:self.offset][-_TAIL:]
            if st.st_size > self.offset:
                data = os.pread(fd, st.st_size - self.offset, self.offset)
                end = data.rfind(b"\n") + 1
                if end:
                    self._fold(data, end, path)
                    self.offset += end
                    self.tail = (self.tail + data[:end][-_TAIL:])[-_TAIL:]
            self.mtime_ns = st.st_mtime_ns if st.st_size == self.offset else 0
        finally:
            os.close(fd)
        return True

    def _fold(self, data: bytes, end: int, path: str) -> None:
        try:
            entries = decode_body(data, 0, end, path=path)
        except CorruptLog:
            return  # a load reports it; the listing keeps what it knew
        self.meta = fold_metadata(entries, self.meta)
        ts = newest_timestamp(entries)
        if ts is not None and (self.newest is None or ts > self.newest):
            self.newest = ts

    def info(self) -> SessionInfo:
        record = self.found
        assert isinstance(record, SessionRecord)
        return SessionInfo(record=record, metadata=self.meta,
                           last_activity=activity_of(record, self.newest))

    def still(self, item: os.DirEntry[str]) -> bool:
        """Whether the file at ``item`` is surely the one read, unchanged since.

        Same inode, and a ctime a tick older than the read: any change to the
        file after the read (or a new file that got the old inode back)
        would carry a later ctime.
        """
        return (type(self.found) is SessionRecord and item.inode() == self.ino
                and _settled(os.stat(item.path, follow_symlinks=False).st_ctime_ns,
                             self.seen_at))


class Catalog:
    """What one scan of the root found: records oldest first, and the problems."""

    __slots__ = ("dev", "files", "ino", "keys", "listed", "mtime_ns", "names", "problems",
                 "records", "reusable")

    def __init__(self, st: os.stat_result, reusable: bool, files: dict[str, _Listed]) -> None:
        self.dev, self.ino, self.mtime_ns = st.st_dev, st.st_ino, st.st_mtime_ns
        self.reusable = reusable
        self.files = files
        keyed = sorted(((sort_key(f.found), name) for name, f in files.items()
                        if isinstance(f.found, SessionRecord)))
        self.keys = [k for k, _ in keyed]  # unique (ids are), so names are never compared
        self.names = [name for _, name in keyed]
        self.listed = [files[name] for name in self.names]
        self.records: list[SessionRecord] = [f.found for f in self.listed]  # type: ignore[misc]
        self.problems = sorted((f.found for f in files.values()
                                if isinstance(f.found, CorruptLog)), key=lambda e: e.path or "")

    def current(self, st: os.stat_result) -> bool:
        return self.reusable and (st.st_dev, st.st_ino, st.st_mtime_ns) == (
            self.dev, self.ino, self.mtime_ns)


def scan(root: str | os.PathLike[str], old: Catalog | None, check: Check) -> Catalog:
    """The catalog of ``root`` now: ``old`` if it still holds, else a scan reusing it."""
    now = time.time_ns()  # before the stat: a change after it is stamped later
    st = os.stat(root)
    if old is not None and old.current(st):
        return old
    files: dict[str, _Listed] = {}
    with os.scandir(root) as it:
        for item in it:
            if not item.name.endswith(SUFFIX) or item.name.startswith("."):
                continue
            listed = _list_one(item, None if old is None else old.files.get(item.name),
                               now, check)
            if listed is not None:
                files[item.name] = listed
    return Catalog(st, _settled(st.st_mtime_ns, now), files)


def _list_one(item: os.DirEntry[str], known: _Listed | None, now: int,
              check: Check) -> _Listed | None:
    """What the file at ``item`` holds: reused from ``known`` if it is surely the same file."""
    path = item.path
    try:
        if known is not None and known.still(item):
            return known
        if not item.is_file(follow_symlinks=False):
            what = kind(os.stat(path, follow_symlinks=False).st_mode)
            return _Listed(item.inode(), CorruptLog(f"not a session log: {what}", path=path),
                           now)
        # The directory entry said "regular file", and O_NONBLOCK keeps a file
        # swapped for a FIFO since from blocking us (its read then fails).
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        try:
            head = read_head(fd)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None  # deleted while we listed
    except OSError as exc:
        return _Listed(item.inode(), CorruptLog(f"cannot read: {exc}", path=path), now)
    try:
        found: SessionRecord | CorruptLog = check(head, path, item.name)
    except CorruptLog as exc:
        found = exc
    return _Listed(item.inode(), found, now)
