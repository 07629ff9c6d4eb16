"""The turn state machine of the subprocess loop.

Pure: the child's events in, agent events that keep the run grammar of
``threadline.agent._events`` out. Turns belong to the wrapper: one opens with
each assistant message and closes once all of its calls are answered; tool
results are held until then and reported in call order, as ``AgentLoop``
does. ``close`` winds down whatever the child left open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from threadline.agent._events import (
    NO_RESULT,
    AgentEnd,
    AgentEvent,
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
    AssistantContent,
    AssistantMessage,
    Message,
    Synthesized,
    TextPart,
    ThinkingPart,
    ToolResultMessage,
    UserMessage,
    synthesized_result,
)
from threadline.ai._model import (
    DoneEvent,
    ErrorEvent,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
)

__all__ = ["ProtocolError", "Turns"]


class ProtocolError(Exception):
    """A child event that does not fit the run so far."""


class Turns:
    """Turns the child's events into agent events that keep the run grammar.

    Pure: child events in, agent events out; raises ``ProtocolError`` for an
    event that does not fit. ``close`` winds down whatever is still open.
    """

    def __init__(self, input: Sequence[Message]) -> None:
        self._produced: list[Message] = list(input)
        self._echoes = [m for m in input if isinstance(m, UserMessage)]
        self.turn = 0
        self.finished = False
        self.child_error: str | None = None
        self._streaming: AssistantMessage | None = None
        self._partial: dict[int, _Partial] = {}
        self._assistant: AssistantMessage | None = None  # ended, its turn still open
        self._pending: dict[str, str] = {}  # call id -> tool name, not answered yet
        self._results: dict[str, ToolResultMessage] = {}
        self._running: dict[str, str] = {}  # executions started and not ended
        self._started: set[str] = set()

    def messages(self) -> tuple[Message, ...]:
        return tuple(self._produced)

    def feed(self, ev: AgentEvent) -> list[AgentEvent]:
        if isinstance(ev, MessageStart | MessageEnd):
            return self._message(ev)
        if isinstance(ev, MessageUpdate):
            if self._streaming is None:
                raise ProtocolError("message_update outside an assistant message")
            if isinstance(ev.event, DoneEvent | ErrorEvent):
                raise ProtocolError(f"message_update carries a {ev.event.type!r} event; "
                                    "a message ends with message_end")
            self._track(ev.event)
            return [ev]
        if isinstance(ev, ToolExecutionStart | ToolExecutionUpdate | ToolExecutionEnd):
            return self._tool(ev)
        if isinstance(ev, AgentEnd):
            if ev.error is None and (self._streaming is not None or self._pending):
                open_calls = sorted(self._pending)
                raise ProtocolError("agent_end while " + (
                    "an assistant message is streaming" if self._streaming is not None
                    else f"tool calls {open_calls} have no result"))
            self.finished = True
            self.child_error = str(ev.error) if ev.error is not None else None
            return []
        return []  # agent_start, turn_start, turn_end: the wrapper reports its own

    def _tool(
        self, ev: ToolExecutionStart | ToolExecutionUpdate | ToolExecutionEnd
    ) -> list[AgentEvent]:
        # The child may leave out the tool's name: it comes from the open call.
        call_id = ev.tool_call_id
        if isinstance(ev, ToolExecutionStart):
            if call_id not in self._pending or call_id in self._started:
                raise ProtocolError(f"tool_execution_start for call {call_id!r}, "
                                    "which is not an open call of the current turn")
            name = self._pending[call_id]
            self._running[call_id] = name
            self._started.add(call_id)
            return [ToolExecutionStart(tool_call_id=call_id, tool_name=name,
                                       arguments=ev.arguments)]
        tool = self._running.get(call_id)
        if tool is None:
            raise ProtocolError(f"{ev.type} for call {call_id!r}, whose execution is not running")
        if isinstance(ev, ToolExecutionUpdate):
            return [ToolExecutionUpdate(tool_call_id=call_id, tool_name=tool, update=ev.update)]
        if ev.result is NO_RESULT:
            return []  # ended when its result message arrives
        del self._running[call_id]
        return [ToolExecutionEnd(tool_call_id=call_id, tool_name=tool, result=ev.result)]

    def _message(self, ev: MessageStart | MessageEnd) -> list[AgentEvent]:
        m = ev.message
        if isinstance(m, UserMessage):
            if self.turn == 0 and m in self._echoes:
                if isinstance(ev, MessageEnd):
                    self._echoes.remove(m)
                return []  # an echo of the input, which the wrapper already reported
            raise ProtocolError("a user message from the agent; it reports only assistant "
                                 "and tool_result messages")
        if isinstance(m, ToolResultMessage):
            if isinstance(ev, MessageStart):
                return []  # reported with its end, in call order
            if m.tool_call_id not in self._pending:
                raise ProtocolError(f"tool result for call {m.tool_call_id!r} answers no "
                                     "open call of the current turn")
            del self._pending[m.tool_call_id]
            self._results[m.tool_call_id] = m
            return [] if self._pending else self._flush()
        out: list[AgentEvent] = []
        if isinstance(ev, MessageStart) or self._streaming is None:
            if self._streaming is not None:
                raise ProtocolError("message_start while another assistant message streams")
            if self._pending:
                raise ProtocolError(f"a new assistant message while tool calls "
                                     f"{sorted(self._pending)} have no result")
            self.turn += 1
            self._streaming = AssistantMessage(model=m.model, provider=m.provider, api=m.api)
            self._partial = {}
            out += [TurnStart(turn=self.turn), MessageStart(message=self._streaming)]
        if isinstance(ev, MessageEnd):
            out += self._end_assistant(m)
        return out

    def _end_assistant(self, m: AssistantMessage) -> list[AgentEvent]:
        self._streaming = None
        self._assistant = m
        self._produced.append(m)
        self._pending = {c.id: c.name for c in m.tool_calls}
        out: list[AgentEvent] = [MessageEnd(message=m)]
        if not self._pending:
            out += self._flush()
        return out

    def _flush(self) -> list[AgentEvent]:
        """All calls answered: end executions, report results in call order, end the turn."""
        assert self._assistant is not None
        out: list[AgentEvent] = [
            ToolExecutionEnd(tool_call_id=i, tool_name=name, result=self._results[i])
            for i, name in self._running.items()
        ]
        call_ids = dict.fromkeys(c.id for c in self._assistant.tool_calls)
        results = [self._results[i] for i in call_ids]
        for r in results:
            self._produced.append(r)
            out += [MessageStart(message=r), MessageEnd(message=r)]
        out.append(TurnEnd(turn=self.turn, message=self._assistant, tool_results=tuple(results)))
        self._assistant = None
        self._running, self._results, self._started = {}, {}, set()
        return out

    def close(self, kind: Synthesized, error: BaseException | None) -> list[AgentEvent]:
        """End what the child left open: the streaming message, then unanswered calls."""
        out: list[AgentEvent] = []
        if self._streaming is not None:
            reason: Literal["aborted", "error"] = "aborted" if kind == "aborted" else "error"
            content = tuple(self._partial[i].part() for i in sorted(self._partial))
            out += self._end_assistant(msgspec.structs.replace(
                self._streaming, content=content, stop_reason=reason,
                error_message=str(error) if error is not None else None,
            ))
        if self._assistant is not None:
            for call_id, name in self._pending.items():
                self._results[call_id] = synthesized_result(call_id, name, kind)
            self._pending = {}
            out += self._flush()
        return out

    def _track(self, event: StreamEvent) -> None:
        # Kept so that a message cut short still stores what was streamed.
        p = self._partial
        if isinstance(event, TextStart | ThinkingStart):
            p[event.index] = _Partial(isinstance(event, ThinkingStart))
        elif isinstance(event, TextDelta | ThinkingDelta):
            p.setdefault(event.index, _Partial(isinstance(event, ThinkingDelta))).chunks.append(
                event.delta)
        elif isinstance(event, TextEnd):
            p[event.index] = _Partial(False, [event.text])
        elif isinstance(event, ThinkingEnd):
            p[event.index] = _Partial(True, [event.thinking], event.signature)


@dataclass(slots=True)
class _Partial:
    thinking: bool
    chunks: list[str] = field(default_factory=list)
    signature: str | None = None

    def part(self) -> AssistantContent:
        text = "".join(self.chunks)
        if self.thinking:
            return ThinkingPart(thinking=text, signature=self.signature)
        return TextPart(text=text)
