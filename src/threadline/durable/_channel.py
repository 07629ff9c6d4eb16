"""The hand-off from a run's pump task to its consumer.

A run forwards about ten events per stored message (stream deltas, tool
starts, ends). ``asyncio.Queue`` costs a few microseconds per item in
bookkeeping (its full/empty checks, waiter lists, ``_wakeup_next``), more than
the loop spends making most events. This channel is a deque with at most one
waiting getter and one waiting putter (the pump is the only producer, the run
the only consumer), so handing over an event that is already there is an
append and a ``popleft``.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

__all__ = ["EMPTY", "Channel"]

T = TypeVar("T")

EMPTY = object()
"""What ``take`` returns when nothing is buffered."""


class Channel(Generic[T]):
    """Items in order, buffered up to ``limit`` before the producer waits."""

    __slots__ = ("_end", "_error", "_getter", "_items", "_limit", "_putter")

    def __init__(self, limit: int) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._limit = limit
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None
        self._end = False
        self._error: BaseException | None = None

    def put(self, item: T) -> bool:
        """Buffer ``item``; True when full (the producer then awaits ``room()``)."""
        items = self._items
        items.append(item)
        getter = self._getter
        if getter is not None:
            # Woken once: the consumer runs only after the pump stops, so the
            # items put until then need no wake-up of their own.
            self._getter = None
            if not getter.done():
                getter.set_result(None)
        return len(items) >= self._limit

    async def room(self) -> None:
        """Wait until the consumer has taken enough for ``put`` to be allowed again."""
        while len(self._items) >= self._limit:
            self._putter = putter = asyncio.get_running_loop().create_future()
            try:
                await putter
            finally:
                self._putter = None

    def close(self, error: BaseException | None = None) -> None:
        """No more items; ``get`` raises ``error`` (if any) once the buffer is drained."""
        self._end = True
        self._error = error
        self._wake_getter()

    def take(self) -> T | object:
        """The next buffered item, or ``EMPTY``; never waits."""
        items = self._items
        if not items:
            return EMPTY
        item = items.popleft()
        if self._putter is not None and len(items) < self._limit:
            self._wake_putter()
        return item

    async def get(self) -> T | None:
        """The next item; None after ``close()`` and the last item."""
        while not self._items:
            if self._end:
                if self._error is not None:
                    raise self._error
                return None
            self._getter = getter = asyncio.get_running_loop().create_future()
            try:
                await getter
            finally:
                self._getter = None
        return self.take()  # type: ignore[return-value]

    def clear(self) -> None:
        """Drop what is buffered and let a waiting producer go on (the consumer left)."""
        self._items.clear()
        self._wake_putter()

    def _wake_putter(self) -> None:
        putter = self._putter
        if putter is not None and not putter.done():
            putter.set_result(None)

    def _wake_getter(self) -> None:
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)
