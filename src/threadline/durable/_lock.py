"""A mutual-exclusion lock for coroutines on any thread and event loop.

``asyncio.Lock`` belongs to the loop that first waits on it and is not safe
across threads: an agent shared by threads that each run their own loop (the
OpenAI Agents SDK calls a session from ``run_sync`` and from worker threads)
would fail with "bound to a different event loop" or hang. This lock keeps
its state under a ``threading.Lock`` and wakes a waiter through its own
loop's ``call_soon_threadsafe``, handing the lock over directly so no other
caller can take it in between. Waiters are served first come, first served.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from types import TracebackType

__all__ = ["AnyLoopLock"]

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class AnyLoopLock:
    __slots__ = ("_guard", "_held", "_waiters")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held = False
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def locked(self) -> bool:
        return self._held

    async def acquire(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            loop = asyncio.get_running_loop()
            waiter: _Waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._guard:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued:
                self.release()  # the lock was already handed to us: pass it on
            raise

    def release(self) -> None:
        with self._guard:
            while self._waiters:
                loop, future = self._waiters.popleft()
                # A loop closed since it queued has no one left waiting on it.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_wake, future)
                    return
            self._held = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
