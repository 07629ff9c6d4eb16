"""Events of the inner agent loop, and the ``Loop`` protocol a factory builds.

The loop knows nothing about storage. The durable agent wraps it and forwards
these events; it replaces each ``MessageEnd`` with a ``StoredMessageEnd``
(``threadline.durable``) carrying the entries written for it.

Order of one run (invariants, tested)::

    AgentStart
    MessageStart(input) MessageEnd(input)        for each input message
    ( TurnStart
      MessageStart(assistant) MessageUpdate* MessageEnd(assistant)
      ( ToolExecutionStart ToolExecutionUpdate* ToolExecutionEnd )*
      ( MessageStart(tool result) MessageEnd(tool result) )*   in call order
      TurnEnd )*
    AgentEnd                                      always last, exactly once

When tools run in parallel, the per-call ``ToolExecution*`` sequences
interleave: starts come in call order, updates and ends as the tools progress.
A call that never ran (aborted first, or answered by a ``ToolGate``) has a
result message but no execution events. Each assistant message's tool calls
get exactly one result each, except calls a gate held for approval: those get
none, and ``AgentEnd.awaiting_approval`` names them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeAlias

import msgspec

from threadline.ai._messages import AssistantMessage, Message, ToolResultMessage
from threadline.ai._model import StreamEvent
from threadline.errors import BudgetExceeded

__all__ = [
    "AgentEnd",
    "AgentEvent",
    "AgentStart",
    "Loop",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "ToolExecutionUpdate",
    "TurnEnd",
    "TurnStart",
]


class _Event(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type"):
    """Base of the agent events: tagged by ``type``, the shape they have on a JSON wire.

    Fields a loop always fills but the subprocess wire lets a child leave out
    (the wrapper derives them) have defaults; see docs/subprocess-protocol.md.
    """


class AgentStart(_Event, frozen=True, tag="agent_start"):
    type: ClassVar[Literal["agent_start"]] = "agent_start"


class TurnStart(_Event, frozen=True, tag="turn_start"):
    type: ClassVar[Literal["turn_start"]] = "turn_start"
    turn: int = 0


class MessageStart(_Event, frozen=True, tag="message_start"):
    type: ClassVar[Literal["message_start"]] = "message_start"
    message: Message
    """For an assistant message: an empty message naming model and provider."""


class MessageUpdate(_Event, frozen=True, tag="message_update"):
    type: ClassVar[Literal["message_update"]] = "message_update"
    event: StreamEvent


class MessageEnd(_Event, frozen=True, tag="message_end"):
    type: ClassVar[Literal["message_end"]] = "message_end"
    message: Message


class ToolExecutionStart(_Event, frozen=True, tag="tool_execution_start"):
    type: ClassVar[Literal["tool_execution_start"]] = "tool_execution_start"
    tool_call_id: str
    tool_name: str = ""
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolExecutionUpdate(_Event, frozen=True, tag="tool_execution_update"):
    type: ClassVar[Literal["tool_execution_update"]] = "tool_execution_update"
    tool_call_id: str
    tool_name: str = ""
    update: Any = None


NO_RESULT = ToolResultMessage(tool_call_id="", tool_name="")
"""Stands for a ``tool_execution_end`` a subprocess sent without its result;
a loop's own ``ToolExecutionEnd`` always carries the real one."""


class ToolExecutionEnd(_Event, frozen=True, tag="tool_execution_end"):
    type: ClassVar[Literal["tool_execution_end"]] = "tool_execution_end"
    tool_call_id: str
    tool_name: str = ""
    result: ToolResultMessage = NO_RESULT


class TurnEnd(_Event, frozen=True, tag="turn_end"):
    type: ClassVar[Literal["turn_end"]] = "turn_end"
    turn: int = 0
    message: AssistantMessage = AssistantMessage()
    tool_results: tuple[ToolResultMessage, ...] = ()


class AgentEnd(_Event, frozen=True, tag="agent_end"):
    type: ClassVar[Literal["agent_end"]] = "agent_end"
    messages: tuple[Message, ...] = ()
    """Every message this run produced, input included, in order."""
    error: BaseException | None = None
    """Set when the run stopped on a model error or was cancelled. On a JSON
    wire it is the error's text."""
    awaiting_approval: tuple[str, ...] = ()
    """Ids of calls held for a human decision; the run stopped after their turn."""

    @property
    def stop_reason(self) -> Literal["done", "error", "awaiting_approval", "budget"]:
        if isinstance(self.error, BudgetExceeded):
            return "budget"
        if self.error is not None:
            return "error"
        return "awaiting_approval" if self.awaiting_approval else "done"


PassedThrough: TypeAlias = (
    AgentStart | TurnStart | MessageStart | MessageUpdate | ToolExecutionStart
    | ToolExecutionUpdate | ToolExecutionEnd | TurnEnd | AgentEnd
)
"""The events a durable run forwards as they are (it replaces only ``MessageEnd``)."""

AgentEvent: TypeAlias = PassedThrough | MessageEnd


class Loop(Protocol):
    """What a durable agent's factory builds for one run.

    ``context`` is the conversation so far (already valid for a model);
    ``input`` the new messages. When ``abort`` is set the loop winds down and
    keeps reporting: the streaming assistant message ends with stop reason
    ``aborted``, running tools are cancelled, every open tool call gets an
    ``aborted`` result (each with its MessageStart/MessageEnd), then AgentEnd.
    The durable agent relies on this to store a valid path when its own
    consumer goes away. Closing the iterator (``aclose``) instead stops the
    loop at once, cleaning up tools, with no further events.
    """

    def run(
        self,
        context: Sequence[Message],
        input: Sequence[Message],
        *,
        abort: asyncio.Event | None = None,
    ) -> AsyncIterator[AgentEvent]: ...
