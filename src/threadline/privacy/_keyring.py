"""The keyring: each subject's data keys, wrapped by a key-encryption key, in a folder of their own.

Layout of the folder::

    keyring.json               the keyring's id and its index key (wrapped)
    keys/<ab>/<key id>.json    one subject's data key versions, wrapped; after erasure a
                               tombstone that holds no key
    sessions/<ab>/<name>.json  which data key a session is sealed with
    .lock                      held while a key file changes

A key id and a session's file name are HMACs, under the index key, of the
subject and the session id: nobody without the key-encryption key can tell
from the folder which subjects it serves. Every file is written whole (a
temporary file, fsync, link or rename, fsync of the folder), so a process
killed at any point leaves each file as it was or as it became. A new file is
linked into place, so of two processes creating one key the first wins and
the other uses it; changing a file (a new version, erasure, rewrapping)
holds ``.lock``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import os
import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import msgspec

from threadline.errors import ConfigError, KeyUnavailable, PrivacyError
from threadline.privacy._envelope import DataKey
from threadline.privacy._keys import KeyProvider

__all__ = ["ERASED", "KeyErasure", "Keyring", "Rewrapped"]


class _Erased:
    def __repr__(self) -> str:
        return "ERASED"


ERASED: Final = _Erased()
"""What ``Keyring.reading_keys`` gives for a key version that erasure destroyed."""


class _Wrapped(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    kek: str
    wrapped: bytes
    created: datetime


class _KeyFile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    format: int = 1
    key: str
    versions: tuple[_Wrapped, ...] = ()
    erased_below: int = 0
    """Every version below this one was destroyed by ``erase_subject``."""
    erased_at: datetime | None = None

    def next_version(self) -> int:
        return max([self.erased_below, 1, *(v.version + 1 for v in self.versions)])


class _Meta(msgspec.Struct, frozen=True, kw_only=True):
    format: int = 1
    id: str
    index: _Wrapped


class _Binding(msgspec.Struct, frozen=True, kw_only=True):
    format: int = 1
    session: str
    key: str


@dataclass(frozen=True)
class KeyErasure:
    """What ``erase_subject`` destroyed."""

    subject: str
    key_id: str
    versions: int
    """Data key versions destroyed (0: the subject had no key, or was erased before)."""
    blobs: int = 0
    """Blobs deleted with them (``EncryptedStore.erase_subject`` over a store with blobs)."""


@dataclass(frozen=True)
class Rewrapped:
    """What ``rewrap`` did: data keys (and the index key) now under the new key-encryption key."""

    files: int
    """Key files rewritten."""
    versions: int
    """Wrapped keys rewrapped."""
    unchanged: int
    """Wrapped keys that were under the new key already."""


def _name(digest: bytes, size: int = 15) -> str:
    return base64.b32encode(digest[:size]).decode("ascii").lower()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(path: Path) -> None:
    if path.is_dir():
        return
    _ensure_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    _fsync_dir(path.parent)


def _temp_for(path: Path) -> Path:
    return path.parent / f".{path.stem}.{secrets.token_hex(6)}.tmp"


def _write_temp(path: Path, data: bytes) -> Path:
    _ensure_dir(path.parent)
    temp = _temp_for(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return temp


def _write_new(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, durably; False if it exists (nothing written)."""
    temp = _write_temp(path, data)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
    _fsync_dir(path.parent)
    return True


def _replace(path: Path, data: bytes) -> None:
    os.replace(_write_temp(path, data), path)
    _fsync_dir(path.parent)


_key_decoder = msgspec.json.Decoder(_KeyFile)
_meta_decoder = msgspec.json.Decoder(_Meta)
_binding_decoder = msgspec.json.Decoder(_Binding)
_encode = msgspec.json.encode


