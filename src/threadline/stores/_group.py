"""Group commit for the local stores: appends queued per key, written and synced together.

A store hands each append to ``GroupCommit.enqueue`` under a key (the file
store: the session; the SQLite store: its database). While a key is being
written, later calls queue up, and the next write takes all of them at once,
so that one sync covers them. The store's write function stores a group and
says, call by call, what each caller is told; a caller is told only after the
write returned, so after the sync that covers its entries. After a failed
sync the store poisons the object: the group's calls and every later write
get ``DurabilityError``. Blocking work runs on the object's worker threads,
never on an event loop, and a forked child starts with none of its parent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from threadline.errors import DurabilityError

__all__ = ["GroupCommit"]

K = TypeVar("K")
C = TypeVar("C")
T = TypeVar("T")

Outcome = BaseException | None
"""What one call of a group is told: None (stored) or the error it raises."""


class _Pending(Generic[C]):
    __slots__ = ("call", "future", "loop", "session_id")

    def __init__(self, call: C, session_id: str | None, loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        self.session_id = session_id
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()


class GroupCommit(Generic[K, C]):
    """Per-key queues of append calls, written a group at a time by worker threads.

    ``write(key, calls)`` stores the calls (in order, each whole or not at
    all) and returns one outcome per call; if it raises, every call of the
    group gets that error. ``label`` names the store in errors. ``threads``
    bounds the worker threads (1 keeps every job of the object in order);
    ``after_fork`` runs in a forked child, after the object forgot its
    parent's threads and queues.
    """

    def __init__(self, write: Callable[[K, list[C]], Sequence[Outcome]], *, label: str,
                 threads: int | None = None,
                 after_fork: Callable[[], None] | None = None) -> None:
        self._write = write
        self._label = label
        self._threads = threads
        self._after_fork = after_fork
        self._lock = threading.Lock()
        # Busy keys -> calls queued for the next write. A key is busy from its
        # first call until a write finds nothing more queued.
        self._queues: dict[K, list[_Pending[C]]] = {}
        # Busy keys whose first write an event loop is yet to start -> that loop.
        self._starting: dict[K, asyncio.AbstractEventLoop] = {}
        self._idle: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._poisoned: DurabilityError | None = None
        _GROUPS.add(self)

    # -- poisoning ------------------------------------------------------------------

    @property
    def poisoned(self) -> bool:
        return self._poisoned is not None

    def poison(self, what: str, cause: BaseException,
               session_id: str | None = None) -> DurabilityError:
        """Refuse every later write; the error to raise for ``what`` failing with ``cause``.

        Whatever the failed sync may have left must be undone before this is
        called: from now on the store's other handles may read the file.
        """
        error = DurabilityError(f"{what}: {cause}; this {self._label} refuses further "
                                f"writes", session_id=session_id)
        error.__cause__ = cause
        if self._poisoned is None:
            self._poisoned = error
        return error

    def check_writable(self, session_id: str | None) -> None:
        """Raise ``DurabilityError`` if an earlier sync failed."""
        if self._poisoned is not None:
            raise self._refusal(session_id)

    def _refusal(self, session_id: str | None) -> DurabilityError:
        what = "writes" if session_id is None else f"writes to session {session_id!r}"
        error = DurabilityError(
            f"this {self._label} refuses {what} after an earlier failed write or sync "
            f"({self._poisoned}); open a new one once the disk is checked",
            session_id=session_id)
        error.__cause__ = self._poisoned
        return error

    # -- calls ----------------------------------------------------------------------

    def enqueue(self, key: K, call: C, session_id: str | None) -> asyncio.Future[None]:
        """Queue ``call`` for the next write of ``key``; the future settles after it.

        An idle key's write starts one turn of the event loop later, so that
        the tasks running now, which may append too, join the same group.
        """
        self.check_writable(session_id)
        loop = asyncio.get_running_loop()
        pending = _Pending(call, session_id, loop)
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = [pending]
                self._starting[key] = loop
                loop.call_soon(self._start, key)
            else:
                queue.append(pending)
                self._start_orphans_locked()
        return pending.future

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the worker threads (in order with the writes, with one thread)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pool_locked()
        return loop.run_in_executor(pool, fn, *args)

    async def close(self) -> None:
        """Wait until nothing is queued or being written, then stop the worker threads.

        The object stays usable: a later call starts threads again.
        """
        loop = asyncio.get_running_loop()
        idle: asyncio.Future[None] | None = None
        with self._lock:
            self._start_orphans_locked()
            if self._queues:
                idle = loop.create_future()
                self._idle.append((loop, idle))
        if idle is not None:
            await idle
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown)

    # -- the worker -----------------------------------------------------------------

    def _pool_locked(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="threadline")
        return self._executor

    def _start(self, key: K) -> None:
        with self._lock:
            if self._starting.pop(key, None) is not None:
                self._pool_locked().submit(self._drain, key)

    def _start_orphans_locked(self) -> None:
        # A loop that closed before it ran _start would leave its key busy for
        # ever, and every call queued behind it waiting.
        for key, loop in list(self._starting.items()):
            if loop.is_closed():
                del self._starting[key]
                self._pool_locked().submit(self._drain, key)

    def _drain(self, key: K) -> None:
        """Worker: write one group of ``key``; a new job for the next, so other jobs run between."""
        with self._lock:
            queue = self._queues[key]
            group = [p for p in queue if not p.future.cancelled()]  # cancelled: never stored
            queue.clear()
        outcomes = self._outcomes(key, group) if group else []
        with self._lock:
            if queue:
                self._pool_locked().submit(self._drain, key)
            else:
                del self._queues[key]
                if not self._queues:
                    idle, self._idle = self._idle, []
                    for loop, future in idle:
                        _call_in(loop, _settle, [(future, None)])
        # Woken last, after the next group is taken: what the woken callers
        # append next finds the key idle or queues for the write after it.
        _wake(group, outcomes)

    def _outcomes(self, key: K, group: list[_Pending[C]]) -> Sequence[Outcome]:
        if self._poisoned is not None:  # queued behind a failed sync: none is stored
            return [self._refusal(p.session_id) for p in group]
        try:
            outcomes = self._write(key, [p.call for p in group])
        except BaseException as exc:  # handed to every caller, as run_in_executor would
            return [exc] * len(group)
        assert len(outcomes) == len(group)
        return outcomes

    def _forget_parent(self) -> None:
        # The parent's threads do not exist in a forked child, and its lock may
        # have been held at the fork; its queued calls belong to its loops.
        self._lock = threading.Lock()
        self._queues.clear()
        self._starting.clear()
        self._idle.clear()
        self._executor = None
        if self._after_fork is not None:
            self._after_fork()


def _wake(group: Sequence[_Pending[Any]], outcomes: Sequence[Outcome]) -> None:
    """Settle a written group's calls from a worker: one wake-up per event loop.

    One wake-up per call would let a loop resume the first callers before the
    rest are settled, and their next appends would split into more groups.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], Outcome]]] = {}
    for pending, outcome in zip(group, outcomes, strict=True):
        by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, settled in by_loop.items():
        _call_in(loop, _settle, settled)


def _call_in(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits there
        loop.call_soon_threadsafe(fn, *args)


def _settle(settled: list[tuple[asyncio.Future[None], Outcome]]) -> None:
    for future, outcome in settled:
        if future.cancelled():
            continue
        if outcome is None:
            future.set_result(None)
        else:
            future.set_exception(outcome)


_GROUPS: weakref.WeakSet[GroupCommit[Any, Any]] = weakref.WeakSet()


def _forget_parents() -> None:
    for group in list(_GROUPS):
        group._forget_parent()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_parents)
