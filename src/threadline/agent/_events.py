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
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from threadline.ai._messages import AssistantMessage, Message, ToolResultMessage
from threadline.ai._model import StreamEvent

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


@dataclass(frozen=True, slots=True)
class AgentStart:
    type: Literal["agent_start"] = "agent_start"


@dataclass(frozen=True, slots=True)
class TurnStart:
    turn: int
    type: Literal["turn_start"] = "turn_start"


@dataclass(frozen=True, slots=True)
class MessageStart:
    message: Message
    """For an assistant message: an empty message naming model and provider."""
    type: Literal["message_start"] = "message_start"


@dataclass(frozen=True, slots=True)
class MessageUpdate:
    event: StreamEvent
    type: Literal["message_update"] = "message_update"


@dataclass(frozen=True, slots=True)
class MessageEnd:
    message: Message
    type: Literal["message_end"] = "message_end"


@dataclass(frozen=True, slots=True)
class ToolExecutionStart:
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    type: Literal["tool_execution_start"] = "tool_execution_start"


@dataclass(frozen=True, slots=True)
class ToolExecutionUpdate:
    tool_call_id: str
    tool_name: str
    update: Any
    type: Literal["tool_execution_update"] = "tool_execution_update"


@dataclass(frozen=True, slots=True)
class ToolExecutionEnd:
    tool_call_id: str
    tool_name: str
    result: ToolResultMessage
    type: Literal["tool_execution_end"] = "tool_execution_end"


@dataclass(frozen=True, slots=True)
class TurnEnd:
    turn: int
    message: AssistantMessage
    tool_results: tuple[ToolResultMessage, ...] = ()
    type: Literal["turn_end"] = "turn_end"


@dataclass(frozen=True, slots=True)
class AgentEnd:
    messages: tuple[Message, ...]
    """Every message this run produced, input included, in order."""
    error: BaseException | None = None
    """Set when the run stopped on a model error or was cancelled."""
    type: Literal["agent_end"] = "agent_end"
    awaiting_approval: tuple[str, ...] = ()
    """Ids of calls held for a human decision; the run stopped after their turn."""

    @property
    def stop_reason(self) -> Literal["done", "error", "awaiting_approval"]:
        if self.error is not None:
            return "error"
        return "awaiting_approval" if self.awaiting_approval else "done"


AgentEvent: TypeAlias = (
    AgentStart | TurnStart | MessageStart | MessageUpdate | MessageEnd | ToolExecutionStart
    | ToolExecutionUpdate | ToolExecutionEnd | TurnEnd | AgentEnd
)


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
