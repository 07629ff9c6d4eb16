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
until the deque is empty and only then asks for a ``waiter`` (a future, not
a coroutine), which first lets a producer waiting for room go on. A full
buffer is thus drained before the producer refills it. The methods are for
the slow paths (waiting, the end, the consumer leaving).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

__all__ = ["Channel"]

T = TypeVar("T")


class Channel(Generic[T]):
    """Items in order, buffered up to ``limit`` before the producer waits.

    The producer appends to ``items``, calls ``wake`` when ``getter`` is set,
    and awaits ``room`` once ``limit`` items are buffered.
    """

    __slots__ = ("_end", "_error", "_left", "getter", "items", "limit", "putter")

    def __init__(self, limit: int) -> None:
        self.items: collections.deque[T] = collections.deque()
        self.limit = limit
        self.getter: asyncio.Future[None] | None = None
        """The consumer's future while it waits for an item (``waiter``)."""
        self.putter: asyncio.Future[None] | None = None
        """The producer's future while it waits for room (``room``)."""
        self._end = False
        self._error: BaseException | None = None
        self._left = False

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
        """Wait until the consumer has taken what is buffered (at once if it left)."""
        items = self.items
        while len(items) >= self.limit:
            if self._left:
                items.clear()  # nobody will take them
                return
            self.putter = putter = asyncio.get_running_loop().create_future()
            try:
                await putter
            finally:
                self.putter = None

    def _let_in(self) -> None:
        putter = self.putter
        if putter is not None and not putter.done():
            putter.set_result(None)

    def close(self, error: BaseException | None = None) -> None:
        """No more items; ``waiter`` raises ``error`` (if any) once the buffer is drained."""
        self._end = True
        self._error = error
        self.wake()

    def waiter(self) -> asyncio.Future[None] | None:
        """Called once the consumer took every item: what to await for more.

        None after ``close()`` (raising its ``error``, if any). A producer
        waiting for room goes on first.
        """
        if self.putter is not None:
            self._let_in()
        if self._end:
            if self._error is not None:
                raise self._error
            return None
        self.getter = getter = asyncio.get_running_loop().create_future()
        return getter

    def clear(self) -> None:
        """The consumer left: drop what is buffered, and whatever is put from now on."""
        self._left = True
        self.items.clear()
        self._let_in()
