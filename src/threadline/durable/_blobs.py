"""How a durable run's model reads the attachments its context references.

The agent hands the loop a reader over its own store; the provider calls it
while it builds a request. A reference whose bytes are gone is an error that
names the session, the entry holding the reference and the hash, so the run
ends saying which attachment is missing instead of sending the model less
than the conversation holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from threadline.ai._messages import BlobPart
from threadline.ai._model import BlobReader
from threadline.errors import BlobNotFound
from threadline.session._entries import Entry
from threadline.stores._blobs import blob_parts, open_blob
from threadline.stores._contract import Store

__all__ = ["blob_reader"]


def blob_reader(store: Store, session_id: str, path: Callable[[], Sequence[Entry]]) -> BlobReader:
    """A ``BlobReader`` for the session's parts; ``path`` names the entries to blame."""

    async def read(part: BlobPart) -> bytes:
        try:
            return await open_blob(store, session_id, part)
        except BlobNotFound as exc:
            entry = next((e.id for e in reversed(path())
                          if any(p.sha256 == part.sha256 for p in blob_parts((e,)))), None)
            raise BlobNotFound(part.sha256, type(store).__name__, session_id=session_id,
                               entry_id=entry) from exc

    return read
