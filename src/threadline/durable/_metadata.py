"""Session metadata from the durable agent: set on open, set later, and a generated title.

Metadata changes are entries (``session/_metadata.py``): the agent
appends them at its leaf like any custom entry, and never publishes them
. A generated title is opt-in: ``durable.open(..., title=...)`` with a
``TitleGenerator``; after the first exchange of a session that has no title
the agent asks it for one and stores it as a metadata change.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from msgspec import UNSET

from threadline.ai._messages import AssistantMessage, Message, UserMessage
from threadline.ai._model import LanguageModel
from threadline.durable._compaction import summarize
from threadline.errors import ConfigError, ThreadlineError
from threadline.session._entries import CustomEntry, Entry
from threadline.session._metadata import (
    METADATA_KIND,
    MetadataChange,
    SessionMetadata,
    metadata_change,
)

__all__ = ["GeneratedTitle", "TitleGenerator", "change_entry", "opening_change",
           "title_after_first_exchange"]

log = logging.getLogger("threadline.session")

TitleGenerator = Callable[[Sequence[Message]], Awaitable[str | None]]
"""Given the first exchange's messages, a title (or None for none)."""

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

    async def __call__(self, messages: Sequence[Message]) -> str | None:
        text = await summarize(self.model, messages, instructions=self.instructions)
        line = " ".join(text.split())[: self.max_chars].strip()
        return line or None


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
                                     generate: TitleGenerator) -> Entry | None:
    """The entry to store a generated title, if the session has none and holds an exchange.

    A failing generator is logged and leaves the session untitled: the run
    it follows has already been stored.
    """
    if metadata.title is not None:
        return None
    if not (any(isinstance(m, UserMessage) for m in messages)
            and any(isinstance(m, AssistantMessage) and m.text for m in messages)):
        return None
    try:
        title = await generate(messages)
        if title is None:
            return None
        change = metadata_change(title=title)
    except (ThreadlineError, ValueError, TypeError) as exc:
        log.warning("session %s: no generated title: %s: %s", session_id,
                    type(exc).__name__, exc)
        return None
    return change_entry(change)
