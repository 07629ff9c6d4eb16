"""The hand-off from a run's pump task to its consumer.

A run forwards about ten events per stored message (stream deltas, tool
starts, ends). ``asyncio.Queue`` costs a few microseconds per item in
bookkeeping (its full/empty checks, waiter lists, ``_wakeup_next``), more than
the loop spends making most events. This channel is a deque with at most one
waiting getter and one waiting putter (the pump is the only producer, the run
the only consumer).

Even a method call per event is a fair share of what the loop spends making
one, so both sides work on ``items`` directly on their hot path: the pump
appends and then calls ``wake`` only when ``getter`` is set; the run pops
and calls ``let_in`` only when ``putter`` is set. The methods are for the
slow paths (waiting, the end, the consumer leaving).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

__all__ = ["Channel"]

T = TypeVar("T")


class Channel(Generic[T]):
    """Items in order, buffered up to ``limit`` before the producer waits."""

    __slots__ = ("_end", "_error", "getter", "items", "limit", "putter")

    def __init__(self, limit: int) -> None:
        self.items: collections.deque[T] = collections.deque()
        self.limit = limit
        self.getter: asyncio.Future[None] | None = None
        """The consumer's future while it waits for an item (``get``)."""
        self.putter: asyncio.Future[None] | None = None
        """The producer's future while it waits for room (``room``)."""
        self._end = False
        self._error: BaseException | None = None

    def put(self, item: T) -> bool:
        """Buffer ``item``; True when full (the producer then awaits ``room()``)."""
        self.items.append(item)
        if self.getter is not None:
            self.wake()
        return len(self.items) >= self.limit

    def wake(self) -> None:
        """Wake the waiting consumer (after an append).

        Once: the consumer runs only after the pump stops, so the items put
        until then need no wake-up of their own.
        """
        getter = self.getter
        self.getter = None
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def room(self) -> None:
        """Wait until the consumer has taken enough for ``put`` to be allowed again."""
        while len(self.items) >= self.limit:
            self.putter = putter = asyncio.get_running_loop().create_future()
            try:
                await putter
            finally:
                self.putter = None

    def let_in(self) -> None:
        """Let a waiting producer go on once there is room (after a pop)."""
        putter = self.putter
        if putter is not None and len(self.items) < self.limit and not putter.done():
            putter.set_result(None)

    def close(self, error: BaseException | None = None) -> None:
        """No more items; ``get`` raises ``error`` (if any) once the buffer is drained."""
        self._end = True
        self._error = error
        self.wake()

    async def get(self) -> T | None:
        """The next item; None after ``close()`` and the last item."""
        items = self.items
        while not items:
            if self._end:
                if self._error is not None:
                    raise self._error
                return None
            self.getter = getter = asyncio.get_running_loop().create_future()
            try:
                await getter
            finally:
                self.getter = None
        item = items.popleft()
        if self.putter is not None:
            self.let_in()
        return item

    def clear(self) -> None:
        """Drop what is buffered and let a waiting producer go on (the consumer left)."""
        self.items.clear()
        self.let_in()
