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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from threadline.ai._messages import AssistantMessage, BlobPart, Message, ToolCall
from threadline.errors import ModelError

__all__ = [
    "BlobReader",
    "BlobRef",
    "BlobUpload",
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


BlobReader: TypeAlias = Callable[[BlobPart], Awaitable[bytes]]
"""Reads the bytes a ``BlobPart`` references, checked against its hash and size.
Raises ``BlobNotFound`` (naming the session, the entry and the hash when it
knows them) for a blob that is not there."""


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where a provider finds a blob itself instead of receiving its bytes in the
    request: ``file_id`` from the provider's files API, or a ``url`` it can fetch."""

    file_id: str | None = None
    url: str | None = None


BlobUpload: TypeAlias = Callable[[BlobPart, BlobReader], Awaitable["BlobRef | None"]]
"""The large-file hook a provider model takes (``upload=``): called with each
blob of a request and a reader for its bytes, it returns where the provider
finds the file (after uploading it, or a URL), or None to send it inline."""


@dataclass(frozen=True, slots=True)
class Request:
    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    blobs: BlobReader | None = None
    """How the provider reads the ``BlobPart`` content of ``messages`` when it
    builds the request (S60). The durable agent sets it from its store; a
    request holding blob references without it fails with ``BlobNotFound``."""


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


class _StreamEvent(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type"):
    """Base of the stream events: tagged by ``type``, as they appear on a JSON wire."""


class StartEvent(_StreamEvent, frozen=True, tag="start"):
    type: ClassVar[Literal["start"]] = "start"
    model: str
    provider: str


class TextStart(_StreamEvent, frozen=True, tag="text_start"):
    type: ClassVar[Literal["text_start"]] = "text_start"
    index: int


class TextDelta(_StreamEvent, frozen=True, tag="text_delta"):
    type: ClassVar[Literal["text_delta"]] = "text_delta"
    index: int
    delta: str


class TextEnd(_StreamEvent, frozen=True, tag="text_end"):
    type: ClassVar[Literal["text_end"]] = "text_end"
    index: int
    text: str


class ThinkingStart(_StreamEvent, frozen=True, tag="thinking_start"):
    type: ClassVar[Literal["thinking_start"]] = "thinking_start"
    index: int


class ThinkingDelta(_StreamEvent, frozen=True, tag="thinking_delta"):
    type: ClassVar[Literal["thinking_delta"]] = "thinking_delta"
    index: int
    delta: str


class ThinkingEnd(_StreamEvent, frozen=True, tag="thinking_end"):
    type: ClassVar[Literal["thinking_end"]] = "thinking_end"
    index: int
    thinking: str
    signature: str | None = None


class ToolCallStart(_StreamEvent, frozen=True, tag="toolcall_start"):
    type: ClassVar[Literal["toolcall_start"]] = "toolcall_start"
    index: int
    id: str
    name: str


class ToolCallDelta(_StreamEvent, frozen=True, tag="toolcall_delta"):
    type: ClassVar[Literal["toolcall_delta"]] = "toolcall_delta"
    index: int
    delta: str
    """A fragment of the arguments' JSON text."""


class ToolCallEnd(_StreamEvent, frozen=True, tag="toolcall_end"):
    type: ClassVar[Literal["toolcall_end"]] = "toolcall_end"
    index: int
    tool_call: ToolCall


class DoneEvent(_StreamEvent, frozen=True, tag="done"):
    type: ClassVar[Literal["done"]] = "done"
    message: AssistantMessage


class ErrorEvent(_StreamEvent, frozen=True, tag="error"):
    type: ClassVar[Literal["error"]] = "error"
    message: AssistantMessage
    """Final message; stop reason ``error`` or ``aborted``, ``error_message`` set."""
    error: ModelError | None = None


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
