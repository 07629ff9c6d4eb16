"""Provider-neutral conversation data.

These structs are what entries carry and what every provider converts to and
from. They are msgspec structs: immutable (``frozen``), keyword-only, tagged
so a JSON object names its own kind, and excluded from the cyclic garbage
collector (``gc=False``) because they never form cycles; loading a session of
100,000 messages then costs no GC pauses.

Schema rules (stored data outlives the code): a new field always has a
default; a field's type never changes; defaults are omitted when encoding, so
old readers and new writers agree on everything both know.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

__all__ = [
    "AssistantContent",
    "AssistantMessage",
    "BlobPart",
    "ImagePart",
    "Message",
    "StopReason",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolResultMessage",
    "Usage",
    "UserContent",
    "UserMessage",
    "synthesized_result",
]

StopReason: TypeAlias = Literal["stop", "length", "tool_use", "error", "aborted"]
Synthesized: TypeAlias = Literal["aborted", "interrupted"]


class _Part(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False,
            tag_field="type"):
    pass


class TextPart(_Part, frozen=True, tag="text"):
    text: str


class ImagePart(_Part, frozen=True, tag="image"):
    """An image, base64-encoded, with its MIME type (``image/png``...)."""

    data: str
    mime_type: str


class BlobPart(_Part, frozen=True, tag="blob"):
    """A file or image kept beside the log, referenced by its content hash.

    ``sha256`` is 64 lowercase hex digits of the plaintext bytes, ``size``
    their length. ``stores.attach`` stores the bytes and returns the part;
    ``stores.open_blob`` reads them back, checked against both.
    """

    sha256: str
    media_type: str
    size: int
    name: str | None = None


class ThinkingPart(_Part, frozen=True, tag="thinking"):
    """Model reasoning. ``signature`` is the provider's opaque token that lets the
    same provider verify the block when it is sent back; ``redacted`` marks
    encrypted reasoning whose text is in ``signature`` only."""

    thinking: str
    signature: str | None = None
    redacted: bool = False
    provider: str | None = None


class ToolCall(_Part, frozen=True, tag="tool_call"):
    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


UserContent: TypeAlias = TextPart | ImagePart | BlobPart
AssistantContent: TypeAlias = TextPart | ThinkingPart | ToolCall


class Usage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens + self.output_tokens + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


class _Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False,
               tag_field="role"):
    pass


class UserMessage(_Message, frozen=True, tag="user"):
    content: tuple[UserContent, ...]

    @classmethod
    def of(cls, text: str, *images: ImagePart) -> UserMessage:
        """A user message from plain text, optionally followed by images."""
        return cls(content=(TextPart(text=text), *images))

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class AssistantMessage(_Message, frozen=True, tag="assistant"):
    content: tuple[AssistantContent, ...] = ()
    model: str = ""
    provider: str = ""
    api: str = ""
    usage: Usage = Usage()
    stop_reason: StopReason = "stop"
    error_message: str | None = None
    response_id: str | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(p for p in self.content if isinstance(p, ToolCall))


class ToolResultMessage(_Message, frozen=True, tag="tool_result"):
    """The result of one tool call.

    ``synthesized`` is set when the library wrote the result itself (a run was
    aborted, or crash repair found a call with no result): ``"aborted"`` or
    ``"interrupted"``. ``details`` is structured data for the application; it
    is stored but never sent to a model.
    """

    tool_call_id: str
    tool_name: str
    content: tuple[UserContent, ...] = ()
    is_error: bool = False
    synthesized: Synthesized | None = None
    details: Any = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


Message: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage


_SYNTHESIZED_TEXT: dict[Synthesized, str] = {
    "aborted": "Tool call aborted: the run was stopped before the tool finished.",
    "interrupted": (
        "This tool call was interrupted before it returned a result; its outcome is unknown. "
        "Check its effects before relying on them or calling it again."
    ),
}


def synthesized_result(call_id: str, tool_name: str, kind: Synthesized) -> ToolResultMessage:
    """The error result the library writes for a call nobody ran to the end.

    ``aborted``: the run was stopped before the tool finished. ``interrupted``:
    the process went away and the outcome is unknown (the tool may have acted).
    """
    return ToolResultMessage(
        tool_call_id=call_id, tool_name=tool_name, is_error=True, synthesized=kind,
        content=(TextPart(text=_SYNTHESIZED_TEXT[kind]),),
    )
