"""Key-encryption keys: the ``KeyProvider`` protocol and the local provider that ships.

A provider holds the key-encryption key (KEK) and does two things with it:
wrap a data key for the keyring, and unwrap it again. A KMS or Vault adapter
implements the same three members by calling its service; the KEK never
leaves it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from threadline.errors import ConfigError, KeyUnavailable, missing_extra

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("privacy", "threadline.privacy", exc) from exc

__all__ = ["KeyProvider", "LocalKeyProvider"]

_WRAP_LABEL = b"threadline key wrap\x00"


@runtime_checkable
class KeyProvider(Protocol):
    """Wraps and unwraps data keys with a key-encryption key it holds.

    ``key_id`` names the key-encryption key (never the key itself): the
    keyring stores it beside each wrapped data key, so after a rotation it
    knows which provider unwraps which key. ``context`` names the data key
    being wrapped; ``unwrap`` must refuse a wrapped key with another context
    (pass it as the AEAD's additional data, or as a KMS encryption context).
    Any exception ``unwrap`` raises is reported as ``KeyUnavailable``.
    """

    @property
    def key_id(self) -> str: ...

    async def wrap(self, key: bytes, context: bytes) -> bytes: ...

    async def unwrap(self, wrapped: bytes, context: bytes) -> bytes: ...


class LocalKeyProvider:
    """A key-encryption key held by this process: from a file, an environment variable or bytes.

    The key is 32 random bytes, written as base64 (``generate()`` makes
    one). Data keys are wrapped with AES-256-GCM under it, each with a fresh
    random nonce and its context as additional data.
    """

    def __init__(self, key: bytes, *, source: str = "the given key") -> None:
        if not isinstance(key, bytes) or len(key) != 32:
            raise ConfigError(f"{source}: a key-encryption key is 32 bytes, got "
                              f"{len(key) if isinstance(key, bytes) else type(key).__name__}")
        self._aead = AESGCM(key)
        self._source = source
        digest = hmac.digest(key, b"threadline key id", "sha256")
        self._key_id = "local:" + digest[:8].hex()

    @staticmethod
    def generate() -> str:
        """A new random key-encryption key, as the base64 text a key file holds."""
        return base64.b64encode(AESGCM.generate_key(256)).decode("ascii")

    @classmethod
    def from_text(cls, text: str, *, source: str = "the given key") -> LocalKeyProvider:
        """A key written as base64 (surrounding whitespace ignored)."""
        try:
            key = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{source}: a key-encryption key is 32 bytes written as base64 "
                              f"(threadline keys generate makes one)") from exc
        return cls(key, source=source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LocalKeyProvider:
        """The key in a file (keep it readable by its owner only: ``chmod 600``)."""
        try:
            text = Path(path).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the key file {os.fspath(path)}: {exc}") from exc
        return cls.from_text(text, source=f"key file {os.fspath(path)}")

    @classmethod
    def from_env(cls, name: str = "THREADLINE_KEY") -> LocalKeyProvider:
        """The key in environment variable ``name``."""
        text = os.environ.get(name)
        if not text:
            raise ConfigError(f"environment variable {name} holds no key-encryption key")
        return cls.from_text(text, source=f"environment variable {name}")

    @property
    def key_id(self) -> str:
        return self._key_id

    async def wrap(self, key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, key, _WRAP_LABEL + context)

    async def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], _WRAP_LABEL + context)
        except InvalidTag as exc:
            raise KeyUnavailable(f"the key-encryption key of {self._source} ({self._key_id}) "
                                 f"does not unwrap this data key: it was wrapped by another "
                                 f"key, or changed") from exc

    def __repr__(self) -> str:
        return f"LocalKeyProvider({self._key_id}, from {self._source})"
