"""Pruning a session file: the entries kept go to a new file renamed over the old one.

``FileStore.prune_session`` opens the file and takes the exclusive lock every
append takes, then hands it to ``prune_file``. What belongs to the store (its
cached id index, the torn-tail repair, the folder sync) comes in as
callbacks, so this module knows files and lines only.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from threadline.stores._contract import Choose, Cut
from threadline.stores.file._format import (
    decode_body,
    format_version,
    frame,
    ids_in,
    stored_entries,
)
from threadline.stores.file._names import check_head, glob_escape, write_all

__all__ = ["prune_file"]


def prune_file(fd: int, path: Path, session_id: str, choose: Choose, *, fsync: bool,
               forget: Callable[[], None],
               repair_tail: Callable[[int, int, Path], object],
               sync_dir: Callable[[], None]) -> Cut:
    """Take out of the session file at ``fd`` (locked, at ``path``) what ``choose`` picks.

    ``forget`` drops the store's index of the file before it goes;
    ``repair_tail(fd, end, path)`` moves a torn last line after ``end`` aside;
    ``sync_dir`` syncs the folder (when ``fsync``).
    """
    folder = path.parent
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    record = check_head(data, session_id, path)
    first = data.find(b"\n")
    end = data.rfind(b"\n") + 1
    entries = decode_body(data, first + 1, end, session_id=session_id, path=str(path),
                          first_line=2)
    cut = choose(record, entries)
    if cut.session:
        forget()
        os.unlink(path)
        for aside in folder.glob(f"{glob_escape(path.name)}.torn-*"):
            aside.unlink(missing_ok=True)
        sync_dir()
        return Cut(session=True)
    gone = set(cut.entries).intersection(e.id for e in entries)
    if not gone:
        return Cut()
    for stale in folder.glob(f".{glob_escape(path.name)}.*.prune"):
        stale.unlink(missing_ok=True)  # left by a prune killed mid-write: none runs now
    version = format_version(data[:first])
    out = [data[:first + 1]]
    for line in data[first + 1:end].split(b"\n")[:-1]:
        if gone.isdisjoint(ids_in(line + b"\n")):
            out.append(line + b"\n")
            continue
        kept = [piece for piece in stored_entries(line)
                if ids_in(piece + b"\n")[0] not in gone]
        if kept:
            out.append(frame(kept, version=version))
    if end < len(data):
        # A torn last line goes aside, as an append would put it.
        repair_tail(fd, end, path)
    tmp = folder / f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.prune"
    try:
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                      | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            write_all(tfd, b"".join(out))
            if fsync:
                os.fsync(tfd)
        finally:
            os.close(tfd)
        forget()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    sync_dir()
    return Cut(entries=tuple(i for i in dict.fromkeys(cut.entries) if i in gone))
