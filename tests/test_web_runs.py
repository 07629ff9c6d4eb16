"""Live runs (``durable.LiveRuns``): one run per session, stored stops, partials, recovery.

Two ``LiveRuns`` on two store objects stand for two server processes where a
test needs no real process; the crash tests kill a real child with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import pytest

from support.stores import StoreSpec, close
from support.web import words
from threadline import durable
from threadline.ai import AssistantMessage, TextPart, UserMessage
from threadline.durable import LiveRuns, MessageFrame, PartFrame, Partial, RunClosed, RunEnd
from threadline.errors import RunActive
from threadline.session import CustomEntry, MessageEntry, build_context
from threadline.session._tree import TreeIndex
from threadline.stores import Store, WatchableStore
from threadline.testing import Call, Gate, ScriptedModel, Text, Turn, assert_valid_for_providers

SID = "ann:chat"


def gated(n: int) -> tuple[ScriptedModel, list[asyncio.Event]]:
    """A model whose reply streams ``n`` words, word k only once gate k is set."""
    gates = [asyncio.Event() for _ in range(n)]
    blocks: list[Any] = []
    for gate, w in zip(gates, words(n), strict=True):
        blocks += [Gate(gate), Text(w)]
    return ScriptedModel([Turn(*blocks), Turn(Text("again"))]), gates


async def frames_until(run: durable.LiveRun, count: int) -> None:
    seen = 0
    async for batch in run.frames_after(None):
        seen += len(batch)
        if seen >= count:
            return


async def partials(store: Store, sid: str) -> list[Partial]:
    return [e.data for e in await store.load_entries(sid)
            if isinstance(e, CustomEntry) and isinstance(e.data, Partial) and e.data.pieces]


async def wait_for_partials(store: Store, sid: str, pieces: int) -> None:
    """Until ``pieces`` pieces are stored in partials, by whatever process."""
    assert isinstance(store, WatchableStore)
    got = 0
    watch = store.watch(sid)
    async for entry in watch:
        if isinstance(entry, CustomEntry) and isinstance(entry.data, Partial):
            got += len(entry.data.pieces)
            if got >= pieces:
                break
    await watch.aclose()  # type: ignore[attr-defined]


async def test_s51_a_second_start_is_refused_naming_the_run(store_spec: StoreSpec) -> None:
    a_store, b_store = store_spec.open(), store_spec.open()
    model, gates = gated(3)
    a = LiveRuns(a_store, durable.model(model), flush_interval=0.01)
    b = LiveRuns(b_store, durable.model(model), flush_interval=0.01)
    run = await a.start(SID, "first")
    await frames_until(run, 2)  # the input is stored
    before = len(await b_store.load_entries(SID))
    for other in (a, b):
        with pytest.raises(RunActive) as refused:
            await other.start(SID, "second")
        assert refused.value.run_id == run.run_id and refused.value.session_id == SID
        assert str(os.getpid()) in refused.value.owner
    stored = await b_store.load_entries(SID)
    assert len(stored) == before  # nothing of the refused input
    assert not any(isinstance(e, MessageEntry) and e.message == UserMessage.of("second")
                   for e in stored)
    for gate in gates:
        gate.set()
    assert (await run.wait()).stop_reason == "done"
    again = await b.start(SID, "second")
    assert (await again.wait()).stop_reason == "done"
    await close(a_store)
    await close(b_store)


async def test_s51_of_two_starts_at_once_exactly_one_wins(shared_store_spec: StoreSpec) -> None:
    stores = [shared_store_spec.open() for _ in range(4)]
    # The winner's answer waits for ``hold``: a run that ended at once would
    # let a later start begin a run of its own, one after the other.
    hold = asyncio.Event()
    model = ScriptedModel([Turn(Text("one answer")), Turn(Gate(hold), Text("held answer"))])
    workers = [LiveRuns(s, durable.model(model)) for s in stores]
    await workers[0].start(SID, "create it")  # so every start races on the claim alone
    await asyncio.sleep(0)
    await workers[0].owned(SID).wait()  # type: ignore[union-attr]
    got = await asyncio.gather(*(w.start(SID, f"start {i}") for i, w in enumerate(workers)),
                               return_exceptions=True)
    won = [g for g in got if isinstance(g, durable.LiveRun)]
    lost = [g for g in got if isinstance(g, RunActive)]
    assert len(won) == 1 and len(lost) == 3, got
    assert {e.run_id for e in lost} == {won[0].run_id}
    hold.set()
    await won[0].wait()
    inputs = [e for e in await stores[0].load_entries(SID)
              if isinstance(e, MessageEntry) and isinstance(e.message, UserMessage)]
    assert len(inputs) == 2  # the first run's and the winner's: no loser's input
    for s in stores:
        await close(s)


async def test_s52_a_stop_from_another_process_ends_the_run_keeping_what_streamed(
        store_spec: StoreSpec) -> None:
    a_store, b_store = store_spec.open(), store_spec.open()
    model, gates = gated(6)
    a = LiveRuns(a_store, durable.model(model), flush_interval=0.01)
    b = LiveRuns(b_store, durable.model(model), flush_interval=0.01)
    run = await a.start(SID, "talk")
    for gate in gates[:3]:
        gate.set()
    await frames_until(run, 2 + 3 * 3)  # opened, the input, three words of three pieces
    record = await b.stop(SID, by="ann")
    assert record is not None and record.data.run == run.run_id
    closed = await run.wait()
    assert closed.stop_reason == "stopped" and run.stop_reason == "stopped"
    assert await b.stop(SID) is None  # nothing is going on any more
    stored = await b_store.load_entries(SID)
    answers = [e.message for e in stored
               if isinstance(e, MessageEntry) and isinstance(e.message, AssistantMessage)]
    assert len(answers) == 1
    assert answers[0].stop_reason == "aborted"
    assert answers[0].text == "".join(words(3))
    ends = [e.data for e in stored if isinstance(e, CustomEntry) and isinstance(e.data, RunEnd)]
    assert [(x.run, x.stop_reason) for x in ends] == [(run.run_id, "stopped")]
    # The aborted message is what the user saw; the next turn's context is valid.
    context = build_context(TreeIndex(stored, session_id=SID).path())
    assert_valid_for_providers(context)
    assert context[-1] == answers[0]
    await close(a_store)
    await close(b_store)


async def test_s52_a_client_leaving_changes_nothing_in_the_log() -> None:
    from threadline.stores import MemoryStore

    store = MemoryStore()
    model, gates = gated(4)
    runs = LiveRuns(store, durable.model(model), flush_interval=0.01)
    run = await runs.start(SID, "talk")
    gates[0].set()
    async for frame in runs.follow(SID):
        if isinstance(frame, PartFrame):
            break  # the client goes away
    for gate in gates[1:]:
        gate.set()
    assert (await run.wait()).stop_reason == "done"
    stored = await store.load_entries(SID)
    answer = [e.message for e in stored if isinstance(e, MessageEntry)][-1]
    assert isinstance(answer, AssistantMessage) and answer.text == "".join(words(4))
    assert not any(isinstance(e, CustomEntry) and e.kind == "threadline.stop" for e in stored)


async def test_s53_any_process_follows_the_same_frames_and_resumes_after_any_one(
        store_spec: StoreSpec) -> None:
    a_store, b_store = store_spec.open(), store_spec.open()
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text(*words(5)), Gate(gate), Call("lookup", {"q": "x"})),
                           Turn(Text("done"))])
    from threadline.ai import tool

    @tool
    def lookup(q: str) -> str:
        """Look it up.

        Args:
            q: What.
        """
        return f"found {q}"

    factory = durable.model(model, [lookup])
    a = LiveRuns(a_store, factory, flush_interval=0.01)
    b = LiveRuns(b_store, factory, flush_interval=0.01)
    run = await a.start(SID, "look")
    early: list[Any] = []
    streaming = asyncio.Event()

    async def follow_b() -> None:
        async for frame in b.follow(SID):
            early.append(frame)
            if len(early) == 4:
                streaming.set()

    following = asyncio.ensure_future(follow_b())
    await streaming.wait()  # B follows the run while it streams
    gate.set()
    await run.wait()
    await asyncio.wait_for(following, 30)
    live = run.frames
    assert [f.id for f in early] == [f.id for f in live]
    assert early == live
    assert isinstance(live[-1], RunClosed) and live[-1].stop_reason == "done"
    assert len({f.id for f in live}) == len(live)
    # Resuming after frame k gives exactly the frames after it, from any process.
    for k in (0, 1, 3, len(live) // 2, len(live) - 2):
        again = [f async for f in b.follow(SID, after=live[k].id)]
        assert again == live[k + 1:], k
    assert [f async for f in b.follow(SID, after=live[-1].id)] == []
    await close(a_store)
    await close(b_store)


async def test_s53_pieces_are_stored_as_partials_and_never_reach_a_model(
        store_spec: StoreSpec) -> None:
    store = store_spec.open()
    model, gates = gated(6)
    runs = LiveRuns(store, durable.model(model), flush_interval=0.01)
    run = await runs.start(SID, "talk")
    for gate in gates[:4]:
        gate.set()
    await wait_for_partials(store, SID, 4 * 3)
    reader = await durable.open(None, store=store_spec.open(), session_id=SID, repair=False)
    assert reader.messages() == [UserMessage.of("talk")]  # no half message
    snap = await runs.snapshot(SID)
    assert snap.active == run.run_id and snap.pending is not None
    assert snap.pending[1].text == "".join(words(4))
    for gate in gates[4:]:
        gate.set()
    await run.wait()
    stored = await store.load_entries(SID)
    text = "".join(p.text for d in await partials(store, SID) for p in d.pieces if p.op == "t")
    assert text == "".join(words(6))
    final = [e for e in stored if isinstance(e, MessageEntry)][-1]
    assert isinstance(final.message, AssistantMessage) and final.message.text == text
    assert build_context(TreeIndex(stored, session_id=SID).path())[-1] == final.message
    await close(store)
    await close(reader.store)


def test_s53_a_message_stored_before_its_last_partial_waits_for_it() -> None:
    from threadline.durable._live import Piece, RunView

    entries: list[Any] = [
        CustomEntry(id="p1", kind="threadline.partial",
                    data=Partial(run="r", message=0, start=0,
                                 pieces=[Piece("T", 0), Piece("t", 0, "Hel")])),
        MessageEntry(id="m1", message=AssistantMessage(content=(TextPart(text="Hello"),))),
        MessageEntry(id="u2", message=UserMessage.of("tool result stands in")),
        CustomEntry(id="p2", kind="threadline.partial",
                    data=Partial(run="r", message=0, start=2,
                                 pieces=[Piece("t", 0, "lo"), Piece("E", 0)], last=True)),
        CustomEntry(id="end", kind="threadline.run_end",
                    data=RunEnd(run="r", stop_reason="done")),
    ]
    view = RunView("s", "r")
    frames = [f for e in entries for f in view.feed(e)]
    assert [f.id for f in frames] == ["r.0.0", "r.0.1", "r.0.2", "r.0.3", "r.m1", "r.u2", "r.end"]
    # Without its last partial (the owner died), the message fills in what is missing.
    view = RunView("s", "r")
    frames = [f for e in entries[:3] + entries[4:] for f in view.feed(e)]
    parts = [f.piece for f in frames if isinstance(f, PartFrame)]
    assert [(p.op, p.text) for p in parts] == [("T", ""), ("t", "Hel"), ("t", "lo"), ("E", "")]
    assert isinstance(frames[-3], MessageFrame) and frames[-1].id == "r.end"


_OWNER = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from support.stores import StoreSpec
from support.web import slow_model
from threadline import durable

async def main():
    store = StoreSpec(*sys.argv[1:4]).open()
    runs = durable.LiveRuns(store, durable.model(slow_model(200, delay=0.01)),
                            flush_interval=0.02)
    run = await runs.start({sid!r}, "talk")
    print(run.run_id, flush=True)
    await run.wait()

asyncio.run(main())
"""


