"""Session metadata from the durable agent: set on open, set later, and a generated title.

Metadata changes are entries (``session/_metadata.py``): the agent
appends them at its leaf like any custom entry, and never publishes them
. A generated title is opt-in: ``durable.open(..., title=...)`` with a
``TitleGenerator``; after the first exchange of a session that has no title
the agent asks it for one and stores it as a metadata change, after a
``threadline.usage`` record of the call when the generator reports one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from threadline.ai._messages import AssistantMessage, Message, UserMessage
from threadline.ai._model import LanguageModel
from threadline.durable._compaction import _summarize
from threadline.durable._usage import USAGE_KIND, UsageRecord
from threadline.errors import ConfigError, ThreadlineError
from threadline.session._entries import CustomEntry, Entry
from threadline.session._metadata import (
    METADATA_KIND,
    MetadataChange,
    SessionMetadata,
    metadata_change,
)

__all__ = ["GeneratedTitle", "TitleGenerator", "TitleReply", "change_entry", "opening_change",
           "title_after_first_exchange"]

log = logging.getLogger("threadline.session")

class TitleReply(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``TitleGenerator`` may answer instead of a bare title: the title
    (None for none) and the usage of the model call that made it, which is
    stored as a ``threadline.usage`` record, so ``usage()`` counts it."""

    title: str | None
    usage: UsageRecord | None = None


TitleGenerator = Callable[[Sequence[Message]], Awaitable[str | TitleReply | None]]
"""Given the first exchange's messages, a title (or None for none), or a ``TitleReply``."""

_TITLE_INSTRUCTIONS = (
    "Instead of a summary, answer with only a short title for this conversation: at most "
    "eight words, no quotes, no trailing punctuation.")


class GeneratedTitle:
    """A ``TitleGenerator`` that asks ``model`` for a title, cut to ``max_chars``."""

    def __init__(self, model: LanguageModel, *, instructions: str = _TITLE_INSTRUCTIONS,
                 max_chars: int = 80) -> None:
        if max_chars < 1:
            raise ConfigError(f"GeneratedTitle max_chars must be at least 1, got {max_chars}")
        self.model = model
        self.instructions = instructions
        self.max_chars = max_chars

    async def __call__(self, messages: Sequence[Message]) -> TitleReply:
        reply = await _summarize(self.model, messages, previous_summary=None,
                                 instructions=self.instructions, abort=None)
        line = " ".join(reply.text.split())[: self.max_chars].strip()
        info = self.model.info
        return TitleReply(title=line or None, usage=UsageRecord(
            provider=info.provider, model=info.id, usage=reply.usage, purpose="title"))


def change_entry(change: MetadataChange) -> Entry:
    return CustomEntry(kind=METADATA_KIND, data=change)


def opening_change(current: SessionMetadata,
                   given: Mapping[str, Any] | MetadataChange) -> MetadataChange | None:
    """The change ``durable.open(..., metadata=given)`` appends: only what differs."""
    if isinstance(given, MetadataChange):
        fields: dict[str, Any] = {n: getattr(given, n) for n in ("title", "owner", "tenant")}
        fields["labels"] = given.labels
    elif isinstance(given, Mapping):
        unknown = set(given) - {"title", "owner", "tenant", "labels"}
        if unknown:
            raise ConfigError(f"durable.open metadata: unknown field(s) {sorted(unknown)}; "
                              f"the fields are title, owner, tenant and labels")
        fields = dict(given)
    else:
        raise ConfigError(f"durable.open metadata must be a mapping or a MetadataChange, got "
                          f"{type(given).__name__}")
    change = metadata_change(**fields)
    changed: dict[str, Any] = {}
    for name in ("title", "owner", "tenant"):
        value = getattr(change, name)
        if value is not UNSET and value != getattr(current, name):
            changed[name] = value
    labels = {k: v for k, v in change.labels.items() if current.labels.get(k) != v}
    if not changed and not labels:
        return None
    return MetadataChange(**changed, labels=labels)


async def title_after_first_exchange(session_id: str, metadata: SessionMetadata,
                                     messages: Sequence[Message],
                                     generate: TitleGenerator) -> list[Entry]:
    """The entries to store a generated title, if the session has none and holds an
    exchange: the call's usage record when the generator reports one, then the
    title's metadata change (none without a title; the call's usage still counts).

    A failing generator is logged and leaves the session untitled: the run
    it follows has already been stored.
    """
    if metadata.title is not None:
        return []
    if not (any(isinstance(m, UserMessage) for m in messages)
            and any(isinstance(m, AssistantMessage) and m.text for m in messages)):
        return []
    try:
        answer = await generate(messages)
        reply = answer if isinstance(answer, TitleReply) else TitleReply(title=answer)
        change = None if reply.title is None else metadata_change(title=reply.title)
    except (ThreadlineError, ValueError, TypeError) as exc:
        log.warning("session %s: no generated title: %s: %s", session_id,
                    type(exc).__name__, exc)
        return []
    entries: list[Entry] = []
    if reply.usage is not None:
        entries.append(CustomEntry(kind=USAGE_KIND, data=reply.usage))
    if change is not None:
        entries.append(change_entry(change))
    return entries
