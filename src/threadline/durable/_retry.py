"""How the durable agent retries a store that lost its connection.

``StoreUnavailable`` means the outcome of the append is unknown: the entries
may be stored with only the acknowledgement lost. Retrying the very same
batch (same ids, same bytes) is safe because the store recognises a batch it
already holds and stores it once (``check_retried_batch`` in ``stores/_rules.py``;
for ``append_linear``, a batch stored as one run with its own bytes apart from
the parent of its first entry, the ``LinearStore`` rule). So the agent
retries a few times over about two seconds, and reports success only when a
store call succeeded: a receipt is issued once, and only for stored entries.
When the retries run out the error propagates; the entries may or may not be
stored, and a later load shows which.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from threadline.errors import StoreUnavailable
from threadline.session._entries import Entry
from threadline.stores._contract import LinearStore, Store

__all__ = ["RETRY_DELAYS", "append_linear_retrying", "retry_append"]

T = TypeVar("T")

log = logging.getLogger("threadline.durable")

RETRY_DELAYS: tuple[float, ...] = (0.05, 0.15, 0.3, 0.5, 1.0)
"""Seconds slept before each retry of an append that met ``StoreUnavailable``."""


async def retry_append(store: Store, session_id: str, batch: Sequence[Entry],
                       first: StoreUnavailable) -> None:
    """The retries of an append whose first attempt (the caller's) failed with ``first``."""
    await _wait_to_retry(RETRY_DELAYS[0], session_id, len(batch), first)
    await _retrying(lambda: store.append_entries(session_id, batch), session_id, len(batch),
                    RETRY_DELAYS[1:])


async def append_linear_retrying(store: LinearStore, session_id: str,
                                 batch: Sequence[Entry]) -> list[Entry]:
    """``append_linear`` retried like an append; returns the batch as stored."""
    return await _retrying(lambda: store.append_linear(session_id, batch), session_id,
                           len(batch))


async def _retrying(call: Callable[[], Awaitable[T]], session_id: str, count: int,
                    delays: Sequence[float] = RETRY_DELAYS) -> T:
    for delay in delays:
        try:
            return await call()
        except StoreUnavailable as exc:
            await _wait_to_retry(delay, session_id, count, exc)
    return await call()


async def _wait_to_retry(delay: float, session_id: str, count: int,
                         exc: StoreUnavailable) -> None:
    log.warning("session %r: append of %d entries failed, retrying the same batch in "
                "%gs: %s", session_id, count, delay, exc)
    await asyncio.sleep(delay)
