"""Which file holds which session: file names, opening only regular files, the first line.

An id made only of lowercase letters, digits, ``-`` and ``_`` (at most 100
characters, not a Windows device name such as ``con``) is its own file name.
Every other id is ``=`` plus the lowercase base32 of its UTF-8 bytes, or ``==``
plus its SHA-256 when that would be too long. Neither form holds a path
separator, and readable names never start with ``=``, so no id can leave the
root and no two ids share a file, even on a case-insensitive or
Unicode-normalising file system.

``write_all`` and ``fdatasync`` are the writes the store's modules share.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import stat
from pathlib import Path

from threadline.errors import CorruptLog, InvalidSessionId, StoreError
from threadline.session._entries import SessionRecord
from threadline.stores._rules import check_session_id
from threadline.stores.file._format import decode_init

__all__ = ["OPEN_FLAGS", "SUFFIX", "check_head", "fdatasync", "glob_escape", "kind",
           "open_regular", "read_head", "session_file_name", "write_all"]

SUFFIX = ".jsonl"
_READABLE = re.compile(r"[a-z0-9_-]{1,100}")
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"}
    | {f"{p}{n}" for p in ("com", "lpt") for n in "0123456789¹²³"}
)
_MAX_BASE32_BYTES = 120  # 192 base32 characters: the name stays well under 255 bytes
# Never follow a symlink at a session path, and never wait on a FIFO or device
# there (O_NONBLOCK changes nothing for the regular files that pass the check).
OPEN_FLAGS = (getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_NONBLOCK", 0))
# A session_init line holds two ids of at most 1,024 UTF-8 bytes (6x that when
# escaped) and a timestamp, so 64 KiB bounds every first line; most fit in
# the first, small read.
MAX_HEADER = 1 << 16
_FIRST_READ = 4096
_INIT_PREFIX = b'{"type":"session_init"'


def session_file_name(session_id: str) -> str:
    """The file name (inside the root) that holds ``session_id``."""
    check_session_id(session_id)
    if _READABLE.fullmatch(session_id) and session_id not in _DEVICE_NAMES:
        return session_id + SUFFIX
    raw = session_id.encode("utf-8")
    if len(raw) <= _MAX_BASE32_BYTES:
        return "=" + base64.b32encode(raw).decode("ascii").rstrip("=").lower() + SUFFIX
    return "==" + hashlib.sha256(raw).hexdigest() + SUFFIX


def _holds(name: str, session_id: str) -> bool:
    """Whether ``name`` is the file of ``session_id``; False for an id no store keeps."""
    if _READABLE.fullmatch(session_id) and session_id not in _DEVICE_NAMES:
        return name == session_id + SUFFIX  # most ids, without the full id check
    try:
        return name == session_file_name(session_id)
    except InvalidSessionId:
        return False


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def kind(mode: int) -> str:
    """What a file of this mode is, for an error message."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | Path, flags: int,
                 session_id: str | None) -> tuple[int, os.stat_result]:
    """Open ``path`` if it is a regular file, never through a symbolic link.

    Anything else at a session path is reported as ``CorruptLog`` without
    blocking on it (a FIFO) or reading it (a device). ``FileNotFoundError``
    passes through for the caller to report.
    """
    try:
        fd = os.open(path, flags | OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV):
            of = "" if session_id is None else f" of session {session_id!r}"
            raise StoreError(f"cannot open {path}{of}: {exc}", session_id=session_id) from exc
        try:
            what = kind(os.lstat(path).st_mode)
        except OSError:
            what = "not a regular file"
        raise CorruptLog(f"not a session log: {what}; the file store opens only regular "
                         f"files and never follows links", session_id=session_id,
                         path=str(path)) from exc
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptLog(f"not a session log: {kind(st.st_mode)}; the file store opens only "
                         f"regular files", session_id=session_id, path=str(path))
    return fd, st


def read_head(fd: int) -> bytes:
    """The start of a file, enough to hold its first line (one bounded read, mostly small)."""
    head = os.pread(fd, _FIRST_READ, 0)
    if b"\n" not in head and len(head) == _FIRST_READ:
        head = os.pread(fd, MAX_HEADER, 0)
    return head


def check_head(data: bytes, session_id: str | None, path: str | Path,
               name: str | None = None) -> SessionRecord:
    """The record in the first line of ``data`` (which may hold more lines).

    The line must name ``session_id`` (any session, for None) and the file's
    ``name`` (taken from ``path`` when not given) must be that session's.
    Nothing of a file that does not start like a session log is quoted: it
    may be anything, a secret included.
    """
    newline = data.find(b"\n", 0, MAX_HEADER)
    if not data.startswith(_INIT_PREFIX):
        raise CorruptLog("not a session log: the first line is not a session_init object",
                         session_id=session_id, path=str(path), line=1)
    if newline < 0:
        detail = ("no complete session_init line" if len(data) < MAX_HEADER else
                  f"the session_init line is longer than {MAX_HEADER} bytes")
        raise CorruptLog(detail, session_id=session_id, path=str(path), line=1)
    record = decode_init(data[:newline], session_id=session_id, path=str(path))
    expected = session_id if session_id is not None else record.id
    if record.id != expected or not _holds(name or os.path.basename(path), record.id):
        shown = repr(record.id[:60]) + ("..." if len(record.id) > 60 else "")
        raise CorruptLog(f"session_init names session {shown}, which does not belong in "
                         f"this file", session_id=session_id, path=str(path), line=1)
    return record


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fdatasync(fd: int) -> None:
    # macOS has no fdatasync; fsync is the closest it offers.
    getattr(os, "fdatasync", os.fsync)(fd)
