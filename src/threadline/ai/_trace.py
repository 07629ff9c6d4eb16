"""OpenTelemetry spans, through ``opentelemetry-api`` only (the ``otel`` extra).

Spans follow the OpenTelemetry GenAI semantic conventions where they have a
name for the thing: a run is ``invoke_agent``, a model call ``chat``, a tool
call ``execute_tool``; each carries ``gen_ai.conversation.id`` (the session
id). Store calls are ``threadline.store.append`` and ``threadline.store.load``
with the store kind and the entry ids.

Nothing is done unless ``opentelemetry`` is installed and the application
has set a tracer provider (``trace.set_tracer_provider``): until then the
API's own proxy would only make non-recording spans, so every hook returns at
once. Spans start at most ``LOOK_EVERY`` seconds after a provider is set.

Message content (text, tool arguments and results) stays out of spans unless
the application opts in with the conventions' own switch, the environment
variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from threadline.ai._messages import AssistantMessage, Message, ToolResultMessage

try:
    from opentelemetry import trace as _api
except ImportError:  # the extra is not installed: every hook is a no-op
    _api = None  # type: ignore[assignment]

__all__ = [
    "CONTENT_VARIABLE",
    "capture_content",
    "conversation",
    "end_model_span",
    "fail",
    "loaded",
    "model_span",
    "span",
    "store_kind",
    "store_span",
    "tool_result",
    "tracer",
]

CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

_conversation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "threadline_conversation", default=None)
"""The session the current task works for (set by the durable run)."""

_found: Any = None
"""The tracer, once the application has set a provider (OpenTelemetry sets one only once)."""
_next_look = 0.0

LOOK_EVERY = 1.0
"""Seconds between looks for a provider while none is set: the API's lookup costs
microseconds, too much for every append."""


def tracer() -> Any:
    """The ``threadline`` tracer, or None when nothing would record."""
    global _found, _next_look  # noqa: PLW0603  # a cache of the API's own global state
    if _found is not None or _api is None:
        return _found
    now = time.monotonic()
    if now < _next_look:
        return None
    _next_look = now + LOOK_EVERY
    provider = _api.get_tracer_provider()
    if isinstance(provider, _api.ProxyTracerProvider):
        return None
    from threadline import __version__

    _found = provider.get_tracer("threadline", __version__)
    return _found


def capture_content() -> bool:
    return os.environ.get(CONTENT_VARIABLE, "").strip().lower() in ("1", "true", "yes")


@contextlib.contextmanager
def conversation(session_id: str) -> Iterator[None]:
    """Name ``session_id`` as the conversation of the spans made inside."""
    token = _conversation.set(session_id)
    try:
        yield
    finally:
        _conversation.reset(token)


def _base(attributes: dict[str, Any]) -> dict[str, Any]:
    session_id = attributes.pop("gen_ai.conversation.id", None) or _conversation.get()
    if session_id is not None:
        attributes["gen_ai.conversation.id"] = session_id
    return {k: v for k, v in attributes.items() if v is not None}


_OFF: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
"""What the hooks give while tracing is off: entering it costs next to nothing."""


def span(name: str, attributes: dict[str, Any], *, kind: str = "INTERNAL"
         ) -> contextlib.AbstractContextManager[Any]:
    """A current span, ended (with the error, if one escapes) when the block ends.

    Gives the span, or None when tracing is off.
    """
    t = tracer()
    return _OFF if t is None else _span(t, name, attributes, kind)


@contextlib.contextmanager
def _span(t: Any, name: str, attributes: dict[str, Any], kind: str) -> Iterator[Any]:
    assert _api is not None
    # The exception's class is recorded, not its text, which may quote content.
    with t.start_as_current_span(name, kind=getattr(_api.SpanKind, kind),
                                 attributes=_base(attributes), record_exception=False,
                                 set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            fail(current, exc)
            raise


def model_span(provider: str, model: str, messages: Sequence[Message],
               system: str | None = None) -> Any:
    """Start (not as current: the stream is consumed across a generator) a ``chat`` span."""
    t = tracer()
    if t is None:
        return None
    assert _api is not None
    attributes = _base({"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                        "gen_ai.request.model": model})
    if capture_content():
        attributes["gen_ai.input.messages"] = _json(messages)
        if system:
            attributes["gen_ai.system_instructions"] = system
    return t.start_span(f"chat {model}", kind=_api.SpanKind.CLIENT, attributes=attributes)


def end_model_span(current: Any, message: AssistantMessage,
                   error: BaseException | None) -> None:
    if current is None:
        return
    used = message.usage
    current.set_attributes(_base({
        "gen_ai.response.model": message.model or None,
        "gen_ai.response.id": message.response_id,
        "gen_ai.response.finish_reasons": [message.stop_reason],
        "gen_ai.usage.input_tokens": (used.input_tokens + used.cache_read_tokens
                                      + used.cache_write_tokens),
        "gen_ai.usage.output_tokens": used.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": used.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": used.cache_write_tokens,
    }))
    if capture_content():
        current.set_attribute("gen_ai.output.messages", _json([message]))
    fail(current, error)
    current.end()


def fail(current: Any, error: BaseException | None) -> None:
    """Mark ``current`` failed by ``error`` (its type only: the text may quote content)."""
    if current is None or error is None or _api is None:
        return
    current.set_attribute("error.type", type(error).__qualname__)
    current.set_status(_api.Status(_api.StatusCode.ERROR, type(error).__qualname__))


def tool_result(current: Any, result: ToolResultMessage) -> None:
    if current is None:
        return
    if result.is_error and _api is not None:
        current.set_attribute("error.type", "tool_error")
        current.set_status(_api.Status(_api.StatusCode.ERROR, "tool_error"))
    if capture_content():
        current.set_attribute("gen_ai.tool.call.result", _json(result.content))


def store_kind(store: object) -> str:
    """``file``, ``sqlite``, ``postgres``, ``memory``, or the class name of another store."""
    name = type(store).__name__
    known = {"FileStore": "file", "SQLiteStore": "sqlite", "PostgresStore": "postgres",
             "MemoryStore": "memory", "EncryptedStore": "encrypted"}
    return known.get(name, name)


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def store_span(operation: str, store: object, session_id: str,
               entries: Sequence[Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """``threadline.store.<operation>`` around one store call; entry ids when appending."""
    if tracer() is None:
        return _OFF
    attributes: dict[str, Any] = {
        "gen_ai.conversation.id": session_id, "threadline.store.kind": store_kind(store),
        "threadline.store.operation": operation,
    }
    if entries is not None:
        attributes["threadline.entry.ids"] = [e.id for e in entries]
        attributes["threadline.entry.count"] = len(entries)
    return span(f"threadline.store.{operation}", attributes)


def loaded(current: Any, entries: Sequence[Any]) -> None:
    """What a load found: how many entries, and the last one's id (the leaf it loads to)."""
    if current is None:
        return
    current.set_attribute("threadline.entry.count", len(entries))
    if entries:
        current.set_attribute("threadline.entry.last_id", entries[-1].id)
