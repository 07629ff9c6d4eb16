"""Sealing one entry (or blob) under a data key, and opening it again.

Pure: entries and bytes in, entries and bytes out; the keyring finds the keys.

An entry's envelope (``SealedEntry.env``), in bytes::

    0       envelope format (1)
    1       cipher (1: AES-256-GCM)
    2       flags: how the plaintext is the entry's line (bits 0-1), deflated (bit 2)
    3-6     data key version, big-endian
    7-18    nonce
    19-     ciphertext, then the 16-byte tag

The additional data binds the ciphertext to where it belongs: those first
seven bytes, and the session id, entry id, type, custom kind, timestamp,
origin id and key id. So a row moved to another session or entry, or a
header changed in place, does not open. The parent id is not bound: a
linear append re-parents the first entry of its batch in the store.

The nonce is synthetic: an HMAC, under a key derived from the data key, of
the additional data and the plaintext. The same entry sealed twice gives the
same bytes, which is what lets a store recognise a retried append, and
two different plaintexts get the same nonce only as often as two random
96-bit nonces collide.

The plaintext is the entry's stored line without the part the header
already says (its type, ids and time), deflated when that makes it shorter.
"""

from __future__ import annotations

import hmac
import os
import zlib
from typing import Any

import msgspec

from threadline.errors import CorruptLog, MalformedEnvelope, missing_extra
from threadline.session._codec import decode_compact_body, decode_entry
from threadline.session._entries import (
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
)
from threadline.stores._contract import chain_after
from threadline.stores._rules import entry_type

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("privacy", "threadline.privacy", exc) from exc

__all__ = [
    "CIPHER",
    "DataKey",
    "blob_key",
    "blob_version",
    "envelope_version",
    "open_blob",
    "open_entry",
    "seal_blob",
    "seal_entry",
]

CIPHER = "AES-256-GCM"
_FORMAT = 1
_AES_256_GCM = 1
_HEADER = 7
_NONCE = 12
_TAG = 16
_WHOLE, _BODY, _COMPACT_BODY = 0, 1, 2
_DEFLATED = 4
# Shorter plaintexts rarely shrink, and deflating them costs more than it saves.
_DEFLATE_FROM = 64
# Below this size deflate uses its fixed codes: a little longer than codes
# fitted to the text, but with no code table to store or, more to the point,
# to rebuild on every load (which took more than the rest of opening an entry).
_FITTED_CODES_FROM = 4096

_ENTRY_LABEL = b"threadline entry\x00"
_BLOB_LABEL = b"threadline blob\x00"
_encode = msgspec.json.encode


