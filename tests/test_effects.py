"""Durable tool execution in one process, on every store (S19-S24).

Each test plays several agents against one store, as several processes would:
a fresh handle per agent (the memory store has only one), so what one agent
wrote is seen by the next only through the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from support.effects import (
    Counter,
    Stores,
    assert_one_result_each,
    crashed_turn,
    durable_user,
    pay_tool,
    refund_script,
    refund_tool,
    stores,
)
from threadline import durable
from threadline.agent import AgentEnd
from threadline.ai import ToolCall, ToolContext, ToolResultMessage, tool
from threadline.durable import (
    ApprovalRequested,
    RunEvent,
    RunStarted,
    ToolCallInDoubt,
    ToolStarted,
    pending_approvals,
)
from threadline.errors import AgentError, ApprovalError, DecisionConflict
from threadline.session import CustomEntry, Entry, MessageEntry
from threadline.stores import Store
from threadline.testing import (
    Call,
    ScriptedModel,
    Turn,
    assert_event_order,
    assert_valid_for_providers,
)

__all__ = ["stores"]  # the fixtures, imported for these tests


def records(entries: Sequence[Entry], kind: str) -> list[CustomEntry[Any]]:
    return [e for e in entries if isinstance(e, CustomEntry) and e.kind == kind]


def tool_results(entries: Sequence[Entry]) -> list[ToolResultMessage]:
    return [e.message for e in entries
            if isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)]


# -- S19 -------------------------------------------------------------------------


async def test_s19_started_record_is_durable_before_the_effect_with_a_stable_key(
    stores: Stores, tmp_path: Path
) -> None:
    seen: list[tuple[str, list[Entry]]] = []

    @tool(side_effects=True)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge."""
        # Read back through a separate handle: the record is in the store now.
        seen.append((ctx.idempotency_key, await stores.open().load_entries("s19")))
        return "charged"

    @tool
    def look(q: str) -> str:
        """Read only."""
        return q

    lm = ScriptedModel([Turn(Call("charge", {"amount": 5}, id="c1"), Call("look", {"q": "x"},
                                                                            id="c2")),
                        Turn.text("ok")])
    agent = await durable.open(durable.model(lm, [charge, look]), store=stores.open(),
                               session_id="s19")
    await agent.run("pay").collect()
    ((key, before),) = seen
    (started,) = records(before, "threadline.tool_started")
    assert started.data == ToolStarted(call_id="c1", tool_name="charge", idempotency_key=key)
    assert not tool_results(before)  # the record precedes the effect and the result
    # One plan (in the assistant's append), one started record, nothing for `look`.
    stored = await stores.open().load_entries("s19")
    assert [e.data.calls for e in records(stored, "threadline.tool_plan")] == [("c1",)]
    assert len(records(stored, "threadline.tool_started")) == 1
    # The same key comes back from the log in a new agent.
    again = await durable.open(None, store=stores.open(), session_id="s19")
    agent.branch(again.path()[1].id)
    assert len(key) == 32
    from threadline.durable._effects import idempotency_key

    assert idempotency_key(again.path()[1].id, "c1") == key
    assert_valid_for_providers(lm.requests[-1].messages)


async def test_s19_one_extra_durable_append_per_tracked_call(stores: Stores) -> None:
    class Counting:
        def __init__(self, inner: Store) -> None:
            self.inner, self.appends = inner, 0

        async def create_session(self, record: Any) -> None:
            await self.inner.create_session(record)

        async def load_entries(self, sid: str) -> list[Entry]:
            return await self.inner.load_entries(sid)

        async def append_entries(self, sid: str, entries: Sequence[Entry]) -> None:
            self.appends += 1
            await self.inner.append_entries(sid, entries)

    async def appends(side_effects: bool, sid: str) -> int:
        @tool(name="step", side_effects=side_effects)
        def step(n: int) -> str:
            """Step."""
            return str(n)

        lm = ScriptedModel([Turn(Call("step", {"n": 1}), Call("step", {"n": 2})),
                            Turn(Call("step", {"n": 3})), Turn.text("done")])
        counting = Counting(stores.open())
        agent = await durable.open(durable.model(lm, [step]), store=counting, session_id=sid)
        await agent.run("go").collect()
        return counting.appends

    assert await appends(True, "tracked") == await appends(False, "plain") + 3


