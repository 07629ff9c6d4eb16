"""The inner agent loop: model + tools + context -> an async stream of events.

It knows nothing about storage; ``threadline.durable`` wraps it.
"""

from __future__ import annotations

from threadline.agent.events import (
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
