"""Building the model context from a path of entries.

Pure: entries in, messages out. The result is valid for every provider we
speak to: each tool call is answered by exactly one result placed right
after its assistant message, results without a call are dropped, and failed
or empty assistant messages (which some providers reject) are left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolResultMessage,
    UserMessage,
    synthesized_result,
)
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
)

__all__ = [
    "BRANCH_SUMMARY_PREFIX",
    "COMPACTION_PREFIX",
    "build_context",
    "interrupted_result",
    "normalize_tool_pairs",
]

COMPACTION_PREFIX = (
    "The earlier part of this conversation was condensed into the summary below.\n\n"
)
BRANCH_SUMMARY_PREFIX = (
    "Before this point the conversation explored another branch, summarized below.\n\n"
)


def interrupted_result(call_id: str, tool_name: str) -> ToolResultMessage:
    """The result the library writes for a call that never got one."""
    return synthesized_result(call_id, tool_name, "interrupted")


def build_context(path: Sequence[Entry]) -> list[Message]:
    """The messages a model should see for ``path`` (root first)."""
    start = 0
    messages: list[Message] = []
    for i in range(len(path) - 1, -1, -1):
        entry = path[i]
        if isinstance(entry, CompactionEntry):
            messages.append(UserMessage.of(COMPACTION_PREFIX + entry.summary))
            kept = next(
                (j for j in range(i) if path[j].id == entry.first_kept_entry_id), i
            )
            messages.extend(_visible(path[kept:i]))
            start = i + 1
            break
    messages.extend(_visible(path[start:]))
    return normalize_tool_pairs(messages)


def _visible(entries: Sequence[Entry]) -> list[Message]:
    out: list[Message] = []
    for entry in entries:
        if isinstance(entry, MessageEntry):
            out.append(entry.message)
        elif isinstance(entry, CustomMessageEntry):
            out.append(UserMessage(content=entry.content))
        elif isinstance(entry, BranchSummaryEntry):
            out.append(UserMessage.of(BRANCH_SUMMARY_PREFIX + entry.summary))
        # Compaction entries were handled by the caller; custom and opaque
        # entries are application state the model never sees.
    return out


def _is_empty(m: AssistantMessage) -> bool:
    # An aborted stream can leave a text block that never got a character;
    # providers reject such a message as much as one with no content at all.
    return all(isinstance(p, TextPart) and not p.text for p in m.content)


def normalize_tool_pairs(messages: Sequence[Message]) -> list[Message]:
    """Place exactly one result right after each assistant message's tool calls.

    A result found later (for instance after a user message appended while a
    tool ran) is moved up; a missing one is synthesized as interrupted; a
    duplicate, or a result whose call is not in the context, is dropped.
    """
    # A call id may repeat across turns (some models number calls per turn),
    # so a result answers the most recent open call with its id.
    out: list[Message | list[ToolResultMessage | None]] = []
    open_calls: dict[str, tuple[list[ToolResultMessage | None], int]] = {}
    for m in messages:
        if isinstance(m, ToolResultMessage):
            slot = open_calls.pop(m.tool_call_id, None)
            if slot is not None:
                slot[0][slot[1]] = m
            continue
        if isinstance(m, AssistantMessage):
            if m.stop_reason == "error" or _is_empty(m):
                continue
            out.append(m)
            calls = m.tool_calls
            if calls:
                slots: list[ToolResultMessage | None] = [None] * len(calls)
                for k, call in enumerate(calls):
                    open_calls[call.id] = (slots, k)
                out.append(slots)
            continue
        out.append(m)
    flat: list[Message] = []
    for item in out:
        if isinstance(item, list):
            owner = flat[-1] if flat else None
            assert isinstance(owner, AssistantMessage)
            for call, result in zip(owner.tool_calls, item, strict=True):
                flat.append(result or interrupted_result(call.id, call.name))
        else:
            flat.append(item)
    return flat