# -- S20 -------------------------------------------------------------------------


async def test_s20_open_classifies_unanswered_calls_and_repair_leaves_them(
    stores: Stores,
) -> None:
    calls = [ToolCall(id="a", name="pay", arguments={"order": "1"}),
             ToolCall(id="b", name="pay", arguments={"order": "2"})]
    await crashed_turn(stores, "s20", calls, started=["a"])
    agent = await durable.open(None, store=stores.open(), session_id="s20")
    assert agent.repaired == ()  # tracked calls are the ledger's, not repair's
    states = {s.call.id: s for s in agent.tool_calls()}
    assert states["a"].status == "in_doubt" and states["a"].attempts == 1
    assert states["b"].status == "never_started" and states["b"].attempts == 0
    assert [s.call.id for s in agent.in_doubt()] == ["a"]
    assert_valid_for_providers(agent.messages())  # the view stays valid meanwhile
    # A new run cannot leave them behind.
    counter_lm = ScriptedModel([Turn.text("x")])
    runner = await durable.open(durable.model(counter_lm), store=stores.open(),
                                session_id="s20")
    with pytest.raises(AgentError, match=r"a \(in doubt\), b \(never started\)"):
        await runner.run("next").collect()


# -- S21 -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["safe", "never", "never+reconcile"])
async def test_s21_in_doubt_calls_follow_the_replay_policy(
    stores: Stores, tmp_path: Path, policy: str
) -> None:
    counter = Counter(tmp_path / "effects.db")
    replay = "safe" if policy == "safe" else "never"
    pay = pay_tool(counter, replay=replay, reconcile=policy.endswith("reconcile"))
    calls = [ToolCall(id="done", name="pay", arguments={"order": "1"}),
             ToolCall(id="lost", name="pay", arguments={"order": "2"}),
             ToolCall(id="fresh", name="pay", arguments={"order": "3"})]
    await crashed_turn(stores, "s21", calls, started=["done", "lost"])
    agent = await durable.open(None, store=stores.open(), session_id="s21")
    keys = {s.call.id: s.idempotency_key for s in agent.tool_calls()}
    counter.hit(keys["done"], dedupe=True)  # its effect happened before the crash

    lm = ScriptedModel([Turn.text("all settled")])
    resumed = await durable.open(durable.model(lm, [pay]), store=stores.open(),
                                 session_id="s21")
    events = await resumed.continue_run().collect()
    doubts = {e.call_id: e.outcome for e in events if isinstance(e, ToolCallInDoubt)}
    results = assert_one_result_each(resumed.path())
    table = counter.table()
    assert table[keys["fresh"]] == (1, 1)  # never started: it runs, once
    if policy == "safe":
        assert doubts == {"done": "rerun", "lost": "rerun"}
        assert table[keys["done"]] == (2, 1)  # re-run, deduplicated by its key
        assert table[keys["lost"]] == (1, 1)
        assert resumed.in_doubt() == []
    elif policy == "never":
        assert doubts == {"done": "unknown", "lost": "unknown"}
        assert table[keys["done"]] == (1, 1) and keys["lost"] not in table
        for cid in ("done", "lost"):
            r = results[cid]
            assert r.is_error and "unknown" in r.text and "Do not call it again" in r.text
            assert r.details["outcome"] == "unknown"
            assert r.details["idempotency_key"] == keys[cid]
        assert sorted(s.call.id for s in resumed.in_doubt()) == ["done", "lost"]
    else:
        assert doubts == {"done": "reconciled", "lost": "not_happened"}
        assert results["done"].text == "paid (found by reconcile)"
        assert results["done"].details["outcome"] == "reconciled"
        assert table[keys["done"]] == (1, 1) and table[keys["lost"]] == (1, 1)
    # The model saw every call answered once, and went on to its next turn.
    assert_valid_for_providers(lm.requests[0].messages)
    assert isinstance(resumed.path()[-1], MessageEntry)
    assert resumed.path()[-1].message.text == "all settled"


# -- S22 -------------------------------------------------------------------------


