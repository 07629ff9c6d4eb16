"""The inner agent loop: model + tools + context -> an async stream of events.

It knows nothing about storage; ``threadline.durable`` wraps it.
"""

from __future__ import annotations

from threadline.agent._events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    Loop,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.agent._gate import Pause, ResumeTurn, ToolGate
from threadline.agent._loop import AfterToolCall, AgentLoop, BeforeToolCall, Deny

__all__ = [
    "AfterToolCall",
    "AgentEnd",
    "AgentEvent",
    "AgentLoop",
    "AgentStart",
    "BeforeToolCall",
    "Deny",
    "Loop",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "Pause",
    "ResumeTurn",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "ToolExecutionUpdate",
    "ToolGate",
    "TurnEnd",
    "TurnStart",
]
