"""Runs that outlive the request: owned by a worker, stopped by a stored decision, rejoinable.

``LiveRuns`` is the worker: it starts a session's run in a task of its own,
so whoever asked for it (an HTTP handler) may leave while the run goes on.
One run per session at a time, across processes, on every store: the claim
rule of ``_live.py`` decides, and a second start is refused with
``RunActive`` naming the run that has the session.

While the run's assistant message streams, its pieces go to the followers in
this process at once and to the log every ``flush_interval`` seconds (one
``append_linear`` of a ``threadline.partial`` entry, not one per piece), so a
follower in any process catches up through the store's watch. A process
killed mid-answer loses at most the pieces of its last ``flush_interval``
plus the append under way; whoever finds its run next (a start, a follow, a
stop) takes the owner for dead (``owner_alive``) and stores what had
streamed as an aborted message with the run's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from threadline.agent._events import AgentEnd, MessageStart, MessageUpdate
from threadline.ai._messages import AssistantMessage, Message
from threadline.durable import _agent
from threadline.durable._compaction import CompactionPolicy
from threadline.durable._effects import ApprovalRule
from threadline.durable._events import RunEvent, RunStarted, StoredMessageEnd
from threadline.durable._factory import Factory
from threadline.durable._live import (
    END_KIND,
    PARTIAL_KIND,
    RUN_KIND,
    ActiveRun,
    Frame,
    MessageFrame,
    PartFrame,
    Partial,
    Piece,
    RunClosed,
    RunEnd,
    RunView,
    SessionRuns,
    StopReason,
    StopRequest,
    owner_alive,
    piece_of,
    run_entries,
    scan,
    this_process,
)
from threadline.durable._stop import append_last, linear, request_stop
from threadline.errors import ConfigError, RunActive, SessionExists, SessionNotFound, StoreError
from threadline.session._entries import CustomEntry, Entry, MessageEntry, SessionRecord
from threadline.session._tree import TreeIndex
from threadline.stores._contract import Store, WatchableStore
from threadline.stores._rules import check_session_id

__all__ = ["LiveRun", "LiveRuns", "Snapshot"]

log = logging.getLogger("threadline.durable")

FLUSH_INTERVAL = 0.1
LEASE = 30.0
STOP_POLL = 0.25


def _now() -> datetime:
    return datetime.now(UTC)


class LiveRun:
    """A run this process owns: its frames so far and how it ended."""

    def __init__(self, session_id: str, run_id: str) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self.view = RunView(session_id, run_id)
        self.frames: list[Frame] = [self.view.opened()]
        self.abort = asyncio.Event()
        self.stopping = False
        self.task: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        # Pieces not yet in the log: (message, offset, piece).
        self._unflushed: list[tuple[int, int, Piece]] = []
        self._ended: set[int] = set()
        self._wake = asyncio.Event()
        self._finished = False
        self._appended = time.monotonic()

    @property
    def closed(self) -> RunClosed | None:
        return self.view.closed

    @property
    def stop_reason(self) -> StopReason | None:
        closed = self.view.closed
        return None if closed is None else closed.stop_reason

    async def wait(self) -> RunClosed:
        """Until the run has ended and its end is stored."""
        if self.task is not None:
            await asyncio.shield(self.task)
        assert self.view.closed is not None
        return self.view.closed

    def _push(self, frames: Iterable[Frame]) -> None:
        self.frames.extend(frames)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def frames_after(self, after: str | None, idle: float | None = None
                           ) -> AsyncIterator[list[Frame]]:
        """The frames after the one with id ``after`` (all with None), live until the end,
        in batches of what is there at each wake-up; an empty batch once ``idle`` seconds
        (to twice that) passed with none."""
        frames = self.frames
        i = 0
        if after is not None:
            i = next((k + 1 for k, f in enumerate(frames) if f.id == after), 0)
        quiet = _Quiet(idle) if idle is not None else None
        try:
            while True:
                if i < len(frames):
                    batch = frames[i:]
                    i += len(batch)
                    if quiet is not None:
                        quiet.heard = True
                    yield batch
                    if isinstance(batch[-1], RunClosed):
                        return
                    continue
                # A future each: a follower cancelled while it waits cancels only its own.
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                if quiet is not None:
                    quiet.waiter = waiter
                await waiter
                if i == len(frames):
                    yield []
        finally:
            if quiet is not None:
                quiet.close()


class _Quiet:
    """One timer per follower, not one per wait: every ``idle`` seconds it wakes the
    follower's waiter if nothing was heard since the last time."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.heard = False
        self.waiter: asyncio.Future[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(idle, self._tick)

    def _tick(self) -> None:
        if not self.heard and self.waiter is not None:
            _wake(self.waiter)
        self.heard = False
        self._timer = asyncio.get_running_loop().call_later(self.idle, self._tick)

    def close(self) -> None:
        self._timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class Snapshot:
    """A session as a reload should show it: the path, and the run going on."""

    path: list[Entry]
    active: str | None
    """The run going on (its id), if any."""
    pending: tuple[int, AssistantMessage] | None
    """That run's assistant message as far as it streamed (its index in the run)."""


class LiveRuns:
    """Starts, follows and stops a store's live runs; owns the runs it starts.

    ``factory`` builds each run's loop, as for ``durable.open``. The store
    needs ``append_linear`` and ``watch`` (every built-in store has both).
    """

    def __init__(self, store: Store, factory: Factory, *,
                 flush_interval: float = FLUSH_INTERVAL, lease: float = LEASE,
                 stop_poll: float = STOP_POLL,
                 compaction: CompactionPolicy | None = None,
                 approval: ApprovalRule | None = None) -> None:
        self._log = linear(store, "LiveRuns")  # checked once: a Protocol check is slow
        if not isinstance(store, WatchableStore):
            raise ConfigError(f"LiveRuns needs a store with watch(); {type(store).__name__} "
                              "has none (every built-in store has)")
        if not (flush_interval > 0 and lease > 0 and stop_poll > 0):
            raise ConfigError(f"flush_interval, lease and stop_poll must be positive, got "
                              f"{flush_interval!r}, {lease!r} and {stop_poll!r}")
        self.store = store
        self.factory = factory
        self.flush_interval = flush_interval
        self.lease = lease
        self.stop_poll = stop_poll
        self._compaction = compaction
        self._approval = approval
        self._runs: dict[str, LiveRun] = {}
        self._closing = False

    # -- start ----------------------------------------------------------------------

    async def start(self, session_id: str, input: _agent.RunInput, *,
                    create: bool = True) -> LiveRun:
        """Start a run of ``input`` on the session, owned by this worker.

        Creates the session if it is new (unless ``create=False``). Raises
        ``RunActive`` if the session has a run going in any process; nothing
        of ``input`` is stored then.
        """
        session_id = check_session_id(session_id)
        messages = _agent._as_messages(input)
        if self._closing:
            raise ConfigError("LiveRuns is closed: it starts no more runs")
        local = self._runs.get(session_id)
        if local is not None:
            raise RunActive(session_id, local.run_id, this_process(self.lease).owner)
        store = self._log
        try:
            entries = list(await store.load_entries(session_id))
        except SessionNotFound:
            if not create:
                raise
            with contextlib.suppress(SessionExists):
                await store.create_session(SessionRecord(id=session_id))
            entries = list(await store.load_entries(session_id))
        for _ in range(3):
            active = scan(entries).active
            if active is None:
                break
            if owner_alive(active, _now()):
                raise RunActive(session_id, active.id, active.claim.owner)
            await self._recover(session_id, active, entries)
            entries = list(await store.load_entries(session_id))  # a run may have begun
        else:
            raise StoreError(f"session {session_id!r}: a run whose owner is gone could not "
                             "be ended (the log says why)", session_id=session_id)
        claim: CustomEntry[Any] = CustomEntry(kind=RUN_KIND, data=this_process(self.lease))
        (mine,) = await append_last(store, session_id, [claim])
        # The first claim made while no run was active wins (read back, as S24).
        after = await store.load_entries_after(session_id, entries[-1].id if entries else None)
        winner = scan(after).active
        if winner is None or winner.id != mine.id:
            raise RunActive(session_id, winner.id if winner else mine.id,
                            winner.claim.owner if winner else "")
        run = LiveRun(session_id, mine.id)
        self._runs[session_id] = run
        try:
            agent = await _agent.open(self.factory, store=store, session_id=session_id,
                                      compaction=self._compaction, approval=self._approval)
        except BaseException as exc:
            await self._end(run, "error", f"{type(exc).__name__}: {exc}")
            raise
        run.task = asyncio.create_task(self._drive(run, agent, messages),
                                       name=f"threadline run {run.run_id}")
        return run

    def owned(self, session_id: str) -> LiveRun | None:
        """The run of ``session_id`` this worker owns, while it goes on."""
        return self._runs.get(session_id)

    # -- the owner --------------------------------------------------------------------

    async def _drive(self, run: LiveRun, agent: _agent.DurableAgent,
                     messages: list[Message]) -> None:
        flusher = asyncio.create_task(self._flush_loop(run))
        stops = asyncio.create_task(self._watch_stop(run))
        reason: StopReason = "done"
        error: str | None = None
        streaming = [-1]  # the assistant message streaming, counted in the run from 0

        def observe(event: RunEvent) -> None:  # in the run's own task, in order
            streaming[0] = self._report(run, event, streaming[0])

        try:
            async with agent.run(messages, abort=run.abort, observe=observe) as events:
                async for event in events:
                    if isinstance(event, AgentEnd):
                        reason, error = _ended(event, run.stopping)
                    elif isinstance(event, RunStarted):  # its input comes as receipts
                        run._push(run.view.stored(e) for e in agent.repaired
                                  if isinstance(e, MessageEntry))
        except Exception as exc:
            log.exception("session %s: run %s failed", run.session_id, run.run_id)
            reason, error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            run._finished = True
            run._wake.set()
            await _cancelled(stops)
            with contextlib.suppress(Exception):
                await flusher
            await self._end(run, reason, error)

    @staticmethod
    def _report(run: LiveRun, event: RunEvent, message: int) -> int:
        """Turn one event of the run into frames; the message streaming after it."""
        view = run.view
        if type(event) is MessageUpdate:
            piece = piece_of(event.event)
            if piece is not None:
                frame = view.part(message, piece)
                run._unflushed.append((message, frame.offset, piece))
                run._push((frame,))
        elif isinstance(event, StoredMessageEnd):
            if isinstance(event.message, AssistantMessage):
                run._ended.add(message)
                run._wake.set()
            frames: list[Frame] = []
            for entry in event.entries:
                if isinstance(entry, MessageEntry):
                    frames += view.message(entry)
            run._push(frames)
        elif isinstance(event, MessageStart) and isinstance(event.message, AssistantMessage):
            return view.assistant
        return message

    async def _end(self, run: LiveRun, reason: StopReason, error: str | None) -> None:
        """Store what is left to flush and the run's end, then tell the followers."""
        try:
            await self._flush(run)
            end = CustomEntry(kind=END_KIND, data=RunEnd(run=run.run_id, stop_reason=reason,
                                                         error=error))
            await append_last(self._log, run.session_id, [end])
        except Exception:
            # The run's messages are stored; the next one to find the run takes
            # its owner for dead once this process is gone.
            log.exception("session %s: storing the end of run %s failed", run.session_id,
                          run.run_id)
        finally:
            if self._runs.get(run.session_id) is run:
                del self._runs[run.session_id]
            run._push((run.view.close(reason, error),))

    async def _flush_loop(self, run: LiveRun) -> None:
        heartbeat = self.lease / 3
        while not run._finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run._wake.wait(), self.flush_interval)
            run._wake.clear()
            if run._finished:
                return  # the owner flushes the rest with the run's end
            try:
                await self._flush(run)
                if time.monotonic() - run._appended > heartbeat:
                    await self._append(run, [CustomEntry(kind=PARTIAL_KIND,
                                                         data=Partial(run=run.run_id))])
            except Exception:
                log.exception("session %s: storing what run %s streamed failed; followers "
                              "in other processes wait for its next flush", run.session_id,
                              run.run_id)

    async def _flush(self, run: LiveRun) -> None:
        """One ``partial`` per message with pieces not yet stored (or just ended)."""
        pieces, run._unflushed = run._unflushed, []
        ended, run._ended = run._ended, set()
        batch: list[Entry] = []
        by_message: dict[int, list[tuple[int, Piece]]] = {}
        for message, offset, piece in pieces:
            by_message.setdefault(message, []).append((offset, piece))
        for message in sorted(by_message.keys() | ended):
            got = by_message.get(message, [])
            batch.append(CustomEntry(kind=PARTIAL_KIND, data=Partial(
                run=run.run_id, message=message, start=got[0][0] if got else 0,
                pieces=[p for _, p in got], last=message in ended)))
        if batch:
            try:
                await self._append(run, batch)
            except BaseException:
                run._unflushed[:0] = pieces  # tried again with the next flush
                run._ended |= ended
                raise

    async def _append(self, run: LiveRun, batch: Sequence[Entry]) -> None:
        await append_last(self._log, run.session_id, batch)
        run._appended = time.monotonic()

    async def _watch_stop(self, run: LiveRun) -> None:
        """Abort the run when a stop for it is stored by another process (a stop made
        through this worker aborts it at once). Read every ``stop_poll`` seconds: the
        store's watch would wake for each of the run's own partials."""
        store = self._log
        after = run.run_id
        while True:
            await asyncio.sleep(self.stop_poll)
            try:
                entries = await store.load_entries_after(run.session_id, after)
            except StoreError:
                log.warning("session %s: looking for a stop of run %s failed; looking again",
                            run.session_id, run.run_id, exc_info=True)
                continue
            for entry in entries:
                if (isinstance(entry, CustomEntry) and isinstance(entry.data, StopRequest)
                        and entry.data.run == run.run_id):
                    run.stopping = True
                    run.abort.set()
                    return
            if entries:
                after = entries[-1].id

    # -- anyone --------------------------------------------------------------------------

    async def stop(self, session_id: str, run_id: str | None = None, *, reason: str = "",
                   by: str = "") -> CustomEntry[Any] | None:
        """Store a stop for the session's active run; None when no such run is active.

        The owner, here or in another process, ends the run with stop reason
        ``stopped``. A run whose owner is gone is ended here, the same way.
        """
        record = await request_stop(self.store, session_id, run_id, reason=reason, by=by)
        if record is None:
            return None
        local = self._runs.get(session_id)
        if local is not None and local.run_id == record.data.run:
            local.stopping = True
            local.abort.set()
        else:
            await self.active(session_id)  # ends it now if its owner is gone
        return record

    async def active(self, session_id: str) -> str | None:
        """The id of the session's run going on, if any; a run whose owner is gone is
        ended first (its aborted message stored), so this returns None for it."""
        local = self._runs.get(session_id)
        if local is not None:
            return local.run_id
        entries = list(await self.store.load_entries(session_id))
        active = scan(entries).active
        if active is None:
            return None
        if owner_alive(active, _now()):
            return active.id
        await self._recover(session_id, active, entries)
        return None

    async def snapshot(self, session_id: str) -> Snapshot:
        """The active path, and the run going on with what it streamed so far."""
        local = self._runs.get(session_id)
        entries = list(await self.store.load_entries(session_id))
        state = scan(entries)
        if local is None and state.active is not None and not owner_alive(state.active,
                                                                             _now()):
            await self._recover(session_id, state.active, entries)
            entries = list(await self.store.load_entries(session_id))
            state = scan(entries)
        path = TreeIndex(entries, session_id=session_id).path()
        if local is not None:
            return Snapshot(path, local.run_id, local.view.pending_message())
        if state.active is None:
            return Snapshot(path, None, None)
        view = RunView(session_id, state.active.id)
        for entry in run_entries(entries, state.active.id) or ():
            view.feed(entry)
        return Snapshot(path, state.active.id, view.pending_message())

    async def follow(self, session_id: str, *, after: str | None = None,
                     run_id: str | None = None) -> AsyncIterator[Frame]:
        """The frames of a run, from any process, live until it ends.

        ``after`` (a frame id) resumes right after that frame, in its run;
        ``run_id`` picks a run; with neither, the active run from its start.
        Yields nothing when there is no such run (or none is active).
        """
        async for batch in self.follow_batches(session_id, after=after, run_id=run_id):
            for frame in batch:
                yield frame

    def follow_batches(self, session_id: str, *, after: str | None = None,
                       run_id: str | None = None, idle: float | None = None
                       ) -> AsyncIterator[list[Frame]]:
        """``follow`` in batches: the frames there are at each wake-up (what a server
        writes in one go), and an empty batch after ``idle`` quiet seconds."""
        if after is not None:
            run_id = after.split(".", 1)[0]
        local = self._runs.get(session_id)
        if local is not None and run_id in (None, local.run_id):
            return local.frames_after(after, idle)  # not wrapped: one generator less a frame
        return self._follow_log(session_id, run_id, after, idle)

    async def _follow_log(self, session_id: str, run_id: str | None, after: str | None,
                          idle: float | None) -> AsyncIterator[list[Frame]]:
        store = self.store
        assert isinstance(store, WatchableStore)
        entries = list(await store.load_entries(session_id))
        state = scan(entries)
        run_id = run_id or (state.active.id if state.active is not None else None)
        mine = run_entries(entries, run_id) if run_id is not None else None
        if run_id is None or mine is None:
            return
        view = RunView(session_id, run_id)
        skipping = after is not None and after != run_id
        last = entries[-1].id
        pending: list[Frame] = [] if after is not None else [view.opened()]
        pending += [f for e in mine for f in view.feed(e)]
        watcher: _Watcher | None = None
        active = state.active if state.active and state.active.id == run_id else None
        await self._end_if_gone(session_id, active, entries)  # its end comes by the watch
        check = min(2.0, self.lease / 3) if idle is None else min(2.0, self.lease / 3, idle)
        try:
            while True:
                if skipping:
                    pending, skipping = _after(pending, after)
                if pending:
                    yield pending
                if view.closed is not None:
                    return
                if watcher is None:
                    watcher = _Watcher(store, session_id, last)
                got = await watcher.next(check)
                if got is None:  # quiet: is the owner still there?
                    if not await self._end_if_gone(session_id, active, None) \
                            and idle is not None:
                        yield []
                    pending = []
                    continue
                if active is not None:
                    scan(got, SessionRuns(active=active))
                pending = [f for e in got for f in view.feed(e)]
        finally:
            if watcher is not None:
                await watcher.close()

    async def _end_if_gone(self, session_id: str, active: ActiveRun | None,
                           entries: list[Entry] | None) -> bool:
        """End ``active`` if its owner is gone; whether it did."""
        if active is None or owner_alive(active, _now()):
            return False
        await self._recover(session_id, active, entries)
        return True

    async def _recover(self, session_id: str, active: ActiveRun,
                       entries: list[Entry] | None) -> None:
        """End ``active``, whose owner is gone: store what its pending message had streamed
        as an aborted message, then its end; the same bytes whoever does it."""
        if entries is None:
            entries = list(await self.store.load_entries(session_id))
        view = RunView(session_id, active.id)
        for entry in run_entries(entries, active.id) or ():
            view.feed(entry)
        if view.closed is not None:
            return
        when = active.seen
        batch: list[Entry] = []
        pending = view.pending_message()
        if pending is not None and pending[0] == view.assistant and pending[1].content:
            batch.append(MessageEntry(id=f"{active.id}-aborted", timestamp=when,
                                      message=pending[1]))
        stopped = active.stop is not None or view.stopping
        batch.append(CustomEntry(id=f"{active.id}-end", timestamp=when, kind=END_KIND,
                                 data=RunEnd(run=active.id, recovered=True,
                                             stop_reason="stopped" if stopped
                                             else "interrupted")))
        try:
            await append_last(self._log, session_id, batch)
        except StoreError:
            # Another process ended it first (the same ids, other bytes), or the
            # store failed: either way the log says what happened.
            log.info("session %s: ending run %s, whose owner is gone, was refused",
                     session_id, active.id, exc_info=True)
        else:
            log.warning("session %s: run %s lost its owner %s; stored what it streamed",
                        session_id, active.id, active.claim.owner)

    async def close(self) -> None:
        """Abort every run this worker owns and wait for their ends to be stored.

        They end with stop reason ``interrupted`` (no stop was asked for).
        """
        self._closing = True
        runs = list(self._runs.values())
        for run in runs:
            run.abort.set()
        for run in runs:
            with contextlib.suppress(Exception):
                await run.wait()


