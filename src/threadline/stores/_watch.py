"""Following a session as it grows: the loop every store's ``watch`` runs.

A store gives three things: where to start (the position just after entry
``after``, or the start of the log), a read of every entry stored after a
position together with the position after them, and a ``Wakeups`` hub that
its appends (or a notification from another process) ring. The loop reads,
yields, and when nothing is new waits for a wake-up or the store's poll
interval, whichever comes first.

It never skips or repeats an entry: positions only grow, each read starts
exactly where the last one stopped, and a wake-up that arrives while a read
is running is kept for the next wait (the event is cleared before reading,
not after). Across a disconnect the consumer resumes with the id of the last
entry it got, which the store turns back into the same position.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

from threadline.errors import StoreError
from threadline.session._entries import Entry

__all__ = ["Wakeups", "follow", "unknown_after"]

P = TypeVar("P")


class Wakeups:
    """Waiters per session, rung from any thread or event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    @contextlib.contextmanager
    def register(self, session_id: str) -> Iterator[asyncio.Event]:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.setdefault(session_id, set()).add(waiter)
        try:
            yield waiter[1]
        finally:
            with self._lock:
                waiters = self._waiters.get(session_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[session_id]

    def ring(self, session_id: str | None = None) -> None:
        """Wake the watchers of ``session_id`` (of every session if None)."""
        if not self._waiters:
            # Nobody watches (the usual case), read without the lock: a watcher
            # registers before it reads, so one registering now sees the append.
            return
        with self._lock:
            if session_id is None:
                waiters = [w for ws in self._waiters.values() for w in ws]
            else:
                waiters = list(self._waiters.get(session_id, ()))
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody to wake
                loop.call_soon_threadsafe(event.set)

    def watched(self) -> list[str]:
        with self._lock:
            return list(self._waiters)


def unknown_after(session_id: str, after: str, where: str) -> StoreError:
    return StoreError(f"{where}: cannot watch session {session_id!r} after entry {after!r}: "
                      f"the session has no such entry", session_id=session_id)


async def follow(
    key: str,
    start: Callable[[], Awaitable[P]],
    read: Callable[[P], Awaitable[tuple[list[Entry], P]]],
    wakeups: Wakeups,
    poll_interval: float | None,
) -> AsyncIterator[Entry]:
    """Yield what ``read`` finds after ``start()``, then keep waiting for more.

    ``key`` is what ``wakeups`` is rung with for this session. With
    ``poll_interval`` None only wake-ups bring news (the in-process store);
    otherwise the store is read again at least that often.
    """
    with wakeups.register(key) as event:
        position = await start()
        while True:
            event.clear()
            entries, position = await read(position)
            for entry in entries:
                yield entry
            if not entries:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), poll_interval)
