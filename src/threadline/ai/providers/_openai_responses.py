"""The OpenAI Responses API through the ``openai`` SDK.

Requests are stateless (``store=False``): the whole transcript goes with each
call. Reasoning items come back encrypted; each is kept whole, serialized as
JSON in its ThinkingPart's ``signature``, and returned to the same model with
the function calls it led to. A tool call's id is ``"<call_id>|<item_id>"``:
the call id pairs it with its result, the item id is what the API wants when
the call item is sent back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
)
from threadline.ai._model import ModelInfo, Request, StreamEvent, StreamOptions
from threadline.ai.providers._common import (
    IMAGE_OMITTED,
    Blob,
    Blobs,
    Builder,
    classify,
    data_url,
    normalize_id,
    resolved,
    same_model,
    thinking_as_text,
)
from threadline.ai.providers._openai_chat import OpenAIClientModel
from threadline.errors import ModelError, TransientProviderError

__all__ = ["OpenAIResponsesModel"]

API = "openai-responses"
MAX_ID_LEN = 64


class OpenAIResponsesModel(OpenAIClientModel):
    """A LanguageModel speaking the Responses API."""

    API = API

    async def _create(self, body: dict[str, Any]) -> Any:
        return await self._client.responses.create(**body)

    def _state(self, builder: Builder) -> _State:
        return _State(builder)

    def request_body(self, request: Request, options: StreamOptions,
                     blobs: Blobs | None = None) -> dict[str, Any]:
        """The keyword arguments for ``responses.create``."""
        info = self._info
        body: dict[str, Any] = {
            "model": info.id,
            "input": to_response_input(request.messages, info, blobs),
            "stream": True,
            "store": False,
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = [
                {"type": "function", "name": t.name, "description": t.description,
                 "parameters": t.parameters, "strict": False}
                for t in request.tools
            ]
        if options.max_tokens is not None:
            body["max_output_tokens"] = options.max_tokens
        if options.temperature is not None:
            body["temperature"] = options.temperature
        if info.reasoning or options.reasoning_effort is not None:
            reasoning: dict[str, Any] = {"summary": "auto"}
            if options.reasoning_effort is not None:
                reasoning["effort"] = options.reasoning_effort
            body["reasoning"] = reasoning
            body["include"] = ["reasoning.encrypted_content"]
        if options.extra:
            body["extra_body"] = dict(options.extra)
        return body


class _State:
    """Turns Responses stream events into our stream events."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder
        self.items: dict[int, int] = {}  # output_index -> block index
        self.summary_index: dict[int, int] = {}
        self.final: Any = None

    def _fail(self, message: str, code: str | None) -> ModelError:
        return classify(message, origin=self.b.origin, code=code)

    def handle(self, event: Any) -> Iterable[StreamEvent]:
        kind = event.type
        b = self.b
        if kind == "response.created":
            b.response_id = event.response.id
        elif kind == "response.output_item.added":
            return self._item_added(event.output_index, event.item)
        elif kind in ("response.output_text.delta", "response.refusal.delta",
                      "response.function_call_arguments.delta", "response.reasoning_text.delta"):
            at = self.items.get(event.output_index)
            if at is not None and event.delta:
                return (b.delta(at, event.delta),)
        elif kind == "response.reasoning_summary_text.delta":
            return self._summary_delta(event)
        elif kind == "response.output_item.done":
            return self._item_done(event.output_index, event.item)
        elif kind in ("response.completed", "response.incomplete"):
            self.final = event.response
        elif kind == "response.failed":
            err = event.response.error
            raise self._fail(err.message if err else "the response failed",
                             err.code if err else None)
        elif kind == "error":
            raise self._fail(event.message, event.code)
        return ()

    def _item_added(self, output_index: int, item: Any) -> Iterable[StreamEvent]:
        b = self.b
        if item.type == "reasoning":
            i, start = b.open_thinking()
        elif item.type == "message":
            i, start = b.open_text()
        elif item.type == "function_call":
            i, start = b.open_tool(f"{item.call_id}|{item.id}", item.name)
        else:
            return ()  # hosted tools and other items have no place in our messages
        self.items[output_index] = i
        return (start,)

    def _summary_delta(self, event: Any) -> Iterable[StreamEvent]:
        at = self.items.get(event.output_index)
        if at is None or not event.delta:
            return ()
        events: list[StreamEvent] = []
        last = self.summary_index.get(at)
        if last is not None and last != event.summary_index:
            events.append(self.b.delta(at, "\n\n"))  # a new summary part: a new paragraph
        self.summary_index[at] = event.summary_index
        events.append(self.b.delta(at, event.delta))
        return events

    def _item_done(self, output_index: int, item: Any) -> Iterable[StreamEvent]:
        i = self.items.get(output_index)
        if i is None:
            return ()
        block = self.b.blocks[i]
        if item.type == "reasoning":
            if not block.parts:
                texts = [s.text for s in item.summary or ()] or [
                    c.text for c in item.content or ()]
                block.parts.append("\n\n".join(texts))
            block.signature = msgspec.json.encode(
                item.model_dump(mode="json", exclude_none=True)).decode()
            block.redacted = not "".join(block.parts)
        elif item.type == "message" and not block.parts:
            block.parts.extend(
                str(getattr(c, "text", None) or getattr(c, "refusal", "")) for c in item.content)
        elif item.type == "function_call" and item.arguments is not None:
            block.parts[:] = [item.arguments]  # the complete text beats our fragments
        end = self.b.close(i)
        return (end,) if end is not None else ()

    def finish(self) -> list[StreamEvent]:
        response = self.final
        b = self.b
        if response is None:
            raise b.origin.error("the stream ended before the response completed",
                                 TransientProviderError)
        if response.usage is not None:
            b.usage = _usage(response.usage)
        if response.status == "incomplete":
            reason = response.incomplete_details and response.incomplete_details.reason
            if reason == "content_filter":
                raise b.origin.error("the response was stopped by a content filter")
            b.stop_reason = "length"
        return b.done()