def _after(frames: list[Frame], after: str | None) -> tuple[list[Frame], bool]:
    """The frames after the one with id ``after``, and whether it is still to come.

    A piece the log never got (its owner died before the flush) is passed
    once its message, or a later frame, comes: that frame starts the rest.
    """
    lost = _piece_at(after)
    for i, frame in enumerate(frames):
        if frame.id == after:
            return frames[i + 1:], False
        if lost is not None and _beyond(frame, *lost):
            return frames[i:], False
    return [], True


def _piece_at(frame_id: str | None) -> tuple[int, int] | None:
    """(message, offset) of a part frame's id."""
    parts = (frame_id or "").split(".")
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2])
    return None


def _beyond(frame: Frame, message: int, offset: int) -> bool:
    if isinstance(frame, PartFrame):
        return frame.message > message or (frame.message == message and frame.offset > offset)
    if isinstance(frame, MessageFrame):
        return frame.index is not None and frame.index >= message
    return isinstance(frame, RunClosed)


def _ended(event: AgentEnd, stopping: bool) -> tuple[StopReason, str | None]:
    error = event.error
    if error is None:
        return event.stop_reason, None
    if event.stop_reason == "budget":
        return "budget", str(error)
    if isinstance(error, asyncio.CancelledError):
        return ("stopped" if stopping else "interrupted"), None
    return "error", f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class _Watcher:
    """``store.watch`` in a task of its own, so a follower can wait for it with a timeout."""

    def __init__(self, store: WatchableStore, session_id: str, after: str) -> None:
        self._queue: asyncio.Queue[Entry | BaseException] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(store, session_id, after))

    async def _run(self, store: WatchableStore, session_id: str, after: str) -> None:
        try:
            async for entry in store.watch(session_id, after):
                self._queue.put_nowait(entry)
                after = entry.id
        except Exception as exc:
            self._queue.put_nowait(exc)

    async def next(self, wait: float) -> list[Entry] | None:
        """What arrived (waiting up to ``wait`` seconds for the first), or None."""
        try:
            first = await asyncio.wait_for(self._queue.get(), wait)
        except TimeoutError:
            return None
        got = [first]
        while not self._queue.empty():
            got.append(self._queue.get_nowait())
        entries: list[Entry] = []
        for item in got:
            if isinstance(item, BaseException):
                raise item
            entries.append(item)
        return entries

    async def close(self) -> None:
        await _cancelled(self._task)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end. Cancelled again until it does:
    ``asyncio.wait_for`` in Python 3.11 drops a cancellation that comes just
    as what it waits for completes."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.5)
    if not task.cancelled() and task.exception() is not None:
        log.debug("a cancelled task had failed", exc_info=task.exception())
