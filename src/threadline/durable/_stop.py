"""Writing a live run's bookkeeping after the log's last entry, and asking a run to stop.

Every bookkeeping entry (``_live.py``) is chained after whatever entry is
last in the log when it is written (``append_linear``), never after an
older one: a reload, whose leaf is the last entry appended, then always
has a path through every message stored before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from threadline.durable._live import STOP_KIND, StopRequest, scan
from threadline.durable._retry import append_linear_retrying
from threadline.errors import ConfigError
from threadline.session._entries import CustomEntry, Entry, OpaqueEntry
from threadline.stores._contract import LinearStore, Store

__all__ = ["append_last", "linear", "request_stop"]


def linear(store: Store, what: str) -> LinearStore:
    if not isinstance(store, LinearStore):
        raise ConfigError(f"{what} needs a store with append_linear and load_entries_after "
                          f"(LinearStore); {type(store).__name__} has not (every built-in "
                          "store has)")
    return store


async def append_last(store: LinearStore, session_id: str,
                      entries: Sequence[Entry]) -> list[Entry]:
    """``entries``, chained one after another, appended after the log's last entry
    (retried as the repeated-id rule allows)."""
    chained: list[Entry] = []
    for entry in entries:
        linked = entry
        if chained and not isinstance(entry, OpaqueEntry):
            linked = msgspec.structs.replace(entry, parent_id=chained[-1].id)
        chained.append(linked)
    return await append_linear_retrying(store, session_id, chained)


async def request_stop(store: Store, session_id: str, run_id: str | None = None, *,
                       reason: str = "", by: str = "") -> CustomEntry[Any] | None:
    """Store a stop for the session's active run (``run_id``: only if it is that one).

    Returns the stop record, or None when no such run is active. The run's
    owner, in this process or another, sees it and ends the run with stop
    reason ``stopped``.
    """
    log = linear(store, f"stopping a run of session {session_id!r}")
    active = scan(await store.load_entries(session_id)).active
    if active is None or (run_id is not None and active.id != run_id):
        return None
    record: CustomEntry[Any] = CustomEntry(
        kind=STOP_KIND, data=StopRequest(run=active.id, reason=reason, by=by))
    (stored,) = await append_last(log, session_id, [record])
    assert isinstance(stored, CustomEntry)
    return stored
