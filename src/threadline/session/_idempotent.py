"""S25: an append retried after a lost acknowledgement is stored exactly once.

When the connection dies after a COMMIT went out but before its answer came
back, the caller cannot tell whether its entries are stored; it retries the
same batch. Entry ids make that safe: a store that finds ids of the batch
already in the session asks ``check_retried_batch`` what the repeat means.

- Every entry of the batch is stored, byte for byte the same, in one run in
  the batch's order: that is the earlier attempt, committed. The retry
  succeeds and stores nothing more.
- Anything else (other bytes under a stored id, only part of the batch
  stored, the stored copies out of order, an id twice in the batch) is not a
  retry but a conflicting append: ``StoreError``, and nothing is appended.

The memory, SQLite and PostgreSQL stores follow this rule. The file store
cannot check without reading its whole log and appends repeats (see
``session/_store.py``); it never loses an acknowledgement either, so it has no
retries to recognise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from threadline.errors import StoreError

__all__ = ["check_retried_batch"]


def check_retried_batch(
    session_id: str,
    batch: Sequence[tuple[str, bytes]],
    stored: Mapping[str, tuple[int, bytes]],
    where: str,
) -> None:
    """Return if ``batch`` (id, bytes) is already stored whole; raise ``StoreError`` if not.

    ``stored`` maps the ids of the batch that the session holds to their
    position in its log and their stored bytes.
    """
    problem = _conflict(batch, stored)
    if problem:
        raise StoreError(f"{where}: append to session {session_id!r} repeats an entry id "
                         f"already in the session, and is not a retry of a stored append: "
                         f"{problem}; nothing was appended", session_id=session_id)


def _conflict(batch: Sequence[tuple[str, bytes]], stored: Mapping[str, tuple[int, bytes]]) -> str:
    if len({entry_id for entry_id, _ in batch}) < len(batch):
        return "the batch holds one id twice"
    missing = [entry_id for entry_id, _ in batch if entry_id not in stored]
    if missing:
        return f"entry {missing[0]!r} is new but others are stored"
    first = stored[batch[0][0]][0]
    for offset, (entry_id, data) in enumerate(batch):
        position, stored_data = stored[entry_id]
        if stored_data != data:
            return f"entry {entry_id!r} is stored with different content"
        if position != first + offset:
            return f"entry {entry_id!r} is stored out of the batch's order"
    return ""