async def test_s54_a_run_whose_owner_was_killed_ends_with_what_had_streamed(
        shared_store_spec: StoreSpec) -> None:
    tests = os.path.dirname(__file__)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER.format(tests=tests, sid=SID),
        *shared_store_spec.as_argv(), stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    run_id = (await child.stdout.readline()).decode().strip()
    store = shared_store_spec.open()
    try:
        await wait_for_partials(store, SID, 30)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    streamed = "".join(p.text for d in await partials(store, SID) for p in d.pieces
                       if p.op == "t")
    assert streamed and len(streamed) < len("".join(words(200)))
    runs = LiveRuns(store, durable.model(ScriptedModel([Turn(Text("next"))])))
    frames = [f async for f in runs.follow(SID, run_id=run_id)]
    closed = frames[-1]
    assert isinstance(closed, RunClosed) and closed.stop_reason == "interrupted"
    aborted = frames[-2]
    assert isinstance(aborted, MessageFrame) and isinstance(aborted.entry.message,
                                                            AssistantMessage)
    assert aborted.entry.message.stop_reason == "aborted"
    assert aborted.entry.message.text == streamed  # exactly what had streamed
    # Found dead again by another process: stored once.
    other = LiveRuns(shared_store_spec.open(), runs.factory)
    assert await other.active(SID) is None
    stored = await store.load_entries(SID)
    assert sum(isinstance(e, CustomEntry) and isinstance(e.data, RunEnd) for e in stored) == 1
    # A reload's path holds the question and what was answered (S8's leaf, the last entry).
    reader = await durable.open(None, store=store, session_id=SID, repair=False)
    assert reader.messages() == [UserMessage.of("talk"), aborted.entry.message]
    # The session goes on from there.
    run = await runs.start(SID, "again")
    assert (await run.wait()).stop_reason == "done"
    reader = await durable.open(None, store=store, session_id=SID, repair=False)
    assert [m.text for m in reader.messages()] == ["talk", streamed, "again", "next"]
    await close(store)
    await close(other.store)