class Keyring:
    """Data keys of every subject, in a folder, wrapped by ``provider``'s key-encryption key.

    Keep the folder apart from the data and out of the data's backups:
    erasure destroys a subject's keys here, so a copy of this folder taken
    before the erasure, beside a copy of the data, could still open it.
    ``provider`` may be None to read what needs no key (which entries are
    erased, which key sealed what). ``previous`` are providers of earlier
    key-encryption keys, for keys not yet rewrapped after a rotation.
    ``create=False`` refuses to start a keyring where there is none.
    """

    def __init__(self, path: str | os.PathLike[str], provider: KeyProvider | None = None, *,
                 previous: Sequence[KeyProvider] = (), create: bool = True) -> None:
        self.path = Path(path)
        self.provider = provider
        self.create = create
        self._providers = {p.key_id: p for p in [*previous, *([provider] if provider else [])]}
        self._meta: _Meta | None = None
        self._index: bytes | None = None
        self._files: dict[str, tuple[tuple[int, int, int], _KeyFile]] = {}
        self._keys: dict[tuple[str, int], DataKey] = {}
        self._paths: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Keyring({str(self.path)!r}, {self.provider!r})"

    # -- the index key: names of subjects and sessions --------------------------------

    def _read_meta(self) -> _Meta | None:
        path = self.path / "keyring.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PrivacyError(f"cannot read the keyring file {path}: {exc}") from exc
        try:
            return _meta_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise PrivacyError(f"the keyring file {path} is damaged: {exc}") from exc

    async def _keyring_meta(self) -> _Meta:
        if self._meta is not None:
            return self._meta
        meta = self._read_meta()
        if meta is None:
            if not self.create:
                raise KeyUnavailable(f"there is no keyring at {self.path}")
            provider = self._need_provider("start a keyring")
            keyring_id = secrets.token_hex(8)
            secret = os.urandom(32)
            wrapped = await _wrap(provider, secret, self._context(keyring_id, "index", 1),
                                  "the keyring's index key")
            made = _Meta(id=keyring_id, index=_Wrapped(version=1, kek=provider.key_id,
                                                       wrapped=wrapped, created=_now()))
            path = self.path / "keyring.json"
            if await asyncio.to_thread(_write_new, path, _encode(made)):
                self._index = secret
            meta = self._read_meta()
            assert meta is not None
        self._meta = meta
        return meta

    async def _index_key(self) -> bytes:
        if self._index is None:
            meta = await self._keyring_meta()
            self._index = await self._unwrap(meta.index, self._context(meta.id, "index", 1),
                                             "the keyring's index key")
        return self._index

    @staticmethod
    def _context(keyring_id: str, key_id: str, version: int) -> bytes:
        return f"threadline keyring {keyring_id} key {key_id} version {version}".encode()

    def _need_provider(self, to: str) -> KeyProvider:
        if self.provider is None:
            raise KeyUnavailable(f"no key-encryption key was given to {to} in the keyring at "
                                 f"{self.path}")
        return self.provider

    async def _unwrap(self, wrapped: _Wrapped, context: bytes, what: str) -> bytes:
        provider = self._providers.get(wrapped.kek)
        if provider is None:
            given = (f"the one given is {', '.join(self._providers)} (the wrong key?)"
                     if self._providers else "no key-encryption key was given")
            raise KeyUnavailable(f"{what} is wrapped by key-encryption key {wrapped.kek}, and "
                                 f"{given}; the content is locked")
        try:
            return await provider.unwrap(wrapped.wrapped, context)
        except KeyUnavailable:
            raise
        except Exception as exc:
            raise KeyUnavailable(f"key provider {wrapped.kek} could not unwrap {what}: "
                                 f"{type(exc).__name__}: {exc}") from exc

    async def key_id(self, subject: str) -> str:
        """The id of ``subject``'s data key (needs the key-encryption key)."""
        if not isinstance(subject, str) or not subject:
            raise ConfigError(f"a subject is a non-empty string, got {subject!r}")
        try:
            raw = subject.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"subject {subject!r} is not valid Unicode text") from exc
        # 80 bits: every sealed entry carries it, and subjects of one keyring
        # would need to number about a trillion before two shared an id.
        return _name(hmac.digest(await self._index_key(), b"subject\x00" + raw, "sha256"), 10)

    # -- key files ----------------------------------------------------------------------

    def _key_path(self, key_id: str) -> Path:
        return self.path / "keys" / key_id[:2] / f"{key_id}.json"

    def _read_key(self, key_id: str, *, fresh: bool = False) -> _KeyFile | None:
        # Every seal and open asks, so that an erasure or rotation by another
        # process counts at once: one stat when the file is as last read.
        path = self._paths.get(key_id)
        if path is None:
            path = self._paths[key_id] = os.fspath(self._key_path(key_id))
        cached = self._files.get(key_id)
        if cached is not None and not fresh:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                self._files.pop(key_id, None)
                return None
            except OSError as exc:
                raise PrivacyError(f"cannot read the key file {path}: {exc}") from exc
            if cached[0] == (st.st_ino, st.st_mtime_ns, st.st_size):
                return cached[1]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._files.pop(key_id, None)
            return None
        except OSError as exc:
            raise PrivacyError(f"cannot read the key file {path}: {exc}") from exc
        try:
            st = os.fstat(fd)
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        finally:
            os.close(fd)
        try:
            parsed = _key_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise PrivacyError(f"the key file {path} is damaged: {exc}") from exc
        if parsed.key != key_id:
            raise PrivacyError(f"the key file {path} holds key {parsed.key!r}, not {key_id!r}")
        self._files[key_id] = (sig, parsed)
        return parsed

    async def _open_version(self, key_id: str, wrapped: _Wrapped) -> DataKey:
        cached = self._keys.get((key_id, wrapped.version))
        if cached is not None:
            return cached
        meta = await self._keyring_meta()
        secret = await self._unwrap(wrapped, self._context(meta.id, key_id, wrapped.version),
                                    f"data key {key_id} version {wrapped.version}")
        key = DataKey(key_id, wrapped.version, secret)
        self._keys[(key_id, wrapped.version)] = key
        return key

    async def _new_version(self, key_id: str, version: int) -> tuple[DataKey, _Wrapped]:
        provider = self._need_provider(f"make data key {key_id}")
        meta = await self._keyring_meta()
        secret = os.urandom(32)
        wrapped = await _wrap(provider, secret, self._context(meta.id, key_id, version),
                              f"data key {key_id} version {version}")
        return DataKey(key_id, version, secret), _Wrapped(
            version=version, kek=provider.key_id, wrapped=wrapped, created=_now())

    async def writing_key(self, key_id: str) -> DataKey:
        """The newest version of data key ``key_id``, made if there is none yet."""
        for _ in range(100):
            found = self._read_key(key_id)
            if found is not None and found.versions:
                return await self._open_version(key_id, max(found.versions,
                                                            key=lambda v: v.version))
            if found is None:
                key, wrapped = await self._new_version(key_id, 1)
                made = _KeyFile(key=key_id, versions=(wrapped,))
                if await asyncio.to_thread(_write_new, self._key_path(key_id), _encode(made)):
                    self._keys[(key_id, 1)] = key
                    return key
                continue  # another process made it first: use theirs
            # Erased: entries written from now on get a new version.
            async with self._changing():
                found = self._read_key(key_id, fresh=True)
                if found is not None and not found.versions:
                    key, wrapped = await self._new_version(key_id, found.next_version())
                    await asyncio.to_thread(_replace, self._key_path(key_id), _encode(
                        msgspec.structs.replace(found, versions=(wrapped,))))
                    self._keys[(key_id, key.version)] = key
                    return key
        raise PrivacyError(f"data key {key_id} in {self.path} kept changing while it was made")

    async def reading_keys(
        self, wanted: set[tuple[str, int]]
    ) -> dict[tuple[str, int], DataKey | _Erased | KeyUnavailable]:
        """For each (key id, version): its data key, ``ERASED``, or why it cannot be had."""
        out: dict[tuple[str, int], DataKey | _Erased | KeyUnavailable] = {}
        for key_id, version in wanted:
            try:
                out[(key_id, version)] = await self._reading_key(key_id, version)
            except KeyUnavailable as exc:
                out[(key_id, version)] = exc
        return out

    async def data_keys(self, key_id: str) -> list[DataKey]:
        """Every version of ``key_id`` the keyring still holds, newest first ([] if erased)."""
        found = self._read_key(key_id)
        if found is None:
            return []
        return [await self._open_version(key_id, w)
                for w in sorted(found.versions, key=lambda v: v.version, reverse=True)]

    async def _reading_key(self, key_id: str, version: int) -> DataKey | _Erased:
        meta = self._meta or self._read_meta()  # a read never starts a keyring
        found = self._read_key(key_id) if meta is not None else None
        if found is None:
            raise KeyUnavailable(f"data key {key_id} is not in the keyring at {self.path} "
                                 f"(another keyring? this one has id "
                                 f"{meta.id if meta else 'none'})")
        for wrapped in found.versions:
            if wrapped.version == version:
                return await self._open_version(key_id, wrapped)
        if version < found.erased_below:
            return ERASED
        raise KeyUnavailable(f"data key {key_id} has no version {version} in the keyring at "
                             f"{self.path}")

    # -- sessions -------------------------------------------------------------------------

    async def _session_path(self, session_id: str) -> Path:
        digest = hmac.digest(await self._index_key(),
                             b"session\x00" + session_id.encode("utf-8"), "sha256")
        name = _name(digest)
        return self.path / "sessions" / name[:2] / f"{name}.json"

    async def session_key(self, session_id: str) -> str | None:
        """The data key id ``session_id`` is sealed with, if the keyring has one for it."""
        path = await self._session_path(session_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PrivacyError(f"cannot read {path}: {exc}") from exc
        try:
            binding = _binding_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise PrivacyError(f"the session key file {path} is damaged: {exc}") from exc
        if binding.session != session_id:
            raise PrivacyError(f"the session key file {path} is for session "
                               f"{binding.session!r}, not {session_id!r}")
        return binding.key

    async def bind_session(self, session_id: str, key_id: str) -> str:
        """Seal ``session_id`` with ``key_id`` from now on, unless it has a key already.

        The key a session was first given stays its key, in every store that
        holds a copy of it. Returns the session's key.
        """
        path = await self._session_path(session_id)
        binding = _encode(_Binding(session=session_id, key=key_id))
        if await asyncio.to_thread(_write_new, path, binding):
            return key_id
        have = await self.session_key(session_id)
        assert have is not None
        return have

    async def sessions_of(self, key_id: str) -> list[str]:
        """The sessions the keyring seals with ``key_id``."""
        found: list[str] = []
        for path in _files(self.path / "sessions"):
            try:
                binding = _binding_decoder.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError):
                continue  # a session file being written right now
            if binding.key == key_id:
                found.append(binding.session)
        return sorted(found)

    # -- changes: erasure, a new version, rewrapping -------------------------------------

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        # One descriptor per change: flock then orders tasks of this process
        # as it orders processes, whatever thread or event loop they run on.
        fd = await asyncio.to_thread(_flock, self.path / ".lock")
        try:
            yield
        finally:
            os.close(fd)

    async def erase_subject(self, subject: str) -> KeyErasure:
        """Destroy every data key of ``subject``: what it sealed can no longer be opened.

        The key file becomes a tombstone (so its entries read as erased, not
        as locked); entries the subject writes later get a new version.
        """
        key_id = await self.key_id(subject)
        async with self._changing():
            found = self._read_key(key_id, fresh=True)
            if found is None:
                return KeyErasure(subject, key_id, 0)
            tomb = _KeyFile(key=key_id, erased_below=found.next_version(), erased_at=_now())
            path = self._key_path(key_id)
            await asyncio.to_thread(_replace, path, _encode(tomb))
            # A copy a killed writer left behind would still hold the key.
            for stray in path.parent.glob(f".{key_id}.*.tmp"):
                stray.unlink(missing_ok=True)
            await asyncio.to_thread(_fsync_dir, path.parent)
        for cached in [k for k in self._keys if k[0] == key_id]:
            del self._keys[cached]
        return KeyErasure(subject, key_id, len(found.versions))

    async def rotate_subject(self, subject: str) -> int:
        """Give ``subject`` a new data key version for what it writes from now on; its number.

        Older versions stay, so what they sealed still opens.
        """
        key_id = await self.key_id(subject)
        async with self._changing():
            found = self._read_key(key_id, fresh=True) or _KeyFile(key=key_id)
            key, wrapped = await self._new_version(key_id, found.next_version())
            await asyncio.to_thread(_replace, self._key_path(key_id), _encode(
                msgspec.structs.replace(found, versions=(*found.versions, wrapped))))
        self._keys[(key_id, key.version)] = key
        return key.version

    async def rewrap(self) -> Rewrapped:
        """Wrap every data key (and the index key) with ``provider``'s key-encryption key.

        Keys under another key-encryption key are unwrapped with the matching
        ``previous`` provider. Only the keyring changes, never a store. Safe to
        run again after an interruption; once it has run, the earlier
        key-encryption keys are no longer needed.
        """
        provider = self._need_provider("rewrap")
        files = versions = unchanged = 0
        async with self._changing():
            meta = await self._keyring_meta()
            if meta.index.kek != provider.key_id:
                context = self._context(meta.id, "index", 1)
                secret = await self._unwrap(meta.index, context, "the keyring's index key")
                index = msgspec.structs.replace(meta.index, kek=provider.key_id,
                                                wrapped=await _wrap(provider, secret, context,
                                                                    "the keyring's index key"))
                meta = msgspec.structs.replace(meta, index=index)
                await asyncio.to_thread(_replace, self.path / "keyring.json", _encode(meta))
                self._meta = meta
                files, versions = files + 1, versions + 1
            else:
                unchanged += 1
            for path in _files(self.path / "keys"):
                found = self._read_key(path.stem, fresh=True)
                if found is None:
                    continue
                new: list[_Wrapped] = []
                for wrapped in found.versions:
                    if wrapped.kek == provider.key_id:
                        new.append(wrapped)
                        unchanged += 1
                        continue
                    context = self._context(meta.id, found.key, wrapped.version)
                    secret = await self._unwrap(wrapped, context,
                                                f"data key {found.key} version {wrapped.version}")
                    new.append(msgspec.structs.replace(
                        wrapped, kek=provider.key_id,
                        wrapped=await _wrap(provider, secret, context,
                                            f"data key {found.key} version {wrapped.version}")))
                    versions += 1
                if new != list(found.versions):
                    await asyncio.to_thread(_replace, path, _encode(
                        msgspec.structs.replace(found, versions=tuple(new))))
                    files += 1
        return Rewrapped(files=files, versions=versions, unchanged=unchanged)

    def key_ids(self) -> Iterator[str]:
        """Every data key id the keyring holds a file for (erased ones included)."""
        for path in _files(self.path / "keys"):
            yield path.stem


async def _wrap(provider: KeyProvider, secret: bytes, context: bytes, what: str) -> bytes:
    try:
        return await provider.wrap(secret, context)
    except KeyUnavailable:
        raise
    except Exception as exc:
        raise KeyUnavailable(f"key provider {provider.key_id} could not wrap {what}: "
                             f"{type(exc).__name__}: {exc}") from exc


def _files(root: Path) -> list[Path]:
    """The ``*.json`` files one folder below ``root`` (temporary files left out)."""
    if not root.is_dir():
        return []
    return sorted(p for d in root.iterdir() if d.is_dir() for p in d.glob("[!.]*.json"))


def _flock(path: Path) -> int:
    try:
        import fcntl
    except ImportError as exc:
        raise ConfigError(f"changing the keyring at {path.parent} needs file locks "
                          f"(fcntl), which this platform lacks") from exc
    _ensure_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _now() -> datetime:
    return datetime.now(UTC)