def _derive(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


class DataKey:
    """One version of a subject's data key, with the keys derived from it.

    The data key itself is kept only long enough to derive them: one for the
    cipher, one for nonces, one for blob addresses, so no key serves two
    purposes.
    """

    __slots__ = ("_address", "_aead", "_nonce", "key_id", "version")

    def __init__(self, key_id: str, version: int, secret: bytes) -> None:
        self.key_id = key_id
        self.version = version
        self._aead = AESGCM(_derive(secret, b"threadline aead key"))
        self._nonce = _derive(secret, b"threadline nonce key")
        self._address = _derive(secret, b"threadline blob address")

    def __repr__(self) -> str:
        return f"DataKey({self.key_id!r}, version {self.version})"


def _head(form: int, entry: Any, of: str) -> bytes:
    """The start of an entry's line that its sealed header says again."""
    if form == _COMPACT_BODY:
        return (b"[" + _encode(entry.id) + b"," + _encode(entry.parent_id) + b","
                + _encode(entry.timestamp) + b",")
    head = b'{"type":' + _encode(of) + b',"id":' + _encode(entry.id)
    if entry.parent_id is not None:
        head += b',"parent_id":' + _encode(entry.parent_id)
    head += b',"timestamp":' + _encode(entry.timestamp)
    if entry.origin_id is not None:
        head += b',"origin_id":' + _encode(entry.origin_id)
    return head + b","


def _additional(header: bytes, session_id: str, sealed: Any) -> bytes:
    return _ENTRY_LABEL + header + _encode(
        (session_id, sealed.id, sealed.of, sealed.kind, sealed.timestamp, sealed.origin_id,
         sealed.key))


def _nonce(key: DataKey, additional: bytes, plaintext: bytes) -> bytes:
    framed = len(additional).to_bytes(4, "big") + additional + plaintext
    return hmac.digest(key._nonce, framed, "sha256")[:_NONCE]


def _deflate(plaintext: bytes) -> bytes:
    if len(plaintext) >= _FITTED_CODES_FROM:
        packer = zlib.compressobj(1, zlib.DEFLATED, -15)
    else:
        # Fixed codes, and a window and match table no bigger than the
        # plaintext needs: less for zlib to set up for each entry.
        packer = zlib.compressobj(1, zlib.DEFLATED, -12, 4, zlib.Z_FIXED)
    return packer.compress(plaintext) + packer.flush()


class _Header:
    """The header of the entry being sealed, as the additional data reads it."""

    __slots__ = ("id", "key", "kind", "of", "origin_id", "timestamp")

    def __init__(self, entry: Any, of: str, kind: str | None, key: str) -> None:
        self.id, self.of, self.kind, self.key = entry.id, of, kind, key
        self.timestamp = entry.timestamp
        self.origin_id = None if isinstance(entry, OpaqueEntry) else entry.origin_id


def seal_entry(entry: Entry, line: bytes, compact: bytes, session_id: str, key: DataKey, *,
               deflate: bool = True) -> SealedEntry:
    """``entry`` sealed for ``session_id``.

    ``entry`` is the form ``check_entry`` gave back, ``line`` its line and
    ``compact`` what ``compact_checked`` makes of the two.
    """
    of = entry_type(entry)
    kind = entry.kind if isinstance(entry, (CustomEntry, CustomMessageEntry)) else None
    header = _Header(entry, of, kind, key.key_id)
    form, plaintext = _WHOLE, line
    if not isinstance(entry, OpaqueEntry):
        # The compact line is what a file store writes for a plain message entry.
        if type(entry) is MessageEntry and entry.origin_id is None:
            form, head, whole = _COMPACT_BODY, _head(_COMPACT_BODY, entry, of), compact
        else:
            form, head, whole = _BODY, _head(_BODY, entry, of), line
        # A compact line's closing bracket is left out too.
        end = len(whole) - (form == _COMPACT_BODY)
        if whole.startswith(head) and end > len(head):
            plaintext = whole[len(head):end]
        else:
            form = _WHOLE
    flags = form
    if deflate and len(plaintext) >= _DEFLATE_FROM:
        packed = _deflate(plaintext)
        if len(packed) < len(plaintext):
            plaintext, flags = packed, flags | _DEFLATED
    env_header = bytes((_FORMAT, _AES_256_GCM, flags)) + key.version.to_bytes(4, "big")
    additional = _additional(env_header, session_id, header)
    nonce = _nonce(key, additional, plaintext)
    return SealedEntry(id=entry.id, parent_id=entry.parent_id, timestamp=entry.timestamp,
                       origin_id=header.origin_id, of=of, kind=kind, key=key.key_id,
                       env=env_header + nonce + key._aead.encrypt(nonce, plaintext, additional))


def _malformed(sealed: SealedEntry, session_id: str, problem: str) -> MalformedEnvelope:
    return MalformedEnvelope(f"the sealed {sealed.of} entry {problem}", session_id=session_id,
                             entry_id=sealed.id)


def envelope_version(sealed: SealedEntry, session_id: str) -> int:
    """The data key version ``sealed`` names. Raises ``MalformedEnvelope``."""
    env = sealed.env
    if len(env) < _HEADER + _NONCE + _TAG:
        raise _malformed(sealed, session_id, f"has an envelope of {len(env)} bytes, too short "
                                             "to hold one")
    if env[0] != _FORMAT:
        raise _malformed(sealed, session_id, f"has an envelope of format {env[0]}, which this "
                                             "version does not know (upgrade threadline?)")
    if env[1] != _AES_256_GCM:
        raise _malformed(sealed, session_id, f"names cipher {env[1]}, which this version does "
                                             "not know (upgrade threadline?)")
    if env[2] & ~(_DEFLATED | 3) or env[2] & 3 > _COMPACT_BODY:
        raise _malformed(sealed, session_id, f"has envelope flags {env[2]:#04x} this version "
                                             "does not know")
    return int.from_bytes(env[3:_HEADER], "big")


def open_entry(sealed: SealedEntry, session_id: str, key: DataKey) -> Entry:
    """The entry ``sealed`` holds. Raises ``MalformedEnvelope`` naming session and entry.

    ``key`` is the version ``envelope_version`` named. The entry keeps the
    parent its sealed header has now.
    """
    # Runs for every entry of every load: the common form (a compact message
    # body) is decoded without a line around it.
    env = sealed.env
    flags = env[2]
    additional = _additional(env[:_HEADER], session_id, sealed)
    try:
        plaintext = key._aead.decrypt(env[_HEADER:_HEADER + _NONCE], env[_HEADER + _NONCE:],
                                      additional)
    except InvalidTag as exc:
        raise _malformed(sealed, session_id, "does not authenticate: its ciphertext or header "
                                             "was changed, or it was moved here from another "
                                             "session or entry") from exc
    if flags & _DEFLATED:
        try:
            # Most entries inflate to a few times their size: a first buffer
            # of that size, not zlib's 16 KiB, saves most of the call.
            plaintext = zlib.decompress(plaintext, -15, 4 * len(plaintext) + 64)
        except zlib.error as exc:
            raise _malformed(sealed, session_id, f"does not inflate: {exc}") from exc
    form = flags & 3
    try:
        if form == _COMPACT_BODY:
            # Sealed from a compact line of a message entry: the body decodes
            # on its own, the header is the sealed entry's (and authenticated).
            return decode_compact_body(plaintext, id=sealed.id, parent_id=sealed.parent_id,
                                       timestamp=sealed.timestamp,  # type: ignore[arg-type]
                                       session_id=session_id)
        line = plaintext if form == _WHOLE else _head(form, sealed, sealed.of) + plaintext
        entry = decode_entry(line, session_id=session_id)
    except CorruptLog as exc:
        raise _malformed(sealed, session_id, f"opens to something that is not an entry: "
                                             f"{exc.detail}") from exc
    if entry.id != sealed.id or entry_type(entry) != sealed.of:
        raise _malformed(sealed, session_id, f"opens to entry {entry.id!r} of type "
                                             f"{entry_type(entry)!r}, not what its header says")
    if form == _WHOLE and entry.parent_id != sealed.parent_id:
        entry = chain_after([entry], sealed.parent_id)[0]
    return entry


# -- blobs ------------------------------------------------------------------------
#
# A blob's storage key is "s" + HMAC-SHA256(address key, its SHA-256)[:64 hex]:
# one subject's same file is stored once, two subjects never share a stored
# blob, and the key says nothing about the content without the subject's key.
# The stored bytes are the envelope header (format, cipher, flags, version),
# the key id (one byte of length, then ASCII), the nonce and the ciphertext;
# the additional data is that header, the storage key and the media type.


def blob_key(key: DataKey, sha256: str) -> str:
    """Where a blob of ``key``'s subject with this plaintext SHA-256 (hex) is stored."""
    return "s" + hmac.digest(key._address, bytes.fromhex(sha256), "sha256").hex()[:64]


def _blob_additional(header: bytes, storage_key: str, media_type: str) -> bytes:
    return _BLOB_LABEL + header + _encode((storage_key, media_type))


def seal_blob(key: DataKey, storage_key: str, media_type: str, data: bytes) -> bytes:
    """The bytes to store for blob ``data`` under ``storage_key``."""
    kid = key.key_id.encode("ascii")
    header = (bytes((_FORMAT, _AES_256_GCM, 0)) + key.version.to_bytes(4, "big")
              + bytes((len(kid),)) + kid)
    nonce = os.urandom(_NONCE)  # a blob is stored once per key, so nothing needs it fixed
    return header + nonce + key._aead.encrypt(
        nonce, data, _blob_additional(header, storage_key, media_type))


def blob_version(stored: bytes, storage_key: str) -> tuple[str, int]:
    """The key id and version a stored blob names. Raises ``MalformedEnvelope``."""
    def bad(problem: str) -> MalformedEnvelope:
        return MalformedEnvelope(f"blob {storage_key!r} {problem}")

    if len(stored) < _HEADER + 1 or stored[0] != _FORMAT or stored[1] != _AES_256_GCM:
        raise bad("does not start with an envelope this version knows")
    end = _HEADER + 1 + stored[_HEADER]
    if len(stored) < end + _NONCE + _TAG:
        raise bad("is too short to hold its envelope")
    return stored[_HEADER + 1:end].decode("ascii", "replace"), int.from_bytes(
        stored[3:_HEADER], "big")


def open_blob(key: DataKey, storage_key: str, media_type: str, stored: bytes) -> bytes:
    """The plaintext of a blob ``seal_blob`` made. Raises ``MalformedEnvelope``."""
    end = _HEADER + 1 + stored[_HEADER]
    try:
        return key._aead.decrypt(stored[end:end + _NONCE], stored[end + _NONCE:],
                                 _blob_additional(stored[:end], storage_key, media_type))
    except InvalidTag as exc:
        raise MalformedEnvelope(f"blob {storage_key!r} does not authenticate: it was changed, "
                                f"stored under another key, or opened with another media "
                                f"type than it was stored with") from exc
