"""Crash repair: answer tool calls a crash left without results.

The durable agent stores an assistant message before its tools run, so a
process that dies mid-tool leaves calls with no results on the path, a state
every provider rejects. On open the agent appends one synthesized
"interrupted" result per orphaned call. Repair only appends, and a repaired
path has nothing left to repair, so reopening is idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadline.ai._messages import AssistantMessage, ToolResultMessage, synthesized_result
from threadline.session._context import sent_to_model
from threadline.session._entries import Entry, MessageEntry

__all__ = ["orphaned_results"]


def orphaned_results(path: Sequence[Entry]) -> list[ToolResultMessage]:
    """Synthesized results for every call on ``path`` that has none, in call order."""
    open_calls: dict[str, str] = {}
    for entry in path:
        if not isinstance(entry, MessageEntry):
            continue
        message = entry.message
        if isinstance(message, AssistantMessage):
            if not sent_to_model(message):
                continue  # a failed request's calls never ran and are never sent back
            for call in message.tool_calls:
                open_calls[call.id] = call.name
        elif isinstance(message, ToolResultMessage):
            open_calls.pop(message.tool_call_id, None)
    return [synthesized_result(i, name, "interrupted") for i, name in open_calls.items()]
