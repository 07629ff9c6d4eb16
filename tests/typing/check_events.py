"""Static checks, run by mypy in tests/test_typing.py (never imported by pytest).

``event.type`` narrows every event union to the one class with that tag.
"""

from __future__ import annotations

from typing import assert_type

from threadline.agent import AgentEnd, AgentEvent, MessageEnd, ToolExecutionEnd
from threadline.ai import Message, StreamEvent, TextDelta, ToolResultMessage
from threadline.durable import (
    LifecycleEvent,
    RunEvent,
    RunStarted,
    SessionCreated,
    StoredMessageEnd,
)
from threadline.session import Entry


def run_events(event: RunEvent) -> None:
    if event.type == "message_end":
        assert_type(event, StoredMessageEnd)
        assert_type(event.entries, tuple[Entry, ...])
    elif event.type == "run_started":
        assert_type(event, RunStarted)
    elif event.type == "tool_execution_end":
        assert_type(event.result, ToolResultMessage)
    elif event.type == "agent_end":
        assert_type(event, AgentEnd)
        assert_type(event.error, BaseException | None)


def loop_events(event: AgentEvent) -> None:
    if event.type == "message_end":
        assert_type(event, MessageEnd)
        assert_type(event.message, Message)
    elif event.type == "tool_execution_end":
        assert_type(event, ToolExecutionEnd)


def stream_events(event: StreamEvent) -> None:
    if event.type == "text_delta":
        assert_type(event, TextDelta)
        assert_type(event.delta, str)


def lifecycle(event: LifecycleEvent) -> None:
    if event.type == "session_init":
        assert_type(event, SessionCreated)
        assert_type(event.parent_id, str | None)
