"""Checkers for the agent-loop event grammar of ``threadline.agent._events``.

Use them in tests of your own ``Loop`` (or of an agent CLI driven through
``durable.subprocess``) to prove it reports runs the way the durable agent
expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from threadline.agent._events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._model import (
    DoneEvent,
    ErrorEvent,
    StartEvent,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)

__all__ = ["assert_event_order", "assert_stream_order"]


_STARTS = (TextStart, ThinkingStart, ToolCallStart)
_DELTAS: dict[type, type] = {
    TextStart: TextDelta, ThinkingStart: ThinkingDelta, ToolCallStart: ToolCallDelta,
}
_ENDS: dict[type, type] = {
    TextStart: TextEnd, ThinkingStart: ThinkingEnd, ToolCallStart: ToolCallEnd,
}


def assert_stream_order(updates: Sequence[StreamEvent], message: AssistantMessage) -> None:
    """The model-stream grammar inside one assistant message's MessageUpdates."""
    if not updates:
        assert message.stop_reason in ("error", "aborted"), "only a failed model streams nothing"
        return
    assert isinstance(updates[0], StartEvent), f"first update is {updates[0]!r}"
    open_kind: type | None = None
    index = 0
    for ev in updates[1:]:
        assert not isinstance(ev, StartEvent | DoneEvent | ErrorEvent), f"stray {ev!r}"
        if isinstance(ev, _STARTS):
            assert open_kind is None, f"{ev!r} while a block is open"
            assert ev.index == index, f"{ev!r}: expected index {index}"
            open_kind = type(ev)
            continue
        assert open_kind is not None, f"{ev!r} outside a block"
        assert ev.index == index, f"{ev!r}: expected index {index}"
        if isinstance(ev, _DELTAS[open_kind]):
            continue
        assert isinstance(ev, _ENDS[open_kind]), f"{ev!r} inside a {open_kind.__name__} block"
        part = message.content[index]
        if isinstance(ev, ToolCallEnd):
            assert part == ev.tool_call
        elif isinstance(ev, TextEnd):
            assert isinstance(part, TextPart) and part.text == ev.text
        open_kind = None
        index += 1
    if open_kind is not None:
        assert message.stop_reason in ("aborted", "error"), "a block never ended"


def assert_event_order(
    events: Sequence[AgentEvent], *, sequential: bool = False, strict: bool = True
) -> AgentEnd:
    """Assert the run grammar of ``threadline.agent._events``; return the AgentEnd.

    ``sequential``: tool executions must not overlap. ``strict`` also checks
    the model-stream grammar inside each assistant message and that every
    call without an execution got a synthesized ``aborted`` result (true of
    ``AgentLoop``; an external agent may report results without executions)
    and that each execution's arguments are those of its call. Calls named
    in ``AgentEnd.awaiting_approval`` are allowed no result.
    """
    reader = _Reader(events)
    last_event = events[-1] if events else None
    held = set(last_event.awaiting_approval) if isinstance(last_event, AgentEnd) else set()
    reader.take(AgentStart)
    while reader.peek(MessageStart):
        start, end = reader.take(MessageStart), reader.take(MessageEnd)
        assert start.message == end.message
        assert isinstance(end.message, UserMessage)
        reader.ended.append(end.message)
    turn = 0
    last: AssistantMessage | None = None
    while reader.peek(TurnStart):
        turn += 1
        last = _check_turn(reader, turn, held, sequential=sequential, strict=strict)
        if last.stop_reason in ("error", "aborted"):
            break
    agent_end = reader.take(AgentEnd)
    assert isinstance(agent_end, AgentEnd)
    assert reader.pos == len(events), f"events after AgentEnd: {events[reader.pos:]}"
    assert list(agent_end.messages) == reader.ended
    if last is not None and last.stop_reason in ("error", "aborted"):
        assert agent_end.error is not None, "a failed or aborted run must say why"
    return agent_end


