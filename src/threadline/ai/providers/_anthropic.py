"""Anthropic Messages through the ``anthropic`` SDK.

Thinking blocks keep their signature and redacted thinking keeps its opaque
data (in ``signature``, with ``redacted`` set); both go back unchanged to the
same model, which needs them to continue a tool-using turn. The system prompt
and the latest message carry cache breakpoints, so a long conversation is read
from the prompt cache instead of being paid for again each turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
)
from threadline.ai._model import (
    BlobUpload,
    ModelInfo,
    ReasoningEffort,
    Request,
    StreamEvent,
    StreamOptions,
)
from threadline.ai.providers._common import (
    DEFAULT_MAX_RETRIES,
    IMAGE_OMITTED,
    Blob,
    Blobs,
    Builder,
    SDKModel,
    classify,
    connection_error,
    error_fields,
    normalize_id,
    other_error,
    resolved,
    same_model,
    thinking_as_text,
)
from threadline.errors import ModelError, TransientProviderError, missing_extra

try:
    import anthropic
    import httpx2
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("anthropic", "the Anthropic provider", exc) from exc

__all__ = ["AnthropicModel"]

API = "anthropic-messages"
MAX_ID_LEN = 64
THINKING_BUDGET: dict[ReasoningEffort, int] = {
    "minimal": 1024, "low": 4096, "medium": 10_000, "high": 32_000,
}
_STOP: dict[str, StopReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
    "tool_use": "tool_use", "model_context_window_exceeded": "length",
}
_CACHE = {"type": "ephemeral"}


class AnthropicModel(SDKModel):
    """A LanguageModel speaking the Anthropic Messages API."""

    def __init__(
        self,
        info: ModelInfo,
        *,
        api_key: str,
        base_url: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cache: bool = True,
        upload: BlobUpload | None = None,
    ) -> None:
        self._cache = cache
        super().__init__(info, anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=max_retries,
            default_headers=headers,
            timeout=anthropic.NOT_GIVEN if timeout is None else timeout,
        ), upload)

    API = API
    # json: the SDK parses each server-sent event with the json module.
    BACKEND_ERRORS = (anthropic.AnthropicError, httpx2.TransportError, json.JSONDecodeError)

    async def _create(self, body: dict[str, Any]) -> Any:
        return await self._client.messages.create(**body)

    def _state(self, builder: Builder) -> _State:
        return _State(builder)

    def request_body(self, request: Request, options: StreamOptions,
                     blobs: Blobs | None = None) -> dict[str, Any]:
        """The keyword arguments for ``messages.create``."""
        info = self._info
        max_tokens = options.max_tokens or info.max_output_tokens
        body: dict[str, Any] = {
            "model": info.id,
            "messages": to_anthropic_messages(request.messages, info, cache=self._cache,
                                              blobs=blobs),
            "stream": True,
        }
        if request.system:
            block: dict[str, Any] = {"type": "text", "text": request.system}
            if self._cache:
                block["cache_control"] = _CACHE
            body["system"] = [block]
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        if options.reasoning_effort is not None:
            budget = THINKING_BUDGET[options.reasoning_effort]
            # The budget counts toward max_tokens and must stay below it.
            max_tokens = max(max_tokens, budget + 1024)
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = max_tokens
        extra = dict(options.extra)
        if options.temperature is not None and "thinking" not in body:
            # Not allowed together with thinking; and the SDK no longer names it.
            extra.setdefault("temperature", options.temperature)
        if extra:
            body["extra_body"] = extra
        return body

    def _translate(self, exc: Exception) -> ModelError:
        origin = self.origin
        if isinstance(exc, anthropic.APIStatusError):
            # An error event inside a 200 stream arrives with the stream's status.
            status = exc.status_code if exc.status_code >= 400 else None
            message, _, kind = error_fields(exc.body)
            return classify(message or exc.message, origin=origin, status=status,
                            code=getattr(exc, "error_code", None),  # anthropic >= 2.5 only
                            kind=kind, headers=exc.response.headers)
        if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
            return connection_error(exc, origin)
        return other_error(exc, origin)


class _State:
    """Turns Messages stream events into our stream events."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder
        self.blocks: dict[int, int] = {}  # the API's block index -> ours
        self.stopped = False
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {}

    def _take_usage(self, u: Any) -> None:
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                    "cache_creation_input_tokens"):
            value = getattr(u, key, None)
            if value is not None:
                self.usage[key] = value
        self.b.usage = Usage(
            input_tokens=self.usage.get("input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            cache_read_tokens=self.usage.get("cache_read_input_tokens", 0),
            cache_write_tokens=self.usage.get("cache_creation_input_tokens", 0),
        )

    def handle(self, event: Any) -> Iterable[StreamEvent]:
        kind = event.type
        if kind == "message_start":
            self.b.response_id = event.message.id
            self._take_usage(event.message.usage)
        elif kind == "content_block_start":
            return self._block_start(event.index, event.content_block)
        elif kind == "content_block_delta":
            at = self.blocks.get(event.index)
            if at is not None:
                return self._block_delta(at, event.delta)
        elif kind == "content_block_stop":
            at = self.blocks.get(event.index)
            if at is not None and (end := self.b.close(at)) is not None:
                return (end,)
        elif kind == "message_delta":
            if event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            if event.usage is not None:
                self._take_usage(event.usage)
        elif kind == "message_stop":
            self.stopped = True
        return ()

    def _block_start(self, index: int, block: Any) -> list[StreamEvent]:
        b = self.b
        initial = ""
        if block.type == "text":
            i, start = b.open_text()
            initial = block.text
        elif block.type == "thinking":
            i, start = b.open_thinking()
            initial = block.thinking
            b.blocks[i].signature = block.signature or None
        elif block.type == "redacted_thinking":
            i, start = b.open_thinking(redacted=True)
            b.blocks[i].signature = block.data
        elif block.type == "tool_use":
            i, start = b.open_tool(block.id, block.name)
        else:
            return []  # server tools and their results are not part of our messages
        self.blocks[index] = i
        return [start, b.delta(i, initial)] if initial else [start]

    def _block_delta(self, at: int, delta: Any) -> Iterable[StreamEvent]:
        b = self.b
        if delta.type == "text_delta":
            return (b.delta(at, delta.text),)
        if delta.type == "thinking_delta":
            return (b.delta(at, delta.thinking),)
        if delta.type == "input_json_delta":
            return (b.delta(at, delta.partial_json),) if delta.partial_json else ()
        if delta.type == "signature_delta":
            b.blocks[at].signature = (b.blocks[at].signature or "") + delta.signature
        return ()

    def finish(self) -> list[StreamEvent]:
        b = self.b
        if not self.stopped:
            raise b.origin.error("the stream ended before message_stop", TransientProviderError)
        if self.stop_reason == "refusal":
            raise b.origin.error("the model refused to answer")
        b.stop_reason = _STOP.get(self.stop_reason or "end_turn", "stop")
        return b.done()


# --------------------------------------------------------------------------- transcript


def _content(parts: Iterable[UserContent], info: ModelInfo,
             blobs: Blobs | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart):
            if p.text:  # the API rejects empty text blocks
                out.append({"type": "text", "text": p.text})
        elif isinstance(p, BlobPart):
            out.append(_blob(resolved(blobs, p), info))
        elif info.images:
            out.append({"type": "image", "source": {
                "type": "base64", "media_type": p.mime_type, "data": p.data}})
        else:
            out.append({"type": "text", "text": IMAGE_OMITTED})
    return out


def _blob(blob: Blob, info: ModelInfo) -> dict[str, Any]:
    kind, ref, media = blob.kind, blob.ref, blob.part.media_type
    if kind == "image" and not info.images:
        return {"type": "text", "text": IMAGE_OMITTED}
    if kind == "other":
        return {"type": "text", "text": blob.note()}
    source: dict[str, Any]
    if ref is not None and ref.file_id:  # the Files API (a beta header the caller sets)
        source = {"type": "file", "file_id": ref.file_id}
    elif ref is not None and ref.url:
        source = {"type": "url", "url": ref.url}
    elif kind == "text":
        # Plain-text documents are the one text form the API takes.
        source = {"type": "text", "media_type": "text/plain",
                  "data": blob.data.decode("utf-8", "replace")}
    else:
        source = {"type": "base64", "media_type": media, "data": blob.base64}
    if kind == "image":
        return {"type": "image", "source": source}
    return {"type": "document", "source": source, "title": blob.name}


def _assistant(m: AssistantMessage, info: ModelInfo) -> list[dict[str, Any]]:
    native = same_model(m, info, API)
    out: list[dict[str, Any]] = []
    for p in m.content:
        if isinstance(p, TextPart):
            if p.text:
                out.append({"type": "text", "text": p.text})
        elif isinstance(p, ThinkingPart):
            if native and p.redacted and p.signature:
                out.append({"type": "redacted_thinking", "data": p.signature})
            elif native and p.signature:
                out.append({"type": "thinking", "thinking": p.thinking,
                            "signature": p.signature})
            elif (text := thinking_as_text(p)) is not None:
                out.append({"type": "text", "text": text})
        elif isinstance(p, ToolCall):
            out.append({"type": "tool_use", "id": normalize_id(p.id, MAX_ID_LEN),
                        "name": p.name, "input": p.arguments})
    return out


def to_anthropic_messages(
    messages: Iterable[Message], info: ModelInfo, *, cache: bool = False,
    blobs: Blobs | None = None,
) -> list[dict[str, Any]]:
    """Our transcript as Messages API turns: roles alternate, tool results ride in user turns."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, AssistantMessage):
            role, blocks = "assistant", _assistant(m, info)
        elif isinstance(m, ToolResultMessage):
            role, blocks = "user", [{
                "type": "tool_result", "tool_use_id": normalize_id(m.tool_call_id, MAX_ID_LEN),
                "content": (_content(m.content, info, blobs)
                            or [{"type": "text", "text": "(no output)"}]),
                "is_error": m.is_error,
            }]
        else:
            role, blocks = "user", _content(m.content, info, blobs)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if cache and out and out[-1]["role"] == "user":
        last = out[-1]["content"][-1]
        out[-1]["content"][-1] = {**last, "cache_control": _CACHE}
    return out
