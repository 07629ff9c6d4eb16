"""The file store's search index: derived from the logs, kept beside them.

``ROOT/.search/`` holds one index file per session log, named after it:
the log's identity when it was read (inode, size, modification and change
times), the session's owner and tenant, and each entry's id, parent and
indexed text (``stores/_search.py``). It is never the source of truth:
deleting the folder loses nothing, and it is rebuilt as needed.

Every search lists the logs first and checks each against its index file:
an index that is missing, or whose recorded identity differs from the log's
now (another process appended, or repaired a torn tail), is rebuilt from
the log before it is used; an index file whose log is gone is removed. So
a search sees every acknowledged append, by any process, and never a
deleted session, without the append path doing any indexing work. An index
file is written to a temporary name and renamed, so a reader never sees
half of one, and it is not synced: losing it costs a rebuild.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from threadline.errors import CorruptLog, SessionNotFound
from threadline.session._entries import Entry
from threadline.session._metadata import fold_metadata
from threadline.stores._contract import SearchHit
from threadline.stores._search import (
    Query,
    indexed_text,
    path_keys,
    rank_of,
    snippet_of,
    words,
)
from threadline.stores.file._names import OPEN_FLAGS

__all__ = ["INDEX_DIR", "SearchIndex", "forget"]

INDEX_DIR = ".search"
_SUFFIX = ".idx"
_FORMAT = 1


class _Entry(msgspec.Struct, array_like=True):
    id: str
    parent: str | None
    text: str | None


class _Stored(msgspec.Struct, array_like=True):
    format: int
    stamp: tuple[int, int, int, int]
    owner: str | None
    tenant: str | None
    entries: list[_Entry]


class _Loaded:
    """One session's index as a search uses it (words made once)."""

    __slots__ = ("path", "stamp", "stored", "words")

    def __init__(self, stored: _Stored) -> None:
        self.stamp = stored.stamp
        self.stored = stored
        self.words = [None if e.text is None else words(e.text) for e in stored.entries]
        self.path: set[str] | None = None

    def active_path(self) -> set[str]:
        if self.path is None:
            self.path = path_keys({e.id: e.parent for e in self.stored.entries})
        return self.path


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file inside a real index folder.

    The index folder is inside a store root another program may write to: a
    link is not followed, a FIFO or device is not waited on (``OSError``).
    """
    if not stat.S_ISDIR(os.lstat(path.parent).st_mode):
        raise OSError(f"{path.parent} is not a folder")
    fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def index_path(root: Path, log_name: str) -> Path:
    return root / INDEX_DIR / (log_name + _SUFFIX)


def forget(root: Path, log_name: str) -> None:
    """Remove the index file of the log ``log_name`` (its session was deleted)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(index_path(root, log_name))


class SearchIndex:
    """The derived index of one ``FileStore`` root; ``search`` runs on a worker thread."""

    def __init__(self, root: Path, load: Callable[[str], Sequence[Entry]]) -> None:
        self.root = root
        self._load = load
        self._cache: dict[str, _Loaded] = {}

    def search(self, sessions: Sequence[tuple[str, Path]], q: Query) -> list[SearchHit]:
        """The hits among ``sessions`` (id, log path), best first, then by session and order."""
        wanted, owner, tenant = set(q.terms), q.owner, q.tenant
        found: list[tuple[float, str, int, SearchHit]] = []
        live: set[str] = set()
        for sid, log in sessions:
            live.add(log.name)
            index = self._current(sid, log)
            if index is None:
                continue
            meta = index.stored
            if ((owner is not None and meta.owner != owner)
                    or (tenant is not None and meta.tenant != tenant)):
                continue
            for n, (entry, ws) in enumerate(zip(meta.entries, index.words, strict=True)):
                if ws is None or not wanted.issubset(ws):
                    continue
                if q.active_path and entry.id not in index.active_path():
                    continue
                assert entry.text is not None
                rank = rank_of(ws, q.terms)
                found.append((-rank, sid, n, SearchHit(
                    session_id=sid, entry_id=entry.id, snippet=snippet_of(entry.text, q.terms),
                    rank=rank)))
        self._sweep(live)
        for gone in self._cache.keys() - {sid for sid, _ in sessions}:
            del self._cache[gone]
        found.sort(key=lambda f: f[:3])
        return [f[3] for f in found[:q.limit]]

    def _current(self, sid: str, log: Path) -> _Loaded | None:
        """The session's index, rebuilt if the log changed; None if the log is gone."""
        try:
            st = os.stat(log, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp = _stamp(st)
        cached = self._cache.get(sid)
        if cached is not None and cached.stamp == stamp:
            return cached
        where = index_path(self.root, log.name)
        try:
            stored = msgspec.msgpack.decode(_read_regular(where), type=_Stored)
            if stored.format == _FORMAT and tuple(stored.stamp) == stamp:
                loaded = self._cache[sid] = _Loaded(stored)
                return loaded
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            pass  # missing, stale or damaged: rebuilt from the log
        return self._rebuild(sid, log, where)

    def _rebuild(self, sid: str, log: Path, where: Path) -> _Loaded | None:
        # The stamp is taken before the read: an append landing during it
        # leaves an index that looks stale next time, never one that looks
        # current while missing entries.
        try:
            stamp = _stamp(os.stat(log, follow_symlinks=False))
            entries = self._load(sid)
        except (SessionNotFound, FileNotFoundError):
            return None
        except CorruptLog:
            return None  # a log that cannot be read is reported by load and list
        meta = fold_metadata(entries)
        stored = _Stored(_FORMAT, stamp, meta.owner, meta.tenant,
                         [_Entry(e.id, e.parent_id, indexed_text(e)) for e in entries])
        try:
            where.parent.mkdir(exist_ok=True)
            if not stat.S_ISDIR(os.lstat(where.parent).st_mode):
                raise OSError(f"{where.parent} is not a folder")  # a link: written nowhere
            temp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
            temp.write_bytes(msgspec.msgpack.encode(stored))
            os.replace(temp, where)
            if not log.exists():
                # Deleted while it was read: leave no copy of its text behind.
                where.unlink(missing_ok=True)
                return None
        except OSError:
            pass  # a read-only root still searches, rebuilding in memory each time
        loaded = self._cache[sid] = _Loaded(stored)
        return loaded

    def _sweep(self, live: set[str]) -> None:
        """Remove index files (and cached indexes) whose log is gone."""
        folder = self.root / INDEX_DIR
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                return  # a link: nothing of it is ours to remove
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if name.endswith(_SUFFIX) and name[:-len(_SUFFIX)] not in live:
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)
