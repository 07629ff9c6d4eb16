"""S41: a run whose tools the ledger has nothing to do for runs them without it.

The shortcut is taken only when no call of the run can be tracked (no
agent-wide approval rule, no tool with side effects or an approval rule), no
tool can see its ``ToolContext`` (none declares one, none overrides
``execute``) and the run is not a resume. Each test below breaks one of these
conditions next to a plain tool and checks that the ledger's work is done:
widening the shortcut to any of them fails its test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from threadline import durable
from threadline.agent import AgentEnd, AgentLoop
from threadline.ai import AssistantMessage, ToolCall, ToolContext, ToolResult, tool
from threadline.ai._tools import Progress, Tool
from threadline.durable import (
    ApprovalRequested,
    StoredMessageEnd,
    ToolCallInDoubt,
    ToolPlan,
    ToolStarted,
)
from threadline.durable._effects import idempotency_key
from threadline.session import CustomEntry, Entry, MessageEntry
from threadline.stores import MemoryStore
from threadline.testing import Call, ScriptedModel, Turn


@tool
def look(q: str) -> str:
    """Read only."""
    return q


def kinds(entries: list[Entry]) -> list[str]:
    return [e.kind for e in entries if isinstance(e, CustomEntry)]


def assistant_entry(entries: list[Entry], call_id: str) -> MessageEntry:
    return next(e for e in entries if isinstance(e, MessageEntry)
                and isinstance(e.message, AssistantMessage)
                and any(c.id == call_id for c in e.message.tool_calls))


async def test_s41_plain_tools_store_the_same_log_as_ever() -> None:
    script = [Turn(Call("look", {"q": "a"}, id="c1")), Turn(Call("look", {"q": "b"}, id="c2")),
              Turn.text("done")]
    store = MemoryStore()
    agent = await durable.open(durable.model(ScriptedModel(script), [look]), store=store)
    await agent.run("go").collect()
    stored = await store.load_entries(agent.session_id)
    assert stored == agent.entries
    assert kinds(stored) == []  # untracked calls never had records
    assert [type(e.message).__name__ for e in stored if isinstance(e, MessageEntry)] == [
        "UserMessage", "AssistantMessage", "ToolResultMessage", "AssistantMessage",
        "ToolResultMessage", "AssistantMessage"]


async def test_s41_a_plain_tool_runs_with_the_arguments_stored_not_a_consumers_change(
) -> None:
    # The run still has a gate, so the loop validates a call before its
    # receipt reaches the consumer (without one it would validate in the tool
    # task, after the consumer had its turn).
    ran: list[str] = []

    @tool
    def echo(q: str) -> str:
        """Echo."""
        ran.append(q)
        return q

    script = [Turn(Call("echo", {"q": "x"}, id="c1")), Turn.text("done")]
    agent = await durable.open(durable.model(ScriptedModel(script), [echo]), store=MemoryStore())
    async for ev in agent.run("go"):
        if isinstance(ev, StoredMessageEnd) and isinstance(ev.message, AssistantMessage) and \
                ev.message.tool_calls:
            ev.message.tool_calls[0].arguments["q"] = "changed"
    assert ran == ["x"]
    assert assistant_entry(agent.entries, "c1").message.tool_calls[0].arguments == {"q": "x"}


async def test_s41_a_tool_that_takes_its_context_gets_the_ledgers_key() -> None:
    seen: list[ToolContext] = []

    @tool
    def keyed(ctx: ToolContext) -> str:
        """Untracked, but it reads its key."""
        seen.append(ctx)
        return "ok"

    script = [Turn(Call("look", {"q": "x"}, id="c1"), Call("keyed", {}, id="c2")),
              Turn.text("done")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look, keyed]),
                               store=MemoryStore())
    await agent.run("go").collect()
    (ctx,) = seen
    assistant = assistant_entry(agent.entries, "c2")
    assert ctx.idempotency_key == idempotency_key(assistant.id, "c2")
    assert (ctx.session_id, ctx.attempt) == (agent.session_id, 1)
    assert kinds(agent.entries) == []


async def test_s41_a_tool_that_overrides_execute_gets_the_ledgers_context() -> None:
    seen: list[ToolContext | None] = []

    class Watching(Tool):
        async def execute(self, arguments: Mapping[str, Any], progress: Progress | None = None,
                          context: ToolContext | None = None) -> ToolResult:
            seen.append(context)
            return await super().execute(arguments, progress, context)

    watching = Watching("watching", "Sees its context.", {"type": "object"}, lambda: "ok")
    script = [Turn(Call("watching", {}, id="c1")), Turn.text("done")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look, watching]),
                               store=MemoryStore())
    await agent.run("go").collect()
    (ctx,) = seen
    assert ctx is not None
    assert ctx.idempotency_key == idempotency_key(assistant_entry(agent.entries, "c1").id, "c1")
    assert ctx.session_id == agent.session_id


async def test_s41_a_side_effect_tool_among_plain_ones_is_tracked() -> None:
    @tool(side_effects=True)
    def charge(amount: int) -> str:
        """Charge."""
        return "charged"

    # The plain tool is called first: the decision is the run's, not the call's.
    script = [Turn(Call("look", {"q": "x"}, id="c1")), Turn(Call("charge", {"amount": 1},
                                                                 id="c2")),
              Turn.text("done")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look, charge]),
                               store=MemoryStore())
    await agent.run("go").collect()
    plans = [e.data for e in agent.entries
             if isinstance(e, CustomEntry) and e.kind == "threadline.tool_plan"]
    started = [e.data for e in agent.entries
               if isinstance(e, CustomEntry) and e.kind == "threadline.tool_started"]
    assert plans == [ToolPlan(calls=("c2",))]
    key = idempotency_key(assistant_entry(agent.entries, "c2").id, "c2")
    assert started == [ToolStarted(call_id="c2", tool_name="charge", idempotency_key=key)]


async def test_s41_a_side_effect_tool_added_mid_run_is_tracked_from_its_first_call() -> None:
    # The run starts with nothing to track; a plain tool then adds a tool
    # with side effects to the loop. The next message calling it must get its
    # plan stored with it and its started record, as under the ledger.
    @tool(side_effects=True)
    def charge(amount: int) -> str:
        """Charge."""
        return "charged"

    @tool
    def enable() -> str:
        """Adds the charging tool."""
        loop.tools["charge"] = charge
        return "enabled"

    loop = AgentLoop(ScriptedModel([
        Turn(Call("enable", {}, id="c1")), Turn(Call("charge", {"amount": 1}, id="c2")),
        Turn.text("done")]), [look, enable])
    agent = await durable.open(lambda: loop, store=MemoryStore())
    await agent.run("go").collect()
    plans = [e for e in agent.entries
             if isinstance(e, CustomEntry) and e.kind == "threadline.tool_plan"]
    assert [p.data for p in plans] == [ToolPlan(calls=("c2",))]
    assistant = assistant_entry(agent.entries, "c2")
    assert agent.entries.index(plans[0]) == agent.entries.index(assistant) + 1
    key = idempotency_key(assistant.id, "c2")
    assert [e.data for e in agent.entries if isinstance(e, CustomEntry)
            and e.kind == "threadline.tool_started"] == [
        ToolStarted(call_id="c2", tool_name="charge", idempotency_key=key)]


async def test_s41_a_tool_with_an_approval_rule_is_held() -> None:
    @tool(approval=lambda args: "always")
    def ask(q: str) -> str:
        """Needs a human, has no side effects."""
        return q

    script = [Turn(Call("ask", {"q": "x"}, id="c1")), Turn.text("never")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look, ask]),
                               store=MemoryStore())
    events = await agent.run("go").collect()
    assert [e.call_id for e in events if isinstance(e, ApprovalRequested)] == ["c1"]
    end = next(e for e in events if isinstance(e, AgentEnd))
    assert end.awaiting_approval == ("c1",)


async def test_s41_the_agents_approval_rule_holds_a_plain_tools_call() -> None:
    asked: list[str] = []

    def rule(call: ToolCall) -> bool:
        asked.append(call.id)
        return call.id == "c2"

    script = [Turn(Call("look", {"q": "x"}, id="c1"), Call("look", {"q": "y"}, id="c2")),
              Turn.text("never")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look]),
                               store=MemoryStore(), approval=rule)
    events = await agent.run("go").collect()
    assert asked == ["c1", "c2"]
    assert [e.call_id for e in events if isinstance(e, ApprovalRequested)] == ["c2"]
    assert [p.call_id for p in agent.pending_approvals()] == ["c2"]


async def test_s41_a_resumed_run_keeps_its_ledger_for_the_stored_records() -> None:
    # A process with `work` declared as having side effects was killed after
    # the call started; `work` is plain now, but the stored turn still says
    # the call is in doubt, so continue_run must classify it (S20-S21).
    runs: list[str] = []

    @tool
    def work(q: str) -> str:
        """Plain now."""
        runs.append(q)
        return "done"

    store = MemoryStore()
    agent = await durable.open(None, store=store, session_id="s43")
    await agent.append(durable_user("go"))
    call = ToolCall(id="c1", name="work", arguments={"q": "x"})
    (assistant,) = await agent.append(AssistantMessage(content=(call,), stop_reason="tool_use"))
    key = idempotency_key(assistant.id, "c1")
    await agent.append(CustomEntry(kind="threadline.tool_plan", data=ToolPlan(calls=("c1",))),
                       CustomEntry(kind="threadline.tool_started", data=ToolStarted(
                           call_id="c1", tool_name="work", idempotency_key=key)))
    resumed = await durable.open(durable.model(ScriptedModel([Turn.text("ok")]), [work]),
                                 store=store, session_id="s43")
    events = await resumed.continue_run().collect()
    doubts = [(e.call_id, e.outcome, e.idempotency_key) for e in events
              if isinstance(e, ToolCallInDoubt)]
    assert doubts == [("c1", "rerun", key)]
    assert runs == ["x"]


def durable_user(text: str) -> Any:
    from threadline.ai import UserMessage

    return UserMessage.of(text)


async def test_s41_with_a_ledger_an_untracked_call_that_reads_its_context_gets_its_key() -> None:
    # A side-effect tool in the loop gives the run a ledger; the ledger skips
    # the key only for an untracked call whose tool cannot read it.
    seen: list[ToolContext] = []

    @tool(side_effects=True)
    def charge(amount: int) -> str:
        """Charge."""
        return "charged"

    @tool
    def keyed(ctx: ToolContext) -> str:
        """Untracked, but it reads its key."""
        seen.append(ctx)
        return "ok"

    script = [Turn(Call("look", {"q": "x"}, id="c1"), Call("keyed", {}, id="c2")),
              Turn.text("done")]
    agent = await durable.open(durable.model(ScriptedModel(script), [look, keyed, charge]),
                               store=MemoryStore())
    await agent.run("go").collect()
    (ctx,) = seen
    assert ctx.idempotency_key == idempotency_key(assistant_entry(agent.entries, "c2").id, "c2")
    assert kinds(agent.entries) == []  # nothing tracked in that turn
