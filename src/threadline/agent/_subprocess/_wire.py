"""The subprocess wire protocol (docs/subprocess-protocol.md).

One JSON object per line. The child's events are the agent loop's own event
types, decoded by one msgspec decoder; fields the wrapper can derive (a tool's
name, a turn's number) have defaults there, so a child may leave them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from threadline.agent._events import AgentEvent
from threadline.ai._messages import Message

__all__ = ["PROTOCOL_VERSION", "decode_event", "encode_request", "quote"]

PROTOCOL_VERSION = 1


class _RunRequest(msgspec.Struct, tag_field="type", tag="run"):
    version: int
    context: Sequence[Message]
    input: Sequence[Message]


def _error_from_text(kind: type, obj: Any) -> Any:
    # On the wire an error is its text (``agent_end.error``); the event types
    # hold exceptions, so the text becomes one of the declared class.
    if isinstance(kind, type) and issubclass(kind, BaseException) and isinstance(obj, str):
        return kind(obj)
    raise TypeError(f"expected an error message (a string), got {obj!r}")


_decoder = msgspec.json.Decoder(AgentEvent, dec_hook=_error_from_text)
_encoder = msgspec.json.Encoder()


def encode_request(context: Sequence[Message], input: Sequence[Message]) -> bytes:
    """The one line written to the child's stdin."""
    request = _RunRequest(version=PROTOCOL_VERSION, context=list(context), input=list(input))
    return _encoder.encode(request) + b"\n"


def decode_event(line: bytes) -> AgentEvent:
    """One stdout line as an agent event; ``msgspec.DecodeError`` if it is none."""
    return _decoder.decode(line)


def quote(line: bytes) -> str:
    """A stdout line for an error message, cut to a readable length."""
    text = repr(line[:200])
    return text + f" ... ({len(line)} bytes)" if len(line) > 200 else text