async def test_s54_an_owner_on_another_host_is_dead_once_its_lease_ran_out() -> None:
    from threadline.durable import RunClaim
    from threadline.session import SessionRecord
    from threadline.stores import MemoryStore

    store = MemoryStore()
    await store.create_session(SessionRecord(id=SID))
    old = durable.RunClaim(owner="elsewhere:1", host="elsewhere.invalid", pid=1, lease=5.0)
    claim = CustomEntry(kind="threadline.run", data=old)
    await store.append_entries(SID, [claim])
    runs = LiveRuns(store, durable.model(ScriptedModel([Turn(Text("hi"))] * 2)))
    with pytest.raises(RunActive):  # its last sign of life is younger than its lease
        await runs.start(SID, "now")
    stale = CustomEntry(kind="threadline.run", data=RunClaim(
        owner="elsewhere:2", host="elsewhere.invalid", pid=2, lease=5.0),
        timestamp=claim.timestamp - timedelta(seconds=60))
    other = "ann:other"
    await store.create_session(SessionRecord(id=other))
    await store.append_entries(other, [stale])
    run = await runs.start(other, "now")
    assert (await run.wait()).stop_reason == "done"
    ends = [e.data for e in await store.load_entries(other)
            if isinstance(e, CustomEntry) and isinstance(e.data, RunEnd)]
    assert [(x.run, x.stop_reason, x.recovered) for x in ends] == [
        (stale.id, "interrupted", True), (run.run_id, "done", False)]


