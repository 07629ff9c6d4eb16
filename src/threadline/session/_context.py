"""Building the model context from a path of entries.

Pure: entries in, messages out. The result is valid for every provider we
speak to: each tool call is answered by exactly one result placed right
after its assistant message, results without a call are dropped, and failed
or empty assistant messages (which some providers reject) are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    "Visible",
    "build_context",
    "model_view",
    "normalize_tool_pairs",
    "sent_to_model",
    "visible_entries",
]

COMPACTION_PREFIX = (
    "The earlier part of this conversation was condensed into the summary below.\n\n"
)
BRANCH_SUMMARY_PREFIX = (
    "Before this point the conversation explored another branch, summarized below.\n\n"
)


@dataclass(frozen=True, slots=True)
class Visible:
    """What of a path the model sees: the latest compaction and the entries it shows."""

    compaction: CompactionEntry | None
    """The latest compaction on the path; its summary stands for what it folded."""
    kept: list[Entry]
    """Entries before that compaction that it kept verbatim (empty without one)."""
    recent: list[Entry]
    """Entries after it (the whole path when there is none)."""

    @property
    def entries(self) -> list[Entry]:
        return self.kept + self.recent


def visible_entries(path: Sequence[Entry]) -> Visible:
    """Split ``path`` (root first) the way ``build_context`` reads it.

    Compaction entries themselves are never among the entries shown.
    """
    for i in range(len(path) - 1, -1, -1):
        entry = path[i]
        if isinstance(entry, CompactionEntry):
            start = next((j for j in range(i) if path[j].id == entry.first_kept_entry_id), i)
            return Visible(entry, _shown(path[start:i]), _shown(path[i + 1 :]))
    return Visible(None, [], _shown(path))


def _shown(entries: Sequence[Entry]) -> list[Entry]:
    return [e for e in entries if not isinstance(e, CompactionEntry)]


def sent_to_model(message: AssistantMessage) -> bool:
    """Whether a stored assistant message goes into the context at all.

    A failed request (``stop_reason="error"``) never happened as far as the
    model is concerned, and an empty message (an aborted stream can leave a
    text block that never got a character) is rejected by providers.
    """
    if message.stop_reason == "error":
        return False
    return not all(isinstance(p, TextPart) and not p.text for p in message.content)


def model_view(entry: Entry) -> Message | None:
    """The message the model sees for ``entry``, or None if it sees none.

    Custom entries and entries of unknown types are application state the
    model never sees; compactions are read by ``visible_entries``. An erased
    entry has no content left, and a sealed one could not be opened: the
    model sees neither, and ``normalize_tool_pairs`` answers a call whose
    result is gone, or drops a result whose call is.
    """
    if isinstance(entry, MessageEntry):
        m = entry.message
        if isinstance(m, AssistantMessage) and not sent_to_model(m):
            return None
        return m
    if isinstance(entry, CustomMessageEntry):
        return UserMessage(content=entry.content)
    if isinstance(entry, BranchSummaryEntry):
        # An empty summary only records where the conversation moved (S31).
        return UserMessage.of(BRANCH_SUMMARY_PREFIX + entry.summary) if entry.summary else None
    return None


def build_context(path: Sequence[Entry]) -> list[Message]:
    """The messages a model should see for ``path`` (root first)."""
    visible = visible_entries(path)
    messages: list[Message] = []
    if visible.compaction is not None:
        messages.append(UserMessage.of(COMPACTION_PREFIX + visible.compaction.summary))
    messages.extend(m for e in visible.entries if (m := model_view(e)) is not None)
    return normalize_tool_pairs(messages)


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
            if not sent_to_model(m):
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
                flat.append(result or synthesized_result(call.id, call.name, "interrupted"))
        else:
            flat.append(item)
    return flat