class _Reader:
    """A cursor over the events, and the messages whose MessageEnd it has read."""

    def __init__(self, events: Sequence[AgentEvent]) -> None:
        self.events = events
        self.pos = 0
        self.ended: list[Message] = []

    def take(self, cls: type[Any]) -> Any:
        assert self.pos < len(self.events), f"events end early; expected {cls.__name__}"
        ev = self.events[self.pos]
        assert isinstance(ev, cls), f"event {self.pos}: expected {cls.__name__}, got {ev!r}"
        self.pos += 1
        return ev

    def peek(self, *classes: type[Any]) -> bool:
        return self.pos < len(self.events) and isinstance(self.events[self.pos], classes)


def _check_turn(
    reader: _Reader, turn: int, held: set[str], *, sequential: bool, strict: bool
) -> AssistantMessage:
    """One turn, TurnStart to TurnEnd; return its assistant message."""
    assert reader.take(TurnStart).turn == turn
    first = reader.take(MessageStart).message
    assert isinstance(first, AssistantMessage) and first.content == ()
    updates = []
    while reader.peek(MessageUpdate):
        updates.append(reader.take(MessageUpdate).event)
    last = reader.take(MessageEnd).message
    assert isinstance(last, AssistantMessage)
    if strict:
        assert_stream_order(updates, last)
    reader.ended.append(last)
    executed = _check_executions(reader, last, sequential=sequential, strict=strict)
    results = _check_results(reader, last, held, executed, strict=strict)
    turn_end = reader.take(TurnEnd)
    assert (turn_end.turn, turn_end.message) == (turn, last)
    assert turn_end.tool_results == tuple(results)
    return last


def _check_executions(
    reader: _Reader, message: AssistantMessage, *, sequential: bool, strict: bool
) -> dict[str, ToolResultMessage]:
    """The tool executions after ``message``; return the results they ended with, by call id."""
    calls = message.tool_calls
    ids = [c.id for c in calls]
    started: list[str] = []
    running: set[str] = set()
    executed: dict[str, ToolResultMessage] = {}
    while reader.peek(ToolExecutionStart, ToolExecutionUpdate, ToolExecutionEnd):
        ev = reader.events[reader.pos]
        reader.pos += 1
        if isinstance(ev, ToolExecutionStart):
            assert ev.tool_call_id in ids and ev.tool_call_id not in started, ev
            assert not (sequential and running), f"{ev!r} while {running} run"
            assert not strict or ev.arguments == calls[ids.index(ev.tool_call_id)].arguments
            started.append(ev.tool_call_id)
            running.add(ev.tool_call_id)
        elif isinstance(ev, ToolExecutionUpdate):
            assert ev.tool_call_id in running, f"{ev!r} outside its execution"
        else:
            assert isinstance(ev, ToolExecutionEnd)
            assert ev.tool_call_id in running, f"{ev!r} without a start"
            running.discard(ev.tool_call_id)
            executed[ev.tool_call_id] = ev.result
    assert not running, f"executions never ended: {running}"
    assert started == [i for i in ids if i in started], "starts out of call order"
    return executed


def _check_results(
    reader: _Reader, message: AssistantMessage, held: set[str],
    executed: dict[str, ToolResultMessage], *, strict: bool,
) -> list[ToolResultMessage]:
    """One result message per call of ``message``, in call order, held calls excepted."""
    results = []
    for call in message.tool_calls:
        if call.id in held:
            continue  # held for approval: no result until a decision
        start, done = reader.take(MessageStart), reader.take(MessageEnd)
        result = done.message
        assert start.message == result and isinstance(result, ToolResultMessage)
        assert (result.tool_call_id, result.tool_name) == (call.id, call.name)
        if call.id in executed:
            assert executed[call.id] == result
        elif strict:
            assert result.synthesized == "aborted" and result.is_error
        results.append(result)
        reader.ended.append(result)
    return results
