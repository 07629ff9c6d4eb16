"""The Vercel AI SDK's UI messages and its UI message stream protocol (version 1).

A run's frames become the stream's chunks (``start``, ``start-step``,
``text-*``, ``reasoning-*``, ``tool-input-*``, ``tool-output-*``,
``finish-step``, ``finish``, ``abort``, ``error``), one JSON object per
server-sent event, ending with ``[DONE]``, as ``useChat`` reads them. A run
is one assistant UI message, whose id is the run's id: the stream's
``start`` names it, and ``ui_messages`` gives the same id to the message a
reload reads, so a resumed stream replaces it rather than adding another.

Going back, ``user_message`` takes the user message ``useChat`` posts (text,
and images as ``data:`` URLs) and makes the threadline message to run.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from threadline.durable._live import (
    Frame,
    MessageFrame,
    PartFrame,
    RunClaim,
    RunClosed,
    RunEnd,
    RunOpened,
)
from threadline.errors import InvalidMessage
from threadline.session._entries import CustomEntry, Entry, MessageEntry

__all__ = ["HEADERS", "UIStream", "ui_messages", "user_message"]

HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}

_encode = msgspec.json.Encoder().encode

_FINISH = {"done": "stop", "awaiting_approval": "tool-calls", "error": "error",
           "budget": "other", "stopped": "other", "interrupted": "other"}


def _metadata(run_id: str, stop_reason: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"runId": run_id}
    if stop_reason is not None:
        meta["stopReason"] = stop_reason
    return {"threadline": meta}


class UIStream:
    """The chunks of one run's stream, frame by frame."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._blocks: dict[tuple[int, int], str] = {}  # (message, block) -> its kind
        self._tools: dict[tuple[int, int], tuple[str, str]] = {}  # -> (call id, name)
        self._calls: set[str] = set()

    def sse(self, frame: Frame) -> bytes:
        """The frame's chunks as server-sent events, the last one with the frame's id
        (for ``Last-Event-ID``); ``[DONE]`` after the run's end."""
        if isinstance(frame, PartFrame) and self._step == frame.message:
            piece = frame.piece
            op = piece.op
            if op in ("t", "r"):  # the usual chunk, written without a dict
                return b"".join((
                    b"id: ", frame.id.encode(), b"\ndata: {\"type\":\"",
                    b"text-delta" if op == "t" else b"reasoning-delta",
                    b'","id":"', f"{frame.message}:{piece.block}".encode(), b'","delta":',
                    _encode(piece.text), b"}\n\n"))
        chunks = self.chunks(frame)
        out = b"".join(b"data: " + _encode(c) + b"\n\n" for c in chunks[:-1])
        if chunks:
            out += b"id: " + frame.id.encode() + b"\ndata: " + _encode(chunks[-1]) + b"\n\n"
        if isinstance(frame, RunClosed):
            out += b"data: [DONE]\n\n"
        return out

    def chunks(self, frame: Frame) -> list[dict[str, Any]]:
        if isinstance(frame, PartFrame):
            return self._part(frame)
        if isinstance(frame, MessageFrame):
            return self._message(frame)
        if isinstance(frame, RunOpened):
            return [{"type": "start", "messageId": frame.run_id}]
        return self._closed(frame)

    def _open(self, message: int) -> list[dict[str, Any]]:
        if self._step == message:
            return []
        self._step = message
        return [{"type": "start-step"}]

    def _part(self, frame: PartFrame) -> list[dict[str, Any]]:
        out = self._open(frame.message)
        piece = frame.piece
        key = (frame.message, piece.block)
        part_id = f"{frame.message}:{piece.block}"
        op = piece.op
        if op in "TR":
            self._blocks[key] = op
            out.append({"type": "text-start" if op == "T" else "reasoning-start", "id": part_id})
        elif op == "C":
            self._blocks[key] = op
            self._tools[key] = (piece.text, piece.name)
            out.append({"type": "tool-input-start", "toolCallId": piece.text,
                        "toolName": piece.name})
        elif op in "tr":
            out.append({"type": "text-delta" if op == "t" else "reasoning-delta", "id": part_id,
                        "delta": piece.text})
        elif op == "c" and key in self._tools:
            out.append({"type": "tool-input-delta", "toolCallId": self._tools[key][0],
                        "inputTextDelta": piece.text})
        elif op == "E":
            kind = self._blocks.get(key)
            if kind in ("T", "R"):
                out.append({"type": "text-end" if kind == "T" else "reasoning-end",
                            "id": part_id})
        return out

    def _message(self, frame: MessageFrame) -> list[dict[str, Any]]:
        message = frame.entry.message
        if isinstance(message, ToolResultMessage):
            if message.tool_call_id not in self._calls:
                return []  # a call this stream never showed
            if message.is_error:
                return [{"type": "tool-output-error", "toolCallId": message.tool_call_id,
                         "errorText": message.text}]
            return [{"type": "tool-output-available", "toolCallId": message.tool_call_id,
                     "output": message.text}]
        if not isinstance(message, AssistantMessage) or frame.index is None:
            return []
        out = self._open(frame.index)
        kept = set()
        for call in message.tool_calls:
            kept.add(call.id)
            self._calls.add(call.id)
            out.append({"type": "tool-input-available", "toolCallId": call.id,
                        "toolName": call.name, "input": call.arguments})
        for (index, _), (call_id, name) in self._tools.items():
            if index == frame.index and call_id not in kept:  # its input never finished
                out.append({"type": "tool-input-error", "toolCallId": call_id,
                            "toolName": name, "input": None,
                            "errorText": "the message ended before this call's input did"})
        out.append({"type": "finish-step"})
        self._step = None
        return out

    def _closed(self, frame: RunClosed) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._step is not None:
            out.append({"type": "finish-step"})
        if frame.stop_reason == "error":
            out.append({"type": "error", "errorText": frame.error or "the run failed"})
        elif frame.stop_reason == "stopped":
            out.append({"type": "abort", "reason": "stopped"})
        out.append({"type": "finish", "finishReason": _FINISH[frame.stop_reason],
                    "messageMetadata": _metadata(frame.run_id, frame.stop_reason)})
        return out


