"""Inline images moved out of entries into blobs, the entries keeping their ids.

Sessions written before blobs, and what other tools export, hold images as
base64 inside the entry. ``move_inline`` stores each such image with
``stores.attach`` (so its bytes are durable first) and returns the entries
with a ``BlobPart`` in its place: same ids, same parents, same everything
else. An image that cannot move (not valid base64, over the size limit, a
media type that is not one) stays inline, which every reader still takes.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from collections.abc import Sequence

import msgspec

from threadline.ai._messages import (
    BlobPart,
    ImagePart,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from threadline.errors import BlobTooLarge, ConfigError
from threadline.session._entries import CustomMessageEntry, Entry, MessageEntry
from threadline.stores._blobs import DEFAULT_MAX_BLOB, attach
from threadline.stores._contract import Store

__all__ = ["move_inline"]


async def move_inline(store: Store, session_id: str, entries: Sequence[Entry], *,
                      max_size: int = DEFAULT_MAX_BLOB) -> tuple[list[Entry], int]:
    """``entries`` with their inline images stored in ``store`` as blobs; and how many moved.

    Call it before the entries are appended (the blobs are then durable
    first); the entries' ids do not change, so a copy or an import that meets
    them again knows them.
    """
    moved = 0

    async def content(parts: tuple[UserContent, ...]) -> tuple[UserContent, ...] | None:
        nonlocal moved
        if not any(isinstance(p, ImagePart) for p in parts):
            return None
        out: list[UserContent] = []
        for p in parts:
            blob = None
            if isinstance(p, ImagePart):
                blob = await _moved(store, session_id, p, max_size)
            moved += blob is not None
            out.append(blob or p)
        return tuple(out)

    result: list[Entry] = []
    for entry in entries:
        out = entry
        if isinstance(entry, MessageEntry) and isinstance(
                entry.message, UserMessage | ToolResultMessage):
            new = await content(entry.message.content)
            if new is not None:
                out = msgspec.structs.replace(
                    entry, message=msgspec.structs.replace(entry.message, content=new))
        elif isinstance(entry, CustomMessageEntry):
            new = await content(entry.content)
            if new is not None:
                out = msgspec.structs.replace(entry, content=new)
        result.append(out)
    return result, moved


async def _moved(store: Store, session_id: str, image: ImagePart,
                 max_size: int) -> BlobPart | None:
    try:
        data = b64decode(image.data, validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return await attach(store, session_id, data, media_type=image.mime_type,
                            max_size=max_size)
    except (BlobTooLarge, ConfigError):
        return None
