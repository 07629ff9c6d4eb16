"""Session metadata: a title, an owner, a tenant and free labels, kept in the log.

Metadata is never written in place. Each change is a custom entry of kind
``threadline.metadata`` holding a ``MetadataChange``: the fields it sets,
each left out when unchanged. A session's metadata is the fold of every
change in the log in append order, whichever branch each sits on, so the
last change appended wins and moving the leaf to another branch never
changes a title. History keeps every value a session ever had.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from threadline.errors import ConfigError
from threadline.session._entries import CustomEntry, Entry, register_custom

__all__ = [
    "METADATA_KIND",
    "MetadataChange",
    "SessionMetadata",
    "fold_metadata",
    "merge_changes",
    "metadata_change",
    "newest_timestamp",
]

METADATA_KIND = "threadline.metadata"

MAX_METADATA_CHARS = 4096
"""Longest title, owner, tenant, label name or label value, in characters."""


class MetadataChange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One change to a session's metadata, as stored in a ``threadline.metadata`` entry.

    A field left ``UNSET`` keeps its value; ``None`` clears it. ``labels``
    maps a label name to its new value, or to ``None`` to remove it; labels
    not named keep theirs.
    """

    title: str | UnsetType | None = UNSET
    owner: str | UnsetType | None = UNSET
    tenant: str | UnsetType | None = UNSET
    labels: dict[str, str | None] = {}


class SessionMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """A session's metadata now: every change in its log applied in append order."""

    title: str | None = None
    owner: str | None = None
    tenant: str | None = None
    labels: dict[str, str] = {}

    def apply(self, change: MetadataChange) -> SessionMetadata:
        labels = dict(self.labels)
        for name, value in change.labels.items():
            if value is None:
                labels.pop(name, None)
            else:
                labels[name] = value
        return SessionMetadata(
            title=self.title if change.title is UNSET else change.title,
            owner=self.owner if change.owner is UNSET else change.owner,
            tenant=self.tenant if change.tenant is UNSET else change.tenant,
            labels=labels,
        )


register_custom(METADATA_KIND, MetadataChange)


def _text(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"session metadata: {what} must be a string, got "
                          f"{type(value).__name__}")
    if "\x00" in value:
        raise ConfigError(f"session metadata: {what} contains NUL, which no store can keep")
    if len(value) > MAX_METADATA_CHARS:
        raise ConfigError(f"session metadata: {what} is {len(value)} characters; the limit "
                          f"is {MAX_METADATA_CHARS}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"session metadata: {what} is not valid Unicode text (it holds a "
                          f"lone surrogate)") from exc


def metadata_change(
    *, title: str | UnsetType | None = UNSET, owner: str | UnsetType | None = UNSET,
    tenant: str | UnsetType | None = UNSET, labels: Mapping[str, str | None] | None = None,
) -> MetadataChange:
    """A checked ``MetadataChange``: ``ConfigError`` for anything no store could keep.

    Owner, tenant and label names are non-empty when set; every value is
    text without NUL, at most ``MAX_METADATA_CHARS`` characters.
    """
    for what, value in (("title", title), ("owner", owner), ("tenant", tenant)):
        if value is not UNSET and value is not None:
            _text(value, what)
            if what != "title" and not value:
                raise ConfigError(f"session metadata: {what} must not be empty (pass None "
                                  f"to clear it)")
    out: dict[str, str | None] = {}
    if labels is not None:
        if not isinstance(labels, Mapping):
            raise ConfigError(f"session metadata: labels must be a mapping of name to value, "
                              f"got {type(labels).__name__}")
        for name, value in labels.items():
            _text(name, "a label name")
            if not name:
                raise ConfigError("session metadata: a label name must not be empty")
            if value is not None:
                _text(value, f"label {name!r}")
            out[name] = value
    return MetadataChange(title=title, owner=owner, tenant=tenant, labels=out)


def is_change(entry: Entry) -> bool:
    return (type(entry) is CustomEntry and entry.kind == METADATA_KIND
            and isinstance(entry.data, MetadataChange))


def fold_metadata(entries: Iterable[Entry],
                  start: SessionMetadata | None = None) -> SessionMetadata:
    """The metadata after ``entries`` (in append order), from ``start`` (none set)."""
    meta = SessionMetadata() if start is None else start
    for entry in entries:
        if is_change(entry):
            meta = meta.apply(entry.data)  # type: ignore[union-attr]
    return meta


def merge_changes(entries: Iterable[Entry]) -> MetadataChange | None:
    """The changes among ``entries`` as one (later ones win), or None if there are none."""
    merged: MetadataChange | None = None
    for entry in entries:
        if not is_change(entry):
            continue
        change: MetadataChange = entry.data  # type: ignore[union-attr]
        if merged is None:
            merged = change
            continue
        fields: dict[str, Any] = {}
        for name in ("title", "owner", "tenant"):
            value = getattr(change, name)
            fields[name] = getattr(merged, name) if value is UNSET else value
        merged = MetadataChange(**fields, labels={**merged.labels, **change.labels})
    return merged


def newest_timestamp(entries: Iterable[Entry]) -> datetime | None:
    """The latest ``timestamp`` among ``entries`` (None if none has one)."""
    newest: datetime | None = None
    for entry in entries:
        ts = entry.timestamp
        if ts is None:
            continue
        if ts.tzinfo is None:  # the codec reads a naive time as UTC
            ts = ts.replace(tzinfo=UTC)
        if newest is None or ts > newest:
            newest = ts
    return newest
