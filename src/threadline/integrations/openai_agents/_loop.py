"""The event loop every ``ThreadlineSession`` of a process does its store work on.

The SDK calls a session from whatever loop it runs on: ``Runner.run`` on the
application's, ``run_sync`` on one it makes and closes again. A store keeps
state on the loop that used it (a PostgreSQL pool's worker tasks), and a loop
closed under them leaves "Event loop is closed" tracebacks behind. So the
sessions' store calls all run on one loop of threadline's own, in a daemon
thread started on first use (again in a forked child), and the caller's loop
only waits for the result. At exit the loop finishes what is left on it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

__all__ = ["in_home", "on_home", "run_at_home"]

T = TypeVar("T")

class _Home:
    """The loop, its thread, and the process they belong to (a forked child makes its own)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.pid = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None


_home = _Home()


def _loop() -> asyncio.AbstractEventLoop:
    loop = _home.loop
    if loop is not None and _home.pid == os.getpid():
        return loop
    with _home.guard:
        if _home.loop is None or _home.pid != os.getpid():
            if _home.loop is None:
                atexit.register(_shutdown)
            _home.loop = asyncio.new_event_loop()
            _home.thread = threading.Thread(target=_home.loop.run_forever,
                                            name="threadline-sessions", daemon=True)
            _home.thread.start()
            _home.pid = os.getpid()
        return _home.loop


def in_home() -> bool:
    """Whether the caller runs on the home loop itself."""
    try:
        return asyncio.get_running_loop() is _loop()
    except RuntimeError:
        return False


def on_home(work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``work`` on the home loop; its outcome, for any thread to wait on."""
    return asyncio.run_coroutine_threadsafe(work, _loop())


async def run_at_home(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` run on the home loop, from whatever loop the caller is on."""
    if in_home():
        return await work
    waiting: Awaitable[T] = asyncio.wrap_future(on_home(work))
    return await waiting


def _shutdown() -> None:
    """Let what runs on the home loop end (pools' workers among it), then close it."""
    loop, thread = _home.loop, _home.thread
    if loop is None or thread is None or _home.pid != os.getpid() or not thread.is_alive():
        return

    async def settle() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await loop.shutdown_asyncgens()

    try:
        asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout=10)
    except (concurrent.futures.TimeoutError, RuntimeError):
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    if not loop.is_running():
        loop.close()
