"""The LanguageModel protocol and the events a model stream yields.

A model turns one request (system prompt, messages, tool specs) into a stream
of events that ends with exactly one terminal event: ``DoneEvent`` or
``ErrorEvent``. Both carry the final ``AssistantMessage``; usage and stop
reason live on it. A provider never raises out of ``stream`` for a provider
failure: it yields an ``ErrorEvent`` whose message has stop reason ``error``
(or ``aborted`` when the abort signal fired or the consumer cancelled) and
whose ``error`` is the typed ``ModelError`` for callers that retry.

Event order for one stream::

    StartEvent
    ( TextStart TextDelta* TextEnd
    | ThinkingStart ThinkingDelta* ThinkingEnd
    | ToolCallStart ToolCallDelta* ToolCallEnd )*
    DoneEvent | ErrorEvent

``index`` is the position of the block in the final message's ``content``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from threadline.ai._messages import AssistantMessage, Message, ToolCall
from threadline.errors import ModelError

__all__ = [
    "DoneEvent",
    "ErrorEvent",
    "LanguageModel",
    "ModelInfo",
    "ReasoningEffort",
    "Request",
    "StartEvent",
    "StreamEvent",
    "StreamOptions",
    "TextDelta",
    "TextEnd",
    "TextStart",
    "ThinkingDelta",
    "ThinkingEnd",
    "ThinkingStart",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolSpec",
]

ReasoningEffort: TypeAlias = Literal["minimal", "low", "medium", "high"]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the loop and compaction need to know about a model."""

    provider: str
    id: str
    context_window: int = 128_000
    max_output_tokens: int = 8_192
    images: bool = False
    reasoning: bool = False


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Request:
    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()


@dataclass(slots=True)
class StreamOptions:
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: ReasoningEffort | None = None
    abort: asyncio.Event | None = None
    """When set, the stream stops, closes its connection and ends with an
    ``ErrorEvent`` whose message has stop reason ``aborted``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Provider-specific request fields, passed through unchanged."""


@dataclass(frozen=True, slots=True)
class StartEvent:
    model: str
    provider: str
    type: Literal["start"] = "start"


@dataclass(frozen=True, slots=True)
class TextStart:
    index: int
    type: Literal["text_start"] = "text_start"


@dataclass(frozen=True, slots=True)
class TextDelta:
    index: int
    delta: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class TextEnd:
    index: int
    text: str
    type: Literal["text_end"] = "text_end"


@dataclass(frozen=True, slots=True)
class ThinkingStart:
    index: int
    type: Literal["thinking_start"] = "thinking_start"


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    index: int
    delta: str
    type: Literal["thinking_delta"] = "thinking_delta"


@dataclass(frozen=True, slots=True)
class ThinkingEnd:
    index: int
    thinking: str
    signature: str | None = None
    type: Literal["thinking_end"] = "thinking_end"


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str
    type: Literal["toolcall_start"] = "toolcall_start"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    delta: str
    """A fragment of the arguments' JSON text."""
    type: Literal["toolcall_delta"] = "toolcall_delta"


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    index: int
    tool_call: ToolCall
    type: Literal["toolcall_end"] = "toolcall_end"


@dataclass(frozen=True, slots=True)
class DoneEvent:
    message: AssistantMessage
    type: Literal["done"] = "done"


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    message: AssistantMessage
    """Final message; stop reason ``error`` or ``aborted``, ``error_message`` set."""
    error: ModelError | None = None
    type: Literal["error"] = "error"


StreamEvent: TypeAlias = (
    StartEvent | TextStart | TextDelta | TextEnd | ThinkingStart | ThinkingDelta
    | ThinkingEnd | ToolCallStart | ToolCallDelta | ToolCallEnd | DoneEvent | ErrorEvent
)


@runtime_checkable
class LanguageModel(Protocol):
    """Anything that streams one assistant message per request."""

    @property
    def info(self) -> ModelInfo: ...

    def stream(
        self, request: Request, options: StreamOptions | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Stream one assistant message. Must end with DoneEvent or ErrorEvent,
        and must stop promptly (ending with an ``aborted`` ErrorEvent) when
        ``options.abort`` is set or the iterator is closed."""
        ...
