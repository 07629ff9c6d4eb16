"""OpenAI Chat Completions (and the servers that copy it) through the ``openai`` SDK.

Works with api.openai.com and OpenAI-compatible servers (Ollama, vLLM,
llama.cpp server, OpenRouter) through ``base_url``. Reasoning text that such
servers stream in ``reasoning_content`` or ``reasoning`` becomes thinking
blocks; the field name is kept as the block's signature so the same model
gets it back in the same field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
)
from threadline.ai._model import BlobUpload, ModelInfo, Request, StreamEvent, StreamOptions
from threadline.ai.providers._common import (
    DEFAULT_MAX_RETRIES,
    IMAGE_OMITTED,
    Blob,
    Blobs,
    Builder,
    SDKModel,
    classify,
    connection_error,
    data_url,
    error_fields,
    normalize_id,
    other_error,
    resolved,
    same_model,
    thinking_as_text,
)
from threadline.errors import ModelError, TransientProviderError, missing_extra

try:
    import httpx2
    import openai
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("openai", "the OpenAI providers", exc) from exc

__all__ = ["OpenAIChatModel"]

API = "openai-chat"
MAX_ID_LEN = 40  # OpenAI rejects longer tool_call ids in chat messages
_REASONING_FIELDS = ("reasoning_content", "reasoning")
_FINISH: dict[str, StopReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_use", "function_call": "tool_use",
}


class OpenAIClientModel(SDKModel):
    """An ``SDKModel`` on the official ``openai`` async client (both OpenAI APIs)."""

    # json: the SDK parses each server-sent event with the json module.
    BACKEND_ERRORS = (openai.OpenAIError, httpx2.TransportError, json.JSONDecodeError)

    def __init__(
        self,
        info: ModelInfo,
        *,
        api_key: str,
        base_url: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        upload: BlobUpload | None = None,
    ) -> None:
        super().__init__(info, openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=max_retries,
            default_headers=headers,
            timeout=openai.NOT_GIVEN if timeout is None else timeout,
        ), upload)

    def _translate(self, exc: Exception) -> ModelError:
        origin = self.origin
        if isinstance(exc, openai.APIStatusError):
            message, code, kind = error_fields(exc.body)
            return classify(
                message or exc.message, origin=origin, status=exc.status_code,
                code=code or exc.code, kind=kind or exc.type, headers=exc.response.headers,
            )
        if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            return connection_error(exc, origin)
        if isinstance(exc, openai.APIError):  # an error object inside the stream
            message, code, kind = error_fields(exc.body)
            return classify(message or exc.message, origin=origin, code=code or exc.code,
                            kind=kind or exc.type)
        return other_error(exc, origin)


class OpenAIChatModel(OpenAIClientModel):
    """A LanguageModel speaking the Chat Completions API."""

    API = API

    async def _create(self, body: dict[str, Any]) -> Any:
        return await self._client.chat.completions.create(**body)

    def _state(self, builder: Builder) -> _State:
        return _State(builder)

    def request_body(self, request: Request, options: StreamOptions,
                     blobs: Blobs | None = None) -> dict[str, Any]:
        """The keyword arguments for ``chat.completions.create``."""
        info = self._info
        body: dict[str, Any] = {
            "model": info.id,
            "messages": to_chat_messages(request.system, request.messages, info, blobs),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        if options.max_tokens is not None:
            # api.openai.com wants the new name; most compatible servers know the old one.
            key = "max_completion_tokens" if info.provider == "openai" else "max_tokens"
            body[key] = options.max_tokens
        if options.temperature is not None:
            body["temperature"] = options.temperature
        if options.reasoning_effort is not None:
            body["reasoning_effort"] = options.reasoning_effort
        if options.extra:
            body["extra_body"] = dict(options.extra)
        return body

class _State:
    """Turns chat-completion chunks into stream events."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder
        self.current: int | None = None  # index of the open block
        self.tools: dict[int, int] = {}  # the API's tool-call index -> block index
        self.finish_reason: str | None = None

    def _switch(self, events: list[StreamEvent]) -> None:
        if self.current is not None and (end := self.b.close(self.current)) is not None:
            events.append(end)
        self.current = None

    def _append(self, kind: str, text: str, events: list[StreamEvent],
                signature: str | None = None) -> None:
        cur = self.current
        if cur is None or self.b.blocks[cur].kind != kind:
            self._switch(events)
            cur, start = self.b.open_text() if kind == "text" else self.b.open_thinking()
            self.b.blocks[cur].signature = signature
            self.current = cur
            events.append(start)
        events.append(self.b.delta(cur, text))

    def handle(self, chunk: Any) -> Iterable[StreamEvent]:
        events: list[StreamEvent] = []
        if chunk.id:
            self.b.response_id = chunk.id
        if chunk.usage is not None:
            self.b.usage = _usage(chunk.usage)
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                for name in _REASONING_FIELDS:
                    reasoning = getattr(delta, name, None)
                    if isinstance(reasoning, str) and reasoning:
                        self._append("thinking", reasoning, events, signature=name)
                        break
                if delta.content:
                    self._append("text", delta.content, events)
                for tc in delta.tool_calls or ():
                    self._tool_delta(tc, events)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return events

    def _tool_delta(self, tc: Any, events: list[StreamEvent]) -> None:
        fn = getattr(tc, "function", None)
        call_id = getattr(tc, "id", None)
        key = getattr(tc, "index", None)
        if key is None:  # some servers omit the index: a new id starts a new call
            key = len(self.tools) - (0 if call_id or not self.tools else 1)
        block = self.tools.get(key)
        if block is None:
            self._switch(events)
            block, start = self.b.open_tool(call_id or f"call_{key}", (fn and fn.name) or "")
            self.tools[key] = block
            self.current = block
            events.append(start)
        elif not self.b.is_open(block):
            raise self.b.origin.error(
                f"the server interleaved tool-call fragments (call {key} resumed after "
                "another began)")
        if fn is not None and fn.arguments:
            events.append(self.b.delta(block, fn.arguments))

    def finish(self) -> list[StreamEvent]:
        reason = self.finish_reason
        if reason is None:
            # Every server we know ends a choice with a reason; without one the
            # answer was cut off and must not pass for a complete one.
            raise self.b.origin.error("the stream ended without a finish reason",
                                      TransientProviderError)
        if reason == "content_filter":
            raise self.b.origin.error("the response was stopped by a content filter")
        self.b.stop_reason = _FINISH.get(reason, "stop")
        return self.b.done()


