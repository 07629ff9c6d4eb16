"""Session record, entry types and the custom-entry registry.

An entry is one line of a session's log. Every entry has a header: ``type``
(the discriminator), ``id`` (time-ordered, globally unique), ``parent_id``
(the entry it follows; ``None`` for a root) and ``timestamp``. The parent
pointers make the log a tree; the order of lines is the append order.

Schema rules: a new field always has a default; a field's type never changes;
an entry ``type`` this version does not know is kept as an ``OpaqueEntry`` and
written back unchanged; a custom ``kind`` nobody registered keeps its payload
as raw JSON bytes; a stored line this version would not write byte for byte
(unknown fields, another timestamp spelling) is written back as it was read.
``FORMAT_VERSION`` sits in every ``session_init`` line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeAlias, TypeVar

import msgspec

from threadline.ai._messages import Message, UserContent
from threadline.errors import ConfigError
from threadline.session._ids import new_id

__all__ = [
    "FORMAT_VERSION",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "ErasedEntry",
    "MessageEntry",
    "OpaqueEntry",
    "SealedEntry",
    "SessionRecord",
    "custom_kinds",
    "register_custom",
    "utcnow",
]

FORMAT_VERSION = 3

T = TypeVar("T")


# The time now, in UTC. A partial rather than a function: it runs for every
# entry, and calls straight into C.
utcnow: Callable[[], datetime] = functools.partial(datetime.now, UTC)


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Existence and fork lineage of a session. Written once, never updated.

    It deliberately has no title, mode or model: a title, owner, tenant and
    labels are metadata entries in the log (``session/_metadata.py``).
    """

    id: str
    parent_id: str | None = None
    created_at: datetime = msgspec.field(default_factory=utcnow)


# A stored id is never empty: decoding refuses one (the codec checks the
# rest, and checks entries built in code before a store writes them).
_Id: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]


class _Header(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False,
              tag_field="type"):
    id: _Id = msgspec.field(default_factory=new_id)
    parent_id: _Id | None = None
    timestamp: datetime = msgspec.field(default_factory=utcnow)
    origin_id: str | None = None
    """For an entry copied by fork: the id of the source entry it copies."""


class MessageEntry(_Header, frozen=True, kw_only=True, tag="message"):
    message: Message


class CompactionEntry(_Header, frozen=True, kw_only=True, tag="compaction"):
    """Folds the path before ``first_kept_entry_id`` into ``summary``."""

    summary: str
    first_kept_entry_id: str
    tokens_before: int = 0
    details: Any = None


class BranchSummaryEntry(_Header, frozen=True, kw_only=True, tag="branch_summary"):
    """Summary of a branch the conversation left (``from_id`` was its leaf)."""

    from_id: str
    summary: str
    details: Any = None


class CustomEntry(_Header, Generic[T], frozen=True, kw_only=True, tag="custom"):
    """Application state stored in the log; never sent to a model.

    ``data`` is an instance of the class registered for ``kind``; for a kind
    nobody registered it is the raw JSON (``msgspec.Raw``), written back
    byte for byte.
    """

    kind: str
    data: T


class CustomMessageEntry(_Header, frozen=True, kw_only=True, tag="custom_message"):
    """Application content the model does see (as user-visible context)."""

    kind: str
    content: tuple[UserContent, ...]
    display: bool = True
    details: Any = None


class SealedEntry(_Header, frozen=True, kw_only=True, tag="sealed"):
    """An entry whose content is encrypted (``threadline.privacy``).

    The header stays readable, so the tree, listing and retention work
    without keys: ``id``, ``parent_id``, ``timestamp``, ``origin_id``, the
    sealed entry's own type (``of``), a custom entry's ``kind``, the storage
    keys of the blobs it references (``blobs``) and the id of the data key
    that sealed it (``key``). ``env`` is the envelope: format, cipher, key
    version and nonce, then the ciphertext. A store keeps it like any entry;
    the encryption layer opens it, and gives a ``SealedEntry`` back as itself
    only when it cannot (a locked or malformed entry, reported in the load's
    diagnostics).
    """

    # Optional, unlike other entries' (so mypy is told): an entry of a type
    # this version does not know may have carried no time to keep.
    timestamp: datetime | None = None  # type: ignore[assignment]
    """The sealed entry's own time; None only for an entry of a type this
    version does not know that carried none."""
    of: str = "message"
    kind: str | None = None
    blobs: tuple[str, ...] = ()
    key: str
    env: bytes


class ErasedEntry(_Header, frozen=True, kw_only=True, tag="erased"):
    """A sealed entry whose data key was destroyed: its place in the tree, no content.

    The encryption layer returns it for every entry of an erased subject
    (same ``id``, ``parent_id``, ``timestamp`` and ``of``/``kind``). Context
    building skips it. A fork or copy of an erased entry stores this stub,
    which holds nothing to erase.
    """

    timestamp: datetime | None = None  # type: ignore[assignment]  # as SealedEntry's
    of: str = "message"
    kind: str | None = None


class OpaqueEntry:
    """An entry whose ``type`` this version does not know.

    Kept so a newer writer's entries survive an older reader: it has a place in
    the tree (``id``, ``parent_id``) and re-encodes to exactly the bytes it was
    read from.
    """

    __slots__ = ("id", "parent_id", "raw", "timestamp", "type")

    def __init__(
        self, *, type: str, id: str, parent_id: str | None, timestamp: datetime | None,
        raw: bytes,
    ) -> None:
        self.type = type
        self.id = id
        self.parent_id = parent_id
        self.timestamp = timestamp
        self.raw = raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueEntry) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"OpaqueEntry(type={self.type!r}, id={self.id!r}, parent_id={self.parent_id!r})"


Entry: TypeAlias = (
    MessageEntry | CompactionEntry | BranchSummaryEntry | CustomEntry[Any]
    | CustomMessageEntry | SealedEntry | ErasedEntry | OpaqueEntry
)

_CUSTOM: dict[str, type[Any]] = {}


def register_custom(kind: str, cls: type[Any]) -> None:
    """Decode custom entries of ``kind`` into ``cls`` from now on.

    ``cls`` is anything msgspec can decode into: a ``msgspec.Struct``, a
    dataclass, a ``TypedDict``, ... Call it once at import time. Registering
    the same class again is a no-op; a different class for a taken kind is an
    error, because entries already stored would change meaning.
    """
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"custom entry kind must be a non-empty string, got {kind!r}")
    existing = _CUSTOM.get(kind)
    if existing is not None and existing is not cls:
        raise ConfigError(
            f"custom entry kind {kind!r} is already registered to {existing.__qualname__}"
        )
    _CUSTOM[kind] = cls


def custom_kinds() -> dict[str, type[Any]]:
    """A copy of the registry: kind -> class."""
    return dict(_CUSTOM)


def registered(kind: str) -> type[Any] | None:
    return _CUSTOM.get(kind)