async def test_s22_continue_run_in_a_new_agent_and_never_twice(stores: Stores,
                                                               tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    pay = pay_tool(counter, replay="never")
    calls = [ToolCall(id="a", name="pay", arguments={"order": "1"})]
    await crashed_turn(stores, "s22", calls, started=[])
    lm = ScriptedModel([Turn.text("paid")])
    agent = await durable.open(durable.model(lm, [pay]), store=stores.open(),
                               session_id="s22")
    assert agent.repaired == ()
    events = await agent.continue_run().collect()
    end = events[-1]
    assert isinstance(end, AgentEnd) and end.stop_reason == "done"
    assert list(counter.table().values()) == [(1, 1)]
    results = assert_one_result_each(agent.path())
    assert results["a"].text.startswith("paid 1")
    # Nothing left: a second continue (here or in a new agent) does nothing.
    again = await durable.open(durable.model(ScriptedModel([]), [pay]), store=stores.open(),
                               session_id="s22")
    assert again.repaired == ()
    assert [type(e).__name__ for e in await again.continue_run().collect()] == ["RunStarted"]
    assert sum(a for _, a in counter.table().values()) == 1


async def test_s22_continue_after_input_stored_asks_the_model(stores: Stores) -> None:
    agent = await durable.open(None, store=stores.open(), session_id="s22b")
    await agent.append(durable_user("hello?"))
    lm = ScriptedModel([Turn.text("hi")])
    resumed = await durable.open(durable.model(lm), store=stores.open(), session_id="s22b")
    await resumed.continue_run().collect()
    assert [type(m).__name__ for m in resumed.messages()] == ["UserMessage", "AssistantMessage"]


# -- S23 -------------------------------------------------------------------------


async def test_s23_approval_outlives_the_agent_that_asked(stores: Stores,
                                                          tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    refund = refund_tool(counter)
    a = await durable.open(durable.model(refund_script(), [refund]), store=stores.open(),
                           session_id="s23")
    events: list[RunEvent] = await a.run("refund both").collect()
    (asked,) = [e for e in events if isinstance(e, ApprovalRequested)]
    assert (asked.call_id, asked.arguments, asked.reason) == (
        "big", {"order": "o2", "amount": 500}, "refund of 500 is over 100")
    end = events[-1]
    assert isinstance(end, AgentEnd) and end.stop_reason == "awaiting_approval"
    assert end.awaiting_approval == ("big",)
    assert_event_order([e for e in events if not isinstance(e, RunStarted | ApprovalRequested)])
    assert len(counter.table()) == 1  # the small refund ran; the big one waits
    assert [p.call_id for p in a.pending_approvals()] == ["big"]
    del a

    # Another agent (another process) finds it, across sessions, in the store.
    other = await durable.open(None, store=stores.open(), session_id="quiet")
    await other.append(durable_user("nothing to approve here"))
    found = await pending_approvals(stores.open())
    assert [(p.session_id, p.call_id, p.tool_name) for p in found] == [("s23", "big", "refund")]
    b = await durable.open(None, store=stores.open(), session_id="s23")
    assert b.repaired == ()
    await b.approve("big", by="ann", reason="customer is right")
    assert await pending_approvals(stores.open()) == []

    lm = ScriptedModel([Turn.text("both refunded")])
    c = await durable.open(durable.model(lm, [refund]), store=stores.open(), session_id="s23")
    await c.continue_run().collect()
    results = assert_one_result_each(c.path())
    assert results["big"].text == "refunded 500 on o2"
    assert len(counter.table()) == 2 and all(a == 1 for _, a in counter.table().values())
    assert_valid_for_providers(lm.requests[0].messages)


async def test_s23_denied_call_gets_a_result_the_model_understands(stores: Stores,
                                                                   tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    refund = refund_tool(counter)
    a = await durable.open(durable.model(refund_script(), [refund]), store=stores.open(),
                           session_id="s23d")
    await a.run("refund both").collect()
    b = await durable.open(None, store=stores.open(), session_id="s23d")
    await b.deny("big", "fraud suspected", by="bob")
    lm = ScriptedModel([Turn.text("I could not refund o2")])
    c = await durable.open(durable.model(lm, [refund]), store=stores.open(),
                           session_id="s23d")
    await c.continue_run().collect()
    result = assert_one_result_each(c.path())["big"]
    assert result.is_error and "denied" in result.text and "fraud suspected" in result.text
    assert len(counter.table()) == 1  # the denied refund never ran
    seen = lm.requests[0].messages
    assert_valid_for_providers(seen)
    assert any(isinstance(m, ToolResultMessage) and "fraud" in m.text for m in seen)


async def test_s23_agent_policy_hook_holds_calls_by_their_arguments(stores: Stores,
                                                                   tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    pay = pay_tool(counter, replay="never")

    def rule(call: ToolCall) -> str | None:
        return "VIP orders need a human" if call.arguments.get("order") == "vip" else None

    lm = ScriptedModel([Turn(Call("pay", {"order": "vip"}, id="v"),
                             Call("pay", {"order": "plain"}, id="p")), Turn.text("ok")])
    agent = await durable.open(durable.model(lm, [pay]), store=stores.open(),
                               session_id="s23p", approval=rule)
    await agent.run("pay").collect()
    (pending,) = agent.pending_approvals()
    assert (pending.call_id, pending.reason) == ("v", "VIP orders need a human")
    assert len(counter.table()) == 1


# -- S24 -------------------------------------------------------------------------


async def test_s24_a_decision_for_a_call_not_pending_is_refused(stores: Stores,
                                                                tmp_path: Path) -> None:
    refund = refund_tool(Counter(tmp_path / "effects.db"))
    a = await durable.open(durable.model(refund_script(), [refund]), store=stores.open(),
                           session_id="s24")
    await a.run("refund both").collect()
    before = len(await stores.open().load_entries("s24"))
    with pytest.raises(ApprovalError, match="'small' has no approval request"):
        await a.approve("small")
    with pytest.raises(ApprovalError, match="'nope' has no approval request"):
        await a.deny("nope", "x")
    await a.approve("big")
    with pytest.raises(ApprovalError, match="already approved"):
        await a.deny("big", "changed my mind")
    # Refusals write nothing; the one decision is one entry.
    assert len(await stores.open().load_entries("s24")) == before + 1


async def test_s24_two_deciders_at_once_first_in_log_order_wins(stores: Stores,
                                                               tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    refund = refund_tool(counter)
    a = await durable.open(durable.model(refund_script(), [refund]), store=stores.open(),
                           session_id="s24r")
    await a.run("refund both").collect()

    class Held:
        """B's append waits until A has decided: both read the log before either wrote."""

        def __init__(self, inner: Store, gate: asyncio.Event) -> None:
            self.inner, self.gate = inner, gate
            self.parked = asyncio.Event()  # an append is waiting at the gate

        async def create_session(self, record: Any) -> None:
            await self.inner.create_session(record)

        async def load_entries(self, sid: str) -> list[Entry]:
            return await self.inner.load_entries(sid)

        async def append_entries(self, sid: str, entries: Sequence[Entry]) -> None:
            self.parked.set()
            await self.gate.wait()
            await self.inner.append_entries(sid, entries)

    gate = asyncio.Event()
    held = Held(stores.open(), gate)
    approver = await durable.open(None, store=held, session_id="s24r")
    denier = await durable.open(None, store=stores.open(), session_id="s24r")
    late = asyncio.create_task(approver.approve("big", by="ann"))
    await asyncio.wait_for(held.parked.wait(), 30)
    assert not late.done()  # read, not yet written
    first = await denier.deny("big", "no", by="bob")
    gate.set()
    with pytest.raises(DecisionConflict, match="denied by bob first") as info:
        await late
    assert info.value.winner.id == first.id
    # Both decisions are stored; a fresh reader and the run obey the first.
    entries = await stores.open().load_entries("s24r")
    assert len(records(entries, "threadline.approval_decided")) == 2
    lm = ScriptedModel([Turn.text("o2 was not refunded")])
    c = await durable.open(durable.model(lm, [refund]), store=stores.open(), session_id="s24r")
    await c.continue_run().collect()
    assert "denied" in assert_one_result_each(c.path())["big"].text
    assert len(counter.table()) == 1


async def test_s21_a_started_call_the_run_aborted_is_listed_in_doubt(stores: Stores) -> None:
    entered = asyncio.Event()

    @tool(side_effects=True)
    async def slow(ctx: ToolContext) -> str:
        """Never finishes."""
        entered.set()
        await asyncio.Event().wait()
        return "never"

    lm = ScriptedModel([Turn(Call("slow", {}, id="s1"))])
    agent = await durable.open(durable.model(lm, [slow]), store=stores.open(), session_id="ab")
    async with agent.run("go") as run:
        async for event in run:
            if event.type == "tool_execution_start":
                await entered.wait()
                break
    (result,) = assert_one_result_each(agent.path()).values()
    assert result.synthesized == "aborted"
    (doubt,) = agent.in_doubt()
    assert doubt.call.id == "s1" and doubt.attempts == 1 and len(doubt.idempotency_key) == 32


async def test_s23_a_fork_keeps_decisions_and_keys(stores: Stores, tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    refund = refund_tool(counter)
    a = await durable.open(durable.model(refund_script(), [refund]), store=stores.open(),
                           session_id="src")
    await a.run("refund both").collect()
    await a.approve("big")
    keys = {s.call.id: s.idempotency_key for s in a.tool_calls()}
    child = await a.fork("copy")
    states = {s.call.id: s for s in child.tool_calls()}
    assert states["big"].status == "never_started"  # approved, not awaiting again
    assert states["small"].idempotency_key == keys["small"]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_s19_a_failed_started_append_ends_the_run_before_the_effect(
    stores: Stores, tmp_path: Path, when: str
) -> None:
    from threadline.errors import StoreError
    from threadline.testing import FaultyStore

    counter = Counter(tmp_path / "effects.db")
    pay = pay_tool(counter, replay="never", reconcile=True)
    lm = ScriptedModel([Turn(Call("pay", {"order": "x"}, id="p"))])
    # Appends: the input, the assistant message with its plan, the started record.
    faulty = FaultyStore(stores.open(), fail_append_on=3, when=when)  # type: ignore[arg-type]
    agent = await durable.open(durable.model(lm, [pay]), store=faulty, session_id="f19")
    with pytest.raises(StoreError, match="injected"):
        await agent.run("pay").collect()
    assert counter.table() == {}  # the tool never ran
    lm2 = ScriptedModel([Turn.text("paid")])
    again = await durable.open(durable.model(lm2, [pay]), store=stores.open(),
                               session_id="f19")
    # "after": the record is stored although the append reported a failure
    # (a connection lost after COMMIT), so the call is in doubt; reconcile
    # finds no effect and it runs. "before": it never started. Once, either way.
    (state,) = again.tool_calls()
    assert state.status == ("in_doubt" if when == "after" else "never_started")
    events = await again.continue_run().collect()
    assert [e.outcome for e in events if isinstance(e, ToolCallInDoubt)] == (
        ["not_happened"] if when == "after" else [])
    assert [a for _, a in counter.table().values()] == [1]
    assert assert_one_result_each(again.path())["p"].text.startswith("paid x")


async def test_s24_a_decision_racing_the_run_that_acts_on_it_waits_and_is_refused(
    stores: Stores,
) -> None:
    release = asyncio.Event()
    running = asyncio.Event()

    @tool(side_effects=True, approval=True)
    async def wire(amount: int) -> str:
        """Wire money."""
        running.set()
        await release.wait()
        return f"wired {amount}"

    lm = ScriptedModel([Turn(Call("wire", {"amount": 7}, id="w")), Turn.text("done")])
    agent = await durable.open(durable.model(lm, [wire]), store=stores.open(), session_id="race")
    await agent.run("wire it").collect()
    await agent.approve("w")
    run = asyncio.create_task(agent.continue_run().collect())
    await running.wait()
    late = asyncio.create_task(agent.deny("w", "too late"))
    await asyncio.sleep(0)
    assert not late.done()  # it waits for the run holding the session
    release.set()
    await run
    with pytest.raises(ApprovalError, match="already approved"):
        await late
    assert assert_one_result_each(agent.path())["w"].text == "wired 7"
