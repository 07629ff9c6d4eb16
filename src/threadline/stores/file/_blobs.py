"""The file store's blobs: ``<root>/blobs/<first two characters>/<key>``.

A blob is written to a temporary file in its folder, synced, renamed to its
key and the folder synced, so its name never shows part of it and it is on
stable storage when ``put_blob`` returns. Every path is walked one component
at a time from the root's descriptor with ``O_NOFOLLOW``, so a symbolic link
planted anywhere under ``blobs/`` is refused, never followed, and a key (the
blob-key rule: letters and digits only) cannot name anything outside.

A blob's touched time is its file's mtime. Puts hold a shared ``flock`` on
``blobs/.lock`` and deletions an exclusive one, so a delete's age check and
its unlink are one step against a put refreshing the same blob, in any
process. Reads take no lock: only blobs nobody references are ever deleted.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path

from threadline.errors import BlobNotFound, CorruptLog, DurabilityError, StoreError
from threadline.stores._contract import BlobInfo
from threadline.stores._rules import check_blob_key, from_micros, to_micros

try:
    import fcntl
except ImportError:  # no flock here: FileStore refuses to open, so no blob folder is used
    fcntl = None  # type: ignore[assignment]
_SHARED = 1 if fcntl is None else fcntl.LOCK_SH
_EXCLUSIVE = 2 if fcntl is None else fcntl.LOCK_EX

__all__ = ["FileBlobs"]

_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))
_FILE_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(
    os, "O_NONBLOCK", 0)

Poison = Callable[[str, BaseException], DurabilityError]


class FileBlobs:
    """Blob files under ``root/blobs``; the blocking half, run on worker threads."""

    def __init__(self, root: Path, sync: bool, poison: Poison) -> None:
        self.root = root  # resolved once by the store
        self.path = root / "blobs"
        self.sync = sync
        self.poison = poison

    # -- walking without following links ---------------------------------------------

    def _open_dir(self, parent: int, name: str, *, create: bool) -> int | None:
        """``name`` under the directory ``parent``, opened; None if absent and not ``create``."""
        for _ in range(2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StoreError(f"{self.path}: {name!r} is not a directory (a symbolic "
                                     f"link?); the file store never follows links there") from exc
                raise
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                continue  # made by another writer meanwhile
            self._fsync(parent, f"directory holding {name}")
        raise StoreError(f"{self.path}: cannot open {name!r}")  # pragma: no cover

    @contextmanager
    def _top(self, *, create: bool) -> Iterator[int | None]:
        """The blobs folder, open; None when there is none yet."""
        root = os.open(self.root, _DIR_FLAGS)
        try:
            top = self._open_dir(root, "blobs", create=create)
        finally:
            os.close(root)
        try:
            yield top
        finally:
            if top is not None:
                os.close(top)

    @contextmanager
    def _dirs(self, key: str, *, create: bool) -> Iterator[tuple[int, int] | None]:
        """(blobs folder, folder of ``key``), open; None when either is absent."""
        with self._top(create=create) as top:
            shard = None if top is None else self._open_dir(top, key[:2], create=create)
            if top is None or shard is None:
                yield None
                return
            try:
                yield top, shard
            finally:
                os.close(shard)

    @contextmanager
    def _lock(self, top: int, kind: int) -> Iterator[None]:
        fd = os.open(".lock", os.O_RDWR | os.O_CREAT | _FILE_FLAGS, 0o644, dir_fd=top)
        try:
            assert fcntl is not None
            fcntl.flock(fd, kind)
            yield
        finally:
            os.close(fd)

    def _fsync(self, fd: int, what: str, *, data: bool = False) -> None:
        if not self.sync:
            return
        try:
            # A new file's data and size: fdatasync, as the log's appends (macOS has none).
            (getattr(os, "fdatasync", os.fsync) if data else os.fsync)(fd)
        except OSError as exc:
            raise self.poison(f"fsync of the {what} in {self.path} failed", exc) from exc

    def _stat(self, shard: int, key: str) -> os.stat_result | None:
        try:
            st = os.stat(key, dir_fd=shard, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise CorruptLog("not a blob: the file store keeps blobs as regular files and "
                             "never follows links", path=str(self.path / key[:2] / key))
        return st

    # -- the BlobStore methods ---------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        check_blob_key(key)
        with self._dirs(key, create=True) as dirs:
            assert dirs is not None
            top, shard = dirs
            with self._lock(top, _SHARED):
                if self._stat(shard, key) is not None:
                    # Stored already: refresh its touched time (the GC grace) only.
                    os.utime(key, dir_fd=shard, follow_symlinks=False)
                    return
                tmp = f".{key}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o644,
                             dir_fd=shard)
                try:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view):]
                        self._fsync(fd, f"blob {key}", data=True)
                    finally:
                        os.close(fd)
                    os.rename(tmp, key, src_dir_fd=shard, dst_dir_fd=shard)
                except BaseException:
                    with suppress(OSError):
                        os.unlink(tmp, dir_fd=shard)
                    raise
                self._fsync(shard, f"folder of blob {key}")

    def get(self, key: str) -> bytes:
        check_blob_key(key)
        with self._dirs(key, create=False) as dirs:
            if dirs is None:
                raise BlobNotFound(key, str(self.path))
            shard = dirs[1]
            try:
                fd = os.open(key, os.O_RDONLY | _FILE_FLAGS, dir_fd=shard)
            except FileNotFoundError:
                raise BlobNotFound(key, str(self.path)) from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise CorruptLog("not a blob: the file store never follows links",
                                     path=str(self.path / key[:2] / key)) from exc
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise CorruptLog("not a blob: not a regular file",
                                     path=str(self.path / key[:2] / key))
                chunks = []
                while chunk := os.read(fd, max(st.st_size, 1 << 16)):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def has(self, keys: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for key in keys:
            with self._dirs(key, create=False) as dirs:
                if dirs is not None and self._stat(dirs[1], key) is not None:
                    found.add(key)
        return found

    def touch(self, keys: Sequence[str]) -> set[str]:
        found: set[str] = set()
        with self._top(create=False) as top:
            if top is None:
                return found
            with self._lock(top, _SHARED):  # against a delete, as a put is
                for key in keys:
                    with self._dirs(key, create=False) as dirs:
                        if dirs is not None and self._stat(dirs[1], key) is not None:
                            os.utime(key, dir_fd=dirs[1], follow_symlinks=False)
                            found.add(key)
        return found

    def _shards(self, top: int) -> Iterator[tuple[str, int]]:
        for name in sorted(os.listdir(top)):
            if name.startswith("."):
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=top)
            except OSError:
                continue  # not a folder of blobs (a stray file or link): not ours to list
            try:
                yield name, fd
            finally:
                os.close(fd)

    def listing(self) -> list[BlobInfo]:
        out: list[BlobInfo] = []
        with self._top(create=False) as top:
            if top is None:
                return out
            for prefix, shard in self._shards(top):
                for name in os.listdir(shard):
                    if name.startswith(".") or not name.startswith(prefix):
                        continue
                    try:
                        st = os.stat(name, dir_fd=shard, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # deleted meanwhile
                    if stat.S_ISREG(st.st_mode):
                        out.append(BlobInfo(key=name, size=st.st_size,
                                            touched_at=from_micros(st.st_mtime_ns // 1000)))
        return out

    def delete(self, keys: Sequence[str], older_than: datetime) -> list[str]:
        cutoff_ns = to_micros(older_than) * 1000
        deleted: list[str] = []
        with self._top(create=False) as top:
            if top is None:
                return deleted
            with self._lock(top, _EXCLUSIVE):
                by_shard: dict[str, list[str]] = {}
                for key in dict.fromkeys(keys):
                    by_shard.setdefault(key[:2], []).append(key)
                for prefix, shard in self._shards(top):
                    wanted = by_shard.get(prefix, [])
                    for key in wanted:
                        st = self._stat(shard, key)
                        if st is not None and st.st_mtime_ns < cutoff_ns:
                            os.unlink(key, dir_fd=shard)
                            deleted.append(key)
                    # A temporary file a killed writer left, older than the cut-off.
                    for name in os.listdir(shard):
                        if name.startswith(".") and name.endswith(".tmp"):
                            try:
                                st = os.stat(name, dir_fd=shard, follow_symlinks=False)
                                if st.st_mtime_ns < cutoff_ns:
                                    os.unlink(name, dir_fd=shard)
                            except FileNotFoundError:
                                pass
                    if wanted:
                        self._fsync(shard, f"folder {prefix}")
        return deleted
