"""The ``ToolGate`` seam of the inner loop, without any storage (S22, S23).

A gate sees each valid call before it runs (``admit``) and right before its
function is called (``begin``); the durable effect ledger is one such gate.
"""

from __future__ import annotations

from typing import Any

from threadline.agent import AgentEnd, AgentLoop, Pause, ResumeTurn
from threadline.ai import (
    AssistantMessage,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolResultMessage,
    UserMessage,
    tool,
)
from threadline.testing import Call, ScriptedModel, Turn
from threadline.testing._grammar import assert_event_order


class Recorder:
    """Holds ``hold``, answers ``answer`` without running it, runs the rest."""

    def __init__(self, hold: str = "", answer: str = "") -> None:
        self.hold, self.answer = hold, answer
        self.admitted: list[str] = []
        self.begun: list[str] = []

    async def admit(self, call: ToolCall, tool: Any, arguments: dict[str, Any]) -> Any:
        self.admitted.append(call.id)
        if call.id == self.hold:
            return Pause()
        if call.id == self.answer:
            return ToolResult.text("answered by the gate")
        return None

    async def begin(self, call: ToolCall, tool: Any) -> ToolContext:
        self.begun.append(call.id)
        return ToolContext(call_id=call.id, tool_name=call.name, idempotency_key=f"k-{call.id}")


@tool
def echo(text: str, ctx: ToolContext) -> str:
    """Echo, with the key the gate gave."""
    return f"{text} {ctx.idempotency_key}"


async def test_s23_gate_holds_one_call_answers_another_and_the_run_stops() -> None:
    lm = ScriptedModel([Turn(Call("echo", {"text": "a"}, id="a"),
                             Call("echo", {"text": "b"}, id="b"),
                             Call("echo", {"text": "c"}, id="c")),
                        Turn.text("never asked")])
    gate = Recorder(hold="b", answer="c")
    events = [e async for e in AgentLoop(lm, [echo]).run([], [UserMessage.of("go")], gate=gate)]
    # Not strict: a call the gate answered has a result without being executed.
    end = assert_event_order(events, strict=False)
    assert end.stop_reason == "awaiting_approval" and end.awaiting_approval == ("b",)
    assert gate.admitted == ["a", "b", "c"] and gate.begun == ["a"]
    results = [m for m in end.messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.text) for r in results] == [("a", "a k-a"),
                                                           ("c", "answered by the gate")]
    assert lm.remaining == 1  # the run stopped after the held turn


async def test_s22_resume_turn_runs_open_calls_then_asks_the_model() -> None:
    asked = AssistantMessage(content=(ToolCall(id="x", name="echo", arguments={"text": "hi"}),),
                             stop_reason="tool_use")
    lm = ScriptedModel([Turn.text("thanks")])
    loop = AgentLoop(lm, [echo])
    gate = Recorder()
    events = [e async for e in loop.run([UserMessage.of("go"), asked], [], gate=gate,
                                        resume=ResumeTurn(asked, asked.tool_calls))]
    end = events[-1]
    assert isinstance(end, AgentEnd) and end.stop_reason == "done"
    # No events for the stored assistant message; one result, then the model.
    assert [type(m).__name__ for m in end.messages] == ["ToolResultMessage", "AssistantMessage"]
    sent = lm.requests[0].messages
    assert [type(m).__name__ for m in sent] == ["UserMessage", "AssistantMessage",
                                                "ToolResultMessage"]
    assert sent[-1].text == "hi k-x"  # type: ignore[union-attr]