async def test_s11_an_observer_gets_every_event_in_order_and_the_deltas_alone() -> None:
    from threadline.agent import MessageUpdate
    from threadline.durable import StoredMessageEnd
    from threadline.stores import MemoryStore

    store = MemoryStore()
    agent = await durable.open(durable.model(ScriptedModel([Turn(Text(*words(4)))])),
                               store=store, session_id=SID)
    seen: list[Any] = []
    tasks: set[Any] = set()

    def observe(event: Any) -> None:
        seen.append(event)
        tasks.add(asyncio.current_task())

    yielded = [e async for e in agent.run("go", observe=observe)]
    assert [type(e) for e in seen if not isinstance(e, MessageUpdate)] == \
        [type(e) for e in yielded if e.type != "run_started"]
    assert sum(isinstance(e, MessageUpdate) for e in seen) >= 4
    assert not any(isinstance(e, MessageUpdate) for e in yielded)
    assert asyncio.current_task() not in tasks and len(tasks) == 1  # the run's own task
    receipts = [e for e in seen if isinstance(e, StoredMessageEnd)]
    stored = {e.id for e in await store.load_entries(SID)}
    assert receipts and all(e.id in stored for r in receipts for e in r.entries)


async def test_s52_setting_abort_winds_the_run_down_with_its_events() -> None:
    from threadline.agent import AgentEnd
    from threadline.stores import MemoryStore

    store = MemoryStore()
    model, gates = gated(4)
    agent = await durable.open(durable.model(model), store=store, session_id=SID)
    abort = asyncio.Event()
    gates[0].set()
    events: list[Any] = []
    async for event in agent.run("go", abort=abort):
        events.append(event)
        if event.type == "message_update" and getattr(event.event, "delta", None):
            abort.set()
    end = events[-1]
    assert isinstance(end, AgentEnd) and isinstance(end.error, asyncio.CancelledError)
    answer = [e for e in events if e.type == "message_end"][-1].message
    assert answer.stop_reason == "aborted" and answer.text == "w0 "
    assert agent.messages()[-1] == answer