# -- UI messages ----------------------------------------------------------------------


def _user_parts(content: Sequence[UserContent]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, BlobPart):
            # The web app serves no blobs (yet): the attachment is named, not dropped.
            name = f"{part.name} " if part.name else ""
            parts.append({"type": "text", "text": f"[attachment {name}({part.media_type}, "
                                                  f"{part.size:,} bytes, sha256 {part.sha256})]"})
        else:
            parts.append({"type": "file", "mediaType": part.mime_type,
                          "url": f"data:{part.mime_type};base64,{part.data}"})
    return parts


def _assistant_parts(message: AssistantMessage, state: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text, "state": state})
        elif isinstance(part, ThinkingPart):
            parts.append({"type": "reasoning", "text": part.thinking, "state": state})
        elif isinstance(part, ToolCall):
            parts.append({"type": f"tool-{part.name}", "toolCallId": part.id,
                          "state": "input-available", "input": part.arguments})
    return parts


def _answer(group: dict[str, Any] | None, result: ToolResultMessage) -> None:
    for part in group["parts"] if group is not None else ():
        if part.get("toolCallId") == result.tool_call_id and part["type"].startswith("tool-"):
            if result.is_error:
                part.update(state="output-error", errorText=result.text)
            else:
                part.update(state="output-available", output=result.text)


def ui_messages(path: Sequence[Entry], *, active: str | None = None,
                pending: AssistantMessage | None = None) -> list[dict[str, Any]]:
    """The path as ``useChat`` messages: each user message, then one assistant message per
    run (the run's id as its id; each model call a step; tool results on their calls).

    ``pending`` is the active run's assistant message as far as it streamed; it is
    shown in that run's message with its parts ``streaming``.
    """
    out: list[dict[str, Any]] = []
    group: dict[str, Any] | None = None
    run: str | None = None
    for entry in path:
        if isinstance(entry, CustomEntry):
            if isinstance(entry.data, RunClaim) and run is None:  # a later one is inert
                run = entry.id
            elif isinstance(entry.data, RunEnd) and entry.data.run == run:
                run = None
                if group is not None and group["id"] == entry.data.run:
                    group["metadata"] = _metadata(entry.data.run, entry.data.stop_reason)
            continue
        if not isinstance(entry, MessageEntry):
            continue
        m = entry.message
        if isinstance(m, UserMessage):
            group = None
            out.append({"id": entry.id, "role": "user", "parts": _user_parts(m.content)})
        elif isinstance(m, AssistantMessage):
            if group is None:
                group = {"id": run or entry.id, "role": "assistant", "parts": []}
                out.append(group)
            group["parts"] += _assistant_parts(m, "done")
        else:
            _answer(group, m)
    if active is not None and pending is not None:
        if group is None or group["id"] != active:
            group = {"id": active, "role": "assistant", "parts": []}
            out.append(group)
        group["parts"] += _assistant_parts(pending, "streaming")
    return out


def user_message(ui: Any) -> UserMessage:
    """The threadline message for a UI message ``useChat`` posted (role ``user``).

    Text parts become text; ``file`` parts with an image as a ``data:`` URL
    become images. Anything else raises ``InvalidMessage`` saying what.
    """
    if not isinstance(ui, dict):
        raise InvalidMessage(f"a message is a JSON object, got {type(ui).__name__}")
    if ui.get("role") != "user":
        raise InvalidMessage(f"the message to run must have role 'user', got {ui.get('role')!r}")
    parts = ui.get("parts")
    if not isinstance(parts, list) or not parts:
        raise InvalidMessage("the message has no parts")
    content: list[UserContent] = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                content.append(TextPart(text=part["text"]))
        elif kind == "file":
            content.append(_image(part, i))
        elif kind == "step-start":
            continue
        else:
            raise InvalidMessage(f"part {i} of the message: threadline takes text parts and "
                             f"images as data: URLs, not {kind!r}")
    if not content:
        raise InvalidMessage("the message is empty")
    return UserMessage(content=tuple(content))


def _image(part: dict[str, Any], i: int) -> ImagePart:
    url, media = part.get("url"), part.get("mediaType")
    if not (isinstance(url, str) and isinstance(media, str) and media.startswith("image/")
            and url.startswith(f"data:{media};base64,")):
        raise InvalidMessage(f"part {i} of the message: a file must be an image given as a "
                         "data: URL with its mediaType")
    data = url.split(",", 1)[1]
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidMessage(f"part {i} of the message: the image is not valid base64") from exc
    return ImagePart(data=data, mime_type=media)
