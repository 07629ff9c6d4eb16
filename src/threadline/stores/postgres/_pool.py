"""The PostgreSQL store's connection pools: one per event loop it is used from.

A psycopg pool belongs to the event loop that opened it, and an application
may call one store from several loops (a thread each, or ``asyncio.run`` per
call). A store that makes its own pool makes one per loop, and a task on
that loop closes it when the store closes or the loop ends (``asyncio.run``
and ``asyncio.Runner`` cancel a loop's tasks before closing it), so ended
loops keep no connections open. A pool the application passes in serves
only the loop it belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Self, cast

import psycopg
from psycopg_pool import AsyncConnectionPool

from threadline.errors import StoreError
from threadline.stores.postgres._wire import Connection, settle

__all__ = ["LoopPool", "Pools", "taking_from"]

Conn = psycopg.AsyncConnection[Any]


def taking_from(spare: list[Conn]) -> type[Connection]:
    """A connection class for a pool whose next connect takes one from ``spare``, if any.

    The store's first connection checks the server and the schema before the
    pool opens; given to the pool this way (psycopg_pool has no call to adopt
    a connection), it is the pool's first, and a cold open connects once.
    """

    class Spared(Connection):
        @classmethod
        async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            if spare:
                return cast(Self, spare.pop())
            return await super().connect(conninfo, **kwargs)

    return Spared


class LoopPool:
    """One event loop's pool, and what the store keeps for that loop."""

    __slots__ = ("closer", "closing", "down", "listener", "lock", "pool", "ready", "spare",
                 "stop", "waiting")

    def __init__(self, pool: AsyncConnectionPool[Any], spare: list[Conn]) -> None:
        self.pool = pool
        self.spare = spare
        """The connection the store's first call made, until the pool takes it."""
        self.lock = asyncio.Lock()  # made and used in the one loop this pool serves
        self.ready = False
        self.down = False
        """A connection failed: probe the server before trusting this pool again."""
        self.listener: asyncio.Task[None] | None = None
        """This loop's LISTEN connection task (watch), if one was started."""
        self.waiting = False
        """The listener is idle (waiting for news or to reconnect), where a cancel is safe."""
        self.closing = False
        """Set before the pool closes: the listener ends at its next step."""
        self.closer: asyncio.Task[None] | None = None
        """The task that closes this pool (a pool the store made) once ``stop`` is set."""
        self.stop: asyncio.Future[None] | None = None

    async def taken(self) -> None:
        """Give a pool that just opened the loop turns its first fill takes to take the spare.

        A call that found the pool empty meanwhile would grow it by one more
        connection. A pool with no min_size takes it when the first call grows it.
        """
        for _ in range(100):
            if not self.spare or not self.pool.min_size:
                return
            await asyncio.sleep(0)

    def stop_listener(self) -> None:
        """Cancel the listener if it is idle; busy, it stops at its next step."""
        self.closing = True
        if self.listener is not None and self.waiting:
            self.listener.cancel()

    async def end_listener(self) -> None:
        self.stop_listener()
        if self.listener is not None:
            await asyncio.wait([self.listener])

    async def close(self, *, ending: bool = False) -> None:
        """Close the pool; ``ending``: as the loop ends, its tasks cancelled."""
        await self.end_listener()
        if ending:
            # The pool's own tasks were cancelled with the loop's, and its
            # close stops at them before it reaches its idle connections:
            # those are taken out and closed first.
            for _ in range(self.pool.get_stats().get("pool_available", 0)):
                try:
                    conn = await self.pool.getconn(timeout=1.0)
                except psycopg.Error:  # closed, or none idle after all
                    break
                await conn.close()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pool.close()  # connections given back later are closed
        else:
            await self.pool.close()
        while self.spare:  # closed before the pool took it
            await self.spare.pop().close()


class Pools:
    """The pools of one store, by event loop.

    ``make`` builds a new pool (taking from the spare list it is given);
    without it the first pool is the application's and serves one loop.
    """

    def __init__(self, first: AsyncConnectionPool[Any], spare: list[Conn],
                 make: Callable[[list[Conn]], AsyncConnectionPool[Any]] | None,
                 where: str) -> None:
        self.first = first
        self._first_spare = spare
        self._make = make
        self._where = where
        self._loops: dict[asyncio.AbstractEventLoop, LoopPool] = {}
        self._used = False
        self._guard = threading.Lock()

    def get(self, loop: asyncio.AbstractEventLoop) -> LoopPool | None:
        return self._loops.get(loop)

    def here(self) -> LoopPool:
        """The running loop's pool, made on the loop's first call."""
        loop = asyncio.get_running_loop()
        here = self._loops.get(loop)
        if here is not None:
            return here
        with self._guard:
            here = self._loops.get(loop)
            if here is not None:
                return here
            if not self._used:
                here = LoopPool(self.first, self._first_spare)
            elif self._make is None:
                raise StoreError(
                    f"{self._where}: the AsyncConnectionPool passed in belongs to another "
                    f"event loop; pass a URL to have the store make a pool per loop")
            else:
                # A loop closed without cancelling its tasks could not run
                # its closer: its pool is dropped, its connections left to
                # the garbage collector.
                for ended in [lp for lp in self._loops if lp.is_closed()]:
                    del self._loops[ended]
                spare: list[Conn] = []
                here = LoopPool(self._make(spare), spare)
            self._used = True
            if self._make is not None:
                here.stop = loop.create_future()
                here.closer = loop.create_task(self._close_with_loop(loop, here, here.stop))
            self._loops[loop] = here
        return here

    async def _close_with_loop(self, loop: asyncio.AbstractEventLoop, here: LoopPool,
                               stop: asyncio.Future[None]) -> None:
        """Close ``here`` once ``stop`` is set (by ``close``) or this task is cancelled
        (as the loop ends)."""
        try:
            await stop
            ending = False
        except asyncio.CancelledError:
            ending = True
        with self._guard:
            if self._loops.get(loop) is here:
                del self._loops[loop]
        await here.close(ending=ending)

    async def close(self) -> None:
        """Close every loop's pool the store made, and end every loop's listener.

        The running loop's are closed before this returns; another loop's
        close on that loop, when it next runs.
        """
        loop = asyncio.get_running_loop()
        with self._guard:
            pools = list(self._loops.items())
        if not pools and self._make is not None:
            await self.first.close()  # never used, perhaps opened by the application
        for owner, here in pools:
            if here.closer is None or here.stop is None:  # the application's pool
                if owner is loop:
                    await here.end_listener()
                else:
                    with contextlib.suppress(RuntimeError):  # that loop has closed
                        owner.call_soon_threadsafe(here.stop_listener)
            elif owner is loop:
                settle(here.stop)
                await asyncio.wait([here.closer])
                if here.closer.cancelled():  # before it started: it closed nothing
                    await here.close()
            else:
                with contextlib.suppress(RuntimeError):
                    owner.call_soon_threadsafe(settle, here.stop)