def _usage(u: Any) -> Usage:
    prompt = u.prompt_tokens or 0
    details = u.prompt_tokens_details
    cached = (details and details.cached_tokens) or 0
    written = (details and details.cache_write_tokens) or 0
    out_details = u.completion_tokens_details
    return Usage(
        input_tokens=max(prompt - cached - written, 0),
        output_tokens=u.completion_tokens or 0,
        cache_read_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=(out_details and out_details.reasoning_tokens) or 0,
    )


# --------------------------------------------------------------------------- transcript


def _user_content(parts: Iterable[UserContent], info: ModelInfo,
                  blobs: Blobs | None = None) -> str | list[Any]:
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, BlobPart):
            out.append(_blob(resolved(blobs, p), info))
        elif info.images:
            out.append({"type": "image_url", "image_url": {"url": data_url(p)}})
        else:
            out.append({"type": "text", "text": IMAGE_OMITTED})
    if all(o["type"] == "text" for o in out):
        # Plain strings are what every compatible server accepts.
        return "\n".join(o["text"] for o in out)
    return out


def _blob(blob: Blob, info: ModelInfo) -> dict[str, Any]:
    kind, ref = blob.kind, blob.ref
    if kind == "image" and not info.images:
        return {"type": "text", "text": IMAGE_OMITTED}
    if kind == "image" and (ref is None or ref.url):
        return {"type": "image_url", "image_url": {
            "url": ref.url if ref is not None and ref.url else blob.data_url()}}
    if ref is not None and ref.file_id:
        return {"type": "file", "file": {"file_id": ref.file_id}}
    if kind == "pdf" and ref is None:
        return {"type": "file", "file": {"filename": blob.name, "file_data": blob.data_url()}}
    if kind == "text" and ref is None:
        return {"type": "text", "text": blob.text()}
    return {"type": "text", "text": blob.note()}


def _assistant(m: AssistantMessage, info: ModelInfo) -> dict[str, Any] | None:
    native = same_model(m, info, API)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    msg: dict[str, Any] = {"role": "assistant"}
    for p in m.content:
        if isinstance(p, TextPart):
            if p.text:
                texts.append(p.text)
        elif isinstance(p, ThinkingPart):
            if native and p.signature in _REASONING_FIELDS and p.thinking:
                msg[p.signature] = msg.get(p.signature, "") + p.thinking
            elif (text := thinking_as_text(p)) is not None:
                texts.append(text)
        elif isinstance(p, ToolCall):
            calls.append({
                "id": normalize_id(p.id, MAX_ID_LEN), "type": "function",
                "function": {"name": p.name,
                             "arguments": msgspec.json.encode(p.arguments).decode()},
            })
    if not texts and not calls:
        return None
    msg["content"] = "\n\n".join(texts) if texts else None
    if calls:
        msg["tool_calls"] = calls
    return msg


def to_chat_messages(
    system: str | None, messages: Iterable[Message], info: ModelInfo,
    blobs: Blobs | None = None,
) -> list[dict[str, Any]]:
    """Our transcript as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    if system:
        role = "developer" if info.provider == "openai" and info.reasoning else "system"
        out.append({"role": role, "content": system})
    pending_images: list[ImagePart | BlobPart] = []
    for m in messages:
        if not isinstance(m, ToolResultMessage) and pending_images:
            out.append(_tool_images(pending_images, info, blobs))
            pending_images = []
        if isinstance(m, ToolResultMessage):
            text = "\n".join(p.text for p in m.content if isinstance(p, TextPart))
            images = [p for p in m.content if isinstance(p, ImagePart | BlobPart)]
            if images:
                text = text or "(see the attached image)"
                pending_images.extend(images)
            out.append({"role": "tool", "tool_call_id": normalize_id(m.tool_call_id, MAX_ID_LEN),
                        "content": text or "(no output)"})
        elif isinstance(m, AssistantMessage):
            converted = _assistant(m, info)
            if converted is not None:
                out.append(converted)
        else:
            out.append({"role": "user", "content": _user_content(m.content, info, blobs)})
    if pending_images:
        out.append(_tool_images(pending_images, info, blobs))
    return out


def _tool_images(images: list[ImagePart | BlobPart], info: ModelInfo,
                 blobs: Blobs | None) -> dict[str, Any]:
    # Tool messages carry text only, so images a tool returned follow in a user message.
    parts: list[UserContent] = [TextPart(text="Images returned by the tool calls above:")]
    return {"role": "user", "content": _user_content([*parts, *images], info, blobs)}
