"""What the suite runs in child processes, and opening and closing any store.

Every function here is a module-level function taking picklable arguments,
so ``spawn`` can start it: the parent runs an event loop and threads, which
``fork`` would copy.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from types import FrameType
from typing import Any, TypeVar

import msgspec

from threadline.ai._messages import UserMessage
from threadline.errors import SessionExists
from threadline.session._entries import Entry, SessionRecord
from threadline.stores._contract import Store
from threadline.testing._conformance._data import chain_entry

__all__ = [
    "KILL_AFTER_RETURN",
    "KILL_BEFORE_CALL",
    "StoreOpener",
    "aclose",
    "append_batches",
    "append_chain",
    "close",
    "kill_inside_append",
    "open_store",
    "process_append",
    "process_append_batches",
    "process_create",
]

T = TypeVar("T")

StoreOpener = Callable[[], "Store | Awaitable[Store]"]
"""A picklable callable a child process uses to open the store under test."""


async def open_store(opener: StoreOpener) -> Store:
    store = opener()
    if inspect.isawaitable(store):
        store = await store
    return store


async def close(store: Store) -> None:
    closer = getattr(store, "close", None)  # plumbing: a handle is closed if it can be
    if closer is not None:
        result = closer()
        if inspect.isawaitable(result):
            await result


async def aclose(iterator: AsyncIterator[Entry]) -> None:
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()


async def append_chain(
    store: Store, session_id: str, writer: int, count: int, batch: int = 1
) -> list[str]:
    """Append ``count`` chained entries, ``batch`` per call; the ids acknowledged."""
    acknowledged: list[str] = []
    parent: str | None = None
    for start in range(0, count, batch):
        entries = []
        for n in range(start, min(start + batch, count)):
            entry = chain_entry(parent, writer, n)
            parent = entry.id
            entries.append(entry)
        await store.append_entries(session_id, entries)
        acknowledged.extend(e.id for e in entries)
    return acknowledged


async def append_batches(store: Store, session_id: str, count: int) -> list[str]:
    """Append ``count`` chained entries in batches of 1 to 5; the ids in append order."""
    acknowledged: list[str] = []
    parent: str | None = None
    while len(acknowledged) < count:
        entries: list[Entry] = []
        for _ in range(min(1 + len(acknowledged) % 5, count - len(acknowledged))):
            entry = chain_entry(parent, 0, len(acknowledged) + len(entries))
            parent = entry.id
            entries.append(entry)
        await store.append_entries(session_id, entries)
        acknowledged.extend(e.id for e in entries)
    return acknowledged


def _in_child(opener: StoreOpener, work: Callable[[Store], Awaitable[T]]) -> T:
    async def run() -> T:
        store = await open_store(opener)
        try:
            return await work(store)
        finally:
            await close(store)

    return asyncio.run(run())


def process_append(opener: StoreOpener, session_id: str, writer: int, count: int) -> list[str]:
    return _in_child(opener, lambda store: append_chain(store, session_id, writer, count))


def process_append_batches(opener: StoreOpener, session_id: str, count: int) -> list[str]:
    return _in_child(opener, lambda store: append_batches(store, session_id, count))


def process_create(opener: StoreOpener, session_id: str) -> bool:
    async def create(store: Store) -> bool:
        try:
            await store.create_session(SessionRecord(id=session_id))
        except SessionExists:
            return False
        return True

    return _in_child(opener, create)


KILL_BEFORE_CALL = -1
"""A kill point: SIGKILL just before ``append_entries`` is called."""
KILL_AFTER_RETURN = -2
"""A kill point: SIGKILL as soon as ``append_entries`` returned, before ``close``."""


def kill_inside_append(opener: StoreOpener, session_id: str, size: int, point: int,
                       say: Any) -> None:
    """Create a session and append ``size`` entries in one call; SIGKILL this process at ``point``.

    A ``point`` of 1 or more counts the call's own progress: every function
    call and return that any thread of this process makes while
    ``append_entries`` runs (its encoding, its writes, its worker threads, its
    waits on the event loop) is one event, seen through the interpreter's
    profiling hook; at event ``point`` the process kills itself. So the kill
    lands inside the call by construction, at the same place of its work
    whatever the machine's speed. What the child tells the parent (``say``,
    one end of a pipe): ``("killed", event)`` just before a kill inside the
    call, ``("returned", events)`` once the call returned (``events``: how
    many it made), ``("before", 0)`` before a kill ahead of the call, or
    ``("error", text)``.
    """
    tripwire = _Tripwire(point, say)
    # Set before the store starts its threads, so theirs count too.
    sys.setprofile(tripwire)
    threading.setprofile(tripwire)

    async def run() -> None:
        store = await open_store(opener)
        await store.create_session(SessionRecord(id=session_id))
        batch: list[Entry] = []
        parent: str | None = None
        for n in range(size):
            entry = msgspec.structs.replace(chain_entry(parent, 0, n),
                                            message=UserMessage.of(f"{n} " + "é" * 1_000))
            parent = entry.id
            batch.append(entry)
        if point == KILL_BEFORE_CALL:
            _die(say, ("before", 0))
        tripwire.armed = True
        try:
            await store.append_entries(session_id, batch)
        finally:
            events = tripwire.disarm()
        say.send(("returned", events))
        if point == KILL_AFTER_RETURN:
            _die(say, None)
        await close(store)

    try:
        asyncio.run(run())
    except BaseException:
        say.send(("error", traceback.format_exc()))
        raise


class _Tripwire:
    """A profiling hook that counts events while armed and kills the process at one."""

    def __init__(self, point: int, say: Any) -> None:
        self.point = point
        self.say = say
        self.armed = False
        self.events = 0
        # Counting, killing and disarming under one lock: a worker thread's
        # event as the call returns either kills first or no longer counts.
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if self.armed:
            with self._lock:
                if self.armed:
                    self.events += 1
                    if self.events == self.point:
                        _die(self.say, ("killed", self.events))

    def disarm(self) -> int:
        """Stop counting; the events the call made."""
        self.armed = False  # first: this thread's own events must not wait for the lock
        with self._lock:  # a thread counting now finishes (or kills) first
            return self.events


def _die(say: Any, message: tuple[str, int] | None) -> None:
    if message is not None:
        say.send(message)
    os.kill(os.getpid(), signal.SIGKILL)