def _usage(u: Any) -> Usage:
    details = u.input_tokens_details
    cached = (details and details.cached_tokens) or 0
    written = (details and getattr(details, "cache_write_tokens", 0)) or 0
    out = u.output_tokens_details
    return Usage(
        input_tokens=max((u.input_tokens or 0) - cached - written, 0),
        output_tokens=u.output_tokens or 0,
        cache_read_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=(out and out.reasoning_tokens) or 0,
    )


# --------------------------------------------------------------------------- transcript


def _input_content(parts: Iterable[UserContent], info: ModelInfo,
                   blobs: Blobs | None = None) -> list[Any]:
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart):
            out.append({"type": "input_text", "text": p.text})
        elif isinstance(p, BlobPart):
            out.append(_blob(resolved(blobs, p), info))
        elif info.images:
            out.append({"type": "input_image", "image_url": data_url(p), "detail": "auto"})
        else:
            out.append({"type": "input_text", "text": IMAGE_OMITTED})
    return out


def _blob(blob: Blob, info: ModelInfo) -> dict[str, Any]:
    kind, ref = blob.kind, blob.ref
    if kind == "image":
        if not info.images:
            return {"type": "input_text", "text": IMAGE_OMITTED}
        if ref is not None and ref.file_id:
            return {"type": "input_image", "file_id": ref.file_id, "detail": "auto"}
        url = ref.url if ref is not None and ref.url else blob.data_url()
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    if ref is not None and ref.file_id:
        return {"type": "input_file", "file_id": ref.file_id}
    if ref is not None and ref.url:
        return {"type": "input_file", "file_url": ref.url}
    if kind == "pdf":
        return {"type": "input_file", "filename": blob.name, "file_data": blob.data_url()}
    if kind == "text":
        return {"type": "input_text", "text": blob.text()}
    return {"type": "input_text", "text": blob.note()}


def _assistant_items(m: AssistantMessage, info: ModelInfo) -> list[dict[str, Any]]:
    native = same_model(m, info, API)
    # Reasoning matters to the API only ahead of the function calls it led to;
    # elsewhere the server drops it, so it is not sent.
    send_reasoning = native and bool(m.tool_calls)
    items: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            items.append({"type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": "\n\n".join(texts),
                                       "annotations": []}]})
            texts.clear()

    for p in m.content:
        if isinstance(p, TextPart):
            if p.text:
                texts.append(p.text)
        elif isinstance(p, ThinkingPart):
            if native and p.signature and p.signature.startswith("{"):
                if send_reasoning:
                    flush()
                    items.append(msgspec.json.decode(p.signature))
            elif (text := thinking_as_text(p)) is not None:
                texts.append(text)
        elif isinstance(p, ToolCall):
            flush()
            item: dict[str, Any] = {
                "type": "function_call", "call_id": normalize_id(p.id, MAX_ID_LEN),
                "name": p.name, "arguments": msgspec.json.encode(p.arguments).decode(),
            }
            item_id = p.id.partition("|")[2]
            if native and item_id:
                item["id"] = item_id
            items.append(item)
    flush()
    return items


def to_response_input(messages: Iterable[Message], info: ModelInfo,
                      blobs: Blobs | None = None) -> list[dict[str, Any]]:
    """Our transcript as Responses API input items."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, AssistantMessage):
            out.extend(_assistant_items(m, info))
        elif isinstance(m, ToolResultMessage):
            output: str | list[Any]
            if any(isinstance(p, ImagePart | BlobPart) for p in m.content):
                output = _input_content(m.content, info, blobs)
            else:
                output = "\n".join(p.text for p in m.content if isinstance(p, TextPart))
            out.append({"type": "function_call_output",
                        "call_id": normalize_id(m.tool_call_id, MAX_ID_LEN),
                        "output": output or "(no output)"})
        else:
            out.append({"role": "user", "content": _input_content(m.content, info, blobs)})
    return out
