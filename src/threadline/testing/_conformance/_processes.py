"""The multi-process level: several processes on the same storage, and writers killed mid-call.

For a store that declares the "multi_process" capability: ``store_opener``
(by default ``make_store`` in the child) opens the same storage in a child
process. Each runs a sample in every run and more under ``-m stress``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import warnings
from typing import Any

import pytest

from threadline.ai._messages import UserMessage
from threadline.session._entries import MessageEntry
from threadline.session._ids import new_id
from threadline.stores._contract import Store
from threadline.testing._conformance._base import SuiteBase, sample_and_stress
from threadline.testing._conformance._children import (
    KILL_AFTER_RETURN,
    KILL_BEFORE_CALL,
    StoreOpener,
    kill_inside_append,
    process_append,
    process_create,
)
from threadline.testing._conformance._data import check_concurrent_log

__all__ = ["ProcessTests"]

# How long a child may take before the test gives up on it: a hang guard, not a
# measure (a child that hangs would otherwise hold the run until its timeout).
_CHILD_GUARD = 600.0


class ProcessTests(SuiteBase):
    """Tests that open the store in child processes."""

    @sample_and_stress
    async def test_s4_concurrent_appends_from_processes(self, store: Store, scale: str) -> None:
        opener = self.child_opener()
        sid = await self.new_session(store)
        loop = asyncio.get_running_loop()
        appends = self.scaled(scale, self.process_appends)
        with self.process_pool(self.process_count) as pool:
            chains = await asyncio.gather(*(
                loop.run_in_executor(pool, process_append, opener, sid, w, appends)
                for w in range(self.process_count)
            ))
            winners = await asyncio.gather(*(
                loop.run_in_executor(pool, process_create, opener, "conf-process-race")
                for _ in range(self.process_count)
            ))
        check_concurrent_log(await store.load_entries(sid), chains)
        assert sum(winners) == 1, winners

    @sample_and_stress
    async def test_s14_batch_cut_by_sigkill_is_whole_or_absent(self, store: Store,
                                                              scale: str) -> None:
        # Each child appends one batch of kill_batch entries and SIGKILLs
        # itself at a chosen point (see kill_inside_append): before the call,
        # right after it returned, or at the n-th event of the call's own
        # work, so those kills land inside the call by construction. Whatever
        # the timing, a load shows the whole batch or none of it; how the
        # kills inside the call split between the two is counted, never
        # required.
        opener = self.child_opener()
        await self._kill_child(store, opener, KILL_BEFORE_CALL, expect=0)
        # The first uncut call says how many events the call makes; the kill
        # points spread over them (kill_points).
        _, events = await self._kill_child(store, opener, KILL_AFTER_RETURN,
                                           expect=self.kill_batch)
        outcomes = {"absent": 0, "whole": 0, "returned first": 0}
        for point in kill_points(events, self.scaled(scale, self.kill_rounds)):
            outcome, _ = await self._kill_child(store, opener, point)
            outcomes[outcome] += 1
        assert outcomes["absent"] + outcomes["whole"] > 0, (
            f"no kill landed inside append_entries: {outcomes}")
        print(f"S14: kills inside one append_entries of {self.kill_batch} entries "
              f"({events} events): {outcomes}")

    async def _kill_child(self, store: Store, opener: StoreOpener, point: int,
                          expect: int | None = None) -> tuple[str, int]:
        """Run one ``kill_inside_append`` child; check and name what its kill left.

        Returns ``("absent" | "whole" | "returned first" | "before", events)``:
        a kill inside the call that left nothing or everything, a call that
        returned before its kill point (then the batch must be whole), or a
        kill before the call.
        """
        context = multiprocessing.get_context("spawn")
        sid = f"conf-kill-{new_id()}"
        ours, theirs = context.Pipe(duplex=False)
        child = context.Process(target=kill_inside_append,
                                args=(opener, sid, self.kill_batch, point, theirs))
        child.start()
        theirs.close()
        said = await asyncio.to_thread(_messages, ours)
        await asyncio.to_thread(child.join, _CHILD_GUARD)
        if child.exitcode is None:
            child.kill()
            pytest.fail(f"a child appending {self.kill_batch} entries did not finish: {said}")
        for what, detail in said:
            if what == "error":
                pytest.fail(f"the child appending {self.kill_batch} entries failed:\n{detail}")
        assert said, f"the child said nothing (exit code {child.exitcode})"
        what, events = said[0]
        if what == "returned" and point > 0:
            assert child.exitcode == 0, f"the child exited with {child.exitcode}"
        else:
            assert child.exitcode == -signal.SIGKILL, f"the child exited with {child.exitcode}"
        count = await self._batch_left(store, sid)
        if what == "returned":
            expect = self.kill_batch  # acknowledged, so it must all be there
        assert count in (0, self.kill_batch), (
            f"{count} of {self.kill_batch} entries of one append_entries call stored "
            f"after a SIGKILL ({what}, event {events})")
        if expect is not None:
            assert count == expect, (
                f"{count} of {self.kill_batch} entries stored after a SIGKILL {what} "
                f"(expected {expect})")
        if what == "killed":
            return ("whole" if count else "absent"), events
        return ("returned first" if what == "returned" else what), events

    async def _batch_left(self, store: Store, session_id: str) -> int:
        """How many entries of the child's batch a load shows; they must be its own, in order."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a torn last line
            loaded = await store.load_entries(session_id)
        numbers = [e.message.text.split(" ", 1)[0] for e in loaded
                   if isinstance(e, MessageEntry) and isinstance(e.message, UserMessage)]
        assert numbers == [str(n) for n in range(len(loaded))], (
            "the entries stored are not the child's batch in its order")
        return len(loaded)


def kill_points(events: int, rounds: int) -> list[int]:
    """``rounds`` events of a call of ``events`` to kill at, in order.

    The first event, then closing in on the last by halving the distance each
    time (a call spends most of its events encoding, and writes and commits
    in its last few), then the events just before the last, one by one.
    """
    points: list[int] = []
    for n in range(events.bit_length()):
        point = max(1, events - (events >> n))
        if point not in points:
            points.append(point)
    points += [e for e in range(events - 1, 0, -1) if e not in points]
    return points[:rounds]


def _messages(conn: Any) -> list[tuple[str, Any]]:
    """Everything the child sent, up to its end of the pipe closing (it exited)."""
    out: list[tuple[str, Any]] = []
    while conn.poll(_CHILD_GUARD):
        try:
            out.append(conn.recv())
        except EOFError:
            break
    conn.close()
    return out
