"""What every provider shares: assembling a message from stream blocks, driving
an SDK stream with abort and close, mapping errors, and transcript helpers.

No SDK is imported here, so this module loads without the optional extras.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from threadline.ai._messages import (
    AssistantContent,
    AssistantMessage,
    BlobPart,
    ImagePart,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCall,
    Usage,
)
from threadline.ai._model import (
    BlobRef,
    BlobUpload,
    DoneEvent,
    ErrorEvent,
    ModelInfo,
    Request,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from threadline.errors import (
    AuthenticationError,
    BlobNotFound,
    ContextOverflowError,
    ModelError,
    RateLimitError,
    TransientProviderError,
)

INVALID_ARGUMENTS_KEY = "_invalid_json"
"""A tool call whose argument text is not a JSON object gets ``{INVALID_ARGUMENTS_KEY:
text}`` as arguments, so tool validation fails with the model's own text in the
message and the model can correct itself."""

DEFAULT_MAX_RETRIES = 1
"""SDK-level retries. Kept small so typed errors (rate limits with their
retry-after) reach the caller, which decides about waiting."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Origin:
    """Which model at which server: what every provider error names."""

    info: ModelInfo
    base_url: str | None = None

    def __str__(self) -> str:
        at = f" at {self.base_url}" if self.base_url else ""
        return f"{self.info.provider}:{self.info.id}{at}"

    def error(
        self, message: str, cls: type[ModelError] = ModelError, *, status: int | None = None,
        **extra: Any,
    ) -> ModelError:
        http = f"HTTP {status}: " if status is not None else ""
        return cls(f"{self}: {http}{message}", provider=self.info.provider, model=self.info.id,
                   status_code=status, base_url=self.base_url, **extra)


# --------------------------------------------------------------------------- blocks


@dataclass(slots=True)
class _Block:
    kind: Literal["text", "thinking", "tool"]
    parts: list[str] = field(default_factory=list)
    signature: str | None = None
    redacted: bool = False
    id: str = ""
    name: str = ""
    final: AssistantContent | None = None


class Builder:
    """Collects the blocks of one assistant message as they stream."""

    def __init__(self, info: ModelInfo, api: str, base_url: str | None = None) -> None:
        self.info = info
        self.origin = Origin(info, base_url)
        self.api = api
        self.blocks: list[_Block] = []
        self.usage = Usage()
        self.stop_reason: StopReason = "stop"
        self.response_id: str | None = None
        self.model = info.id

    def start(self) -> StartEvent:
        return StartEvent(model=self.info.id, provider=self.info.provider)

    def open_text(self) -> tuple[int, StreamEvent]:
        self.blocks.append(_Block("text"))
        i = len(self.blocks) - 1
        return i, TextStart(index=i)

    def open_thinking(self, *, redacted: bool = False) -> tuple[int, StreamEvent]:
        self.blocks.append(_Block("thinking", redacted=redacted))
        i = len(self.blocks) - 1
        return i, ThinkingStart(index=i)

    def open_tool(self, call_id: str, name: str) -> tuple[int, StreamEvent]:
        self.blocks.append(_Block("tool", id=call_id, name=name))
        i = len(self.blocks) - 1
        return i, ToolCallStart(index=i, id=call_id, name=name)

    def delta(self, i: int, text: str) -> StreamEvent:
        block = self.blocks[i]
        block.parts.append(text)
        if block.kind == "text":
            return TextDelta(index=i, delta=text)
        if block.kind == "thinking":
            return ThinkingDelta(index=i, delta=text)
        return ToolCallDelta(index=i, delta=text)

    def is_open(self, i: int) -> bool:
        return self.blocks[i].final is None

    def close(self, i: int) -> StreamEvent | None:
        """Finish block ``i``; None when it was already finished."""
        block = self.blocks[i]
        if block.final is not None:
            return None
        text = "".join(block.parts)
        if block.kind == "text":
            block.final = TextPart(text=text)
            return TextEnd(index=i, text=text)
        if block.kind == "thinking":
            block.final = ThinkingPart(
                thinking=text, signature=block.signature, redacted=block.redacted,
                provider=self.info.provider,
            )
            return ThinkingEnd(index=i, thinking=text, signature=block.signature)
        call = ToolCall(id=block.id, name=block.name, arguments=parse_arguments(text))
        block.final = call
        return ToolCallEnd(index=i, tool_call=call)

    def close_all(self) -> list[StreamEvent]:
        return [e for i in range(len(self.blocks)) if (e := self.close(i)) is not None]

    def message(
        self, stop_reason: StopReason, error_message: str | None = None
    ) -> AssistantMessage:
        content: list[AssistantContent] = []
        for b in self.blocks:
            if b.final is not None:
                content.append(b.final)
            elif b.kind == "text" and b.parts:
                content.append(TextPart(text="".join(b.parts)))
            elif b.kind == "thinking" and b.parts:
                content.append(ThinkingPart(
                    thinking="".join(b.parts), provider=self.info.provider))
            # An unfinished tool call is dropped: running it on half its
            # arguments would be worse than not running it.
        return AssistantMessage(
            content=tuple(content), model=self.model, provider=self.info.provider,
            api=self.api, usage=self.usage, stop_reason=stop_reason,
            error_message=error_message, response_id=self.response_id,
        )

    def done(self) -> list[StreamEvent]:
        """Close open blocks and end the stream successfully."""
        events = self.close_all()
        stop = self.stop_reason
        if stop == "stop" and any(b.kind == "tool" for b in self.blocks):
            # Some OpenAI-compatible servers say "stop" after tool calls.
            stop = "tool_use"
        events.append(DoneEvent(message=self.message(stop)))
        return events

    def failed(self, error: ModelError | None, *, aborted: bool = False) -> ErrorEvent:
        text = "aborted" if aborted else str(error) or type(error).__name__
        return ErrorEvent(
            message=self.message("aborted" if aborted else "error", text), error=error
        )


def parse_arguments(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {INVALID_ARGUMENTS_KEY: text}
    return value if isinstance(value, dict) else {INVALID_ARGUMENTS_KEY: text}


# --------------------------------------------------------------------------- driving


class _Aborted(Exception):
    pass


class SDKStream(Protocol):
    def __anext__(self) -> Awaitable[Any]: ...

    async def close(self) -> None: ...


class _AbortRace:
    """Awaits SDK calls; if ``abort`` fires during one, cancels it and raises _Aborted.

    Racing every chunk read against the event (a task and ``asyncio.wait``
    per chunk) cost more than parsing the chunk (docs/benchmarks.md,
    "Providers"). Instead one waiter on the event cancels the reading task,
    but only while it is inside a read: callbacks run only while the task is
    suspended, so the cancellation always lands in that read, and
    ``uncancel`` tells our cancellation from anyone else's (the pattern
    ``asyncio.timeout`` uses).
    """

    def __init__(self, abort: asyncio.Event | None) -> None:
        self.abort = abort
        self.waiter: asyncio.Future[Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.reading = False
        self.fired = False

    def _fire(self, _: object) -> None:
        if self.reading and not self.fired and self.task is not None:
            self.fired = True
            self.task.cancel()

    async def __call__(self, aw: Awaitable[Any]) -> Any:
        if self.abort is None:
            return await aw
        if self.abort.is_set():
            if asyncio.iscoroutine(aw):
                aw.close()
            raise _Aborted
        if self.waiter is None:
            self.task = asyncio.current_task()
            self.waiter = asyncio.ensure_future(self.abort.wait())
            self.waiter.add_done_callback(self._fire)
        self.reading = True
        try:
            return await aw
        except asyncio.CancelledError:
            if self.fired and self.task is not None and self.task.uncancel() == 0:
                raise _Aborted from None
            raise
        finally:
            self.reading = False

    def close(self) -> None:
        if self.waiter is not None:
            self.waiter.cancel()


async def drive(
    builder: Builder,
    *,
    open_stream: Callable[[], Awaitable[SDKStream]],
    handle: Callable[[Any], Iterable[StreamEvent]],
    finish: Callable[[], list[StreamEvent]],
    backend_errors: tuple[type[Exception], ...],
    translate: Callable[[Exception], ModelError],
    abort: asyncio.Event | None,
) -> AsyncIterator[StreamEvent]:
    """Run one request: StartEvent, the handled chunks, then ``finish()`` or an ErrorEvent.

    ``handle`` and ``finish`` may raise ``ModelError`` for failures the server
    reports inside the stream. Only ``backend_errors`` (the SDK's and its
    transport's exceptions) are translated; anything else is a bug on our side
    and propagates as itself rather than passing for a model failure. The
    HTTP stream is closed on every exit: the end of data, an abort, an error,
    or the consumer closing this iterator.
    """
    yield builder.start()
    sdk: SDKStream | None = None
    race = _AbortRace(abort)
    # A failure is yielded after the stream is closed: a consumer that has
    # the final event may hold this iterator without reading on.
    failure: ErrorEvent | None = None
    try:
        sdk = await race(open_stream())
        while True:
            try:
                chunk = await race(sdk.__anext__())
            except StopAsyncIteration:
                break
            for event in handle(chunk):
                yield event
        if abort is not None and abort.is_set():
            raise _Aborted
        for event in finish():
            yield event
    except _Aborted:
        failure = builder.failed(None, aborted=True)
    except ModelError as exc:
        failure = builder.failed(exc)
    except backend_errors as exc:
        failure = builder.failed(chained(translate(exc), exc))
    finally:
        race.close()
        if sdk is not None:
            try:
                await sdk.close()
            except Exception:
                # The answer (or the error) is already out; a failed close
                # only costs a connection, but should not go unseen.
                log.warning("%s: closing the response stream failed", builder.origin,
                            exc_info=True)
    if failure is not None:
        yield failure


# --------------------------------------------------------------------------- errors

# How providers word a context overflow: OpenAI ("maximum context length"),
# Anthropic ("prompt is too long"), llama.cpp ("exceeds the available context
# size"), vLLM, Ollama and others ("context window", "too many tokens").
_OVERFLOW = re.compile(
    r"prompt is too long|input is too long|context[ _-]?(length|window|size)|maximum context"
    r"|too many tokens|input length and `?max_tokens`? exceed|reduce the length of the",
    re.IGNORECASE,
)
_TRANSIENT_TYPES = {"overloaded_error", "api_error", "server_error", "timeout_error"}
_AUTH_TYPES = {"authentication_error", "permission_error", "invalid_api_key"}
_RATE_TYPES = {"rate_limit_error", "rate_limit_exceeded", "tokens", "requests"}


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        with contextlib.suppress(ValueError):
            return max(float(ms) / 1000, 0.0)
    value = headers.get("retry-after")
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(float(value), 0.0)
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(value)
        return max(when.timestamp() - time.time(), 0.0)
    return None


def classify(
    message: str,
    *,
    origin: Origin,
    status: int | None = None,
    code: str | None = None,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ModelError:
    """The typed error for what a provider reported (status, error code/type, text)."""
    labels = {code, kind} - {None}
    if status in (401, 403) or labels & _AUTH_TYPES:
        return origin.error(message, AuthenticationError, status=status)
    if "insufficient_quota" in labels:  # a 429 that waiting does not cure
        return origin.error(message, status=status)
    if status == 429:
        return origin.error(message, RateLimitError, status=status,
                            retry_after=retry_after(headers))
    if status == 413 or "context_length_exceeded" in labels or _OVERFLOW.search(message):
        return origin.error(message, ContextOverflowError, status=status)
    if labels & _RATE_TYPES:
        return origin.error(message, RateLimitError, status=status,
                            retry_after=retry_after(headers))
    if (status is not None and (status >= 500 or status == 408)) or labels & _TRANSIENT_TYPES:
        return origin.error(message, TransientProviderError, status=status)
    return origin.error(message, status=status)


def connection_error(exc: Exception, origin: Origin) -> ModelError:
    """A failed connection or read, described by the transport error underneath the SDK's."""
    root: BaseException = exc
    while root.__cause__ is not None:
        root = root.__cause__
    detail = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    return origin.error(f"connection failed: {detail}", TransientProviderError)


def other_error(exc: Exception, origin: Origin) -> ModelError:
    """A backend exception no provider rule knows; its type name keeps it findable."""
    if isinstance(exc, json.JSONDecodeError):  # the SDKs parse events with ``json``
        return origin.error(f"the server sent an event that is not JSON: {exc}")
    return origin.error(f"{type(exc).__name__}: {exc}")


def chained(error: ModelError, cause: Exception) -> ModelError:
    """``error`` with ``cause`` as its ``__cause__``, as ``raise error from cause`` would set.

    Stream failures are handed to the caller inside an ErrorEvent rather than
    raised, so the chain has to be set by hand.
    """
    if error is not cause:
        error.__cause__ = cause
        error.__suppress_context__ = True
    return error


def error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(message, code, type) from an error body shaped ``{"error": {...}}`` or ``{...}``."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if not isinstance(body, dict):
        return None, None, None

    def s(key: str) -> str | None:
        v = body.get(key)
        return str(v) if v is not None else None

    return s("message"), s("code"), s("type")


# --------------------------------------------------------------------------- transcripts

_ID_OK = re.compile(r"[^A-Za-z0-9_-]")


def normalize_id(call_id: str, max_len: int) -> str:
    """A tool-call id made valid for a provider (``[A-Za-z0-9_-]``, at most ``max_len``).

    Pure, so a call and its result map to the same id without shared state. An
    id that had to change gets a short hash of the original so two ids that
    clean to the same text stay distinct.
    """
    base = call_id.split("|", 1)[0]  # the Responses API stores "call_id|item_id"
    clean = _ID_OK.sub("_", base)
    if clean == base and 0 < len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
    return f"{clean[: max_len - len(digest) - 1]}_{digest}"


def same_model(message: AssistantMessage, info: ModelInfo, api: str) -> bool:
    """Whether provider-specific data in ``message`` (signatures, item ids) can go back as is."""
    return message.provider == info.provider and message.api == api and message.model == info.id


def thinking_as_text(part: ThinkingPart) -> str | None:
    """Another model's reasoning, as plain text; None when nothing readable is left."""
    if part.redacted or not part.thinking.strip():
        return None
    return part.thinking


def data_url(image: ImagePart) -> str:
    return f"data:{image.mime_type};base64,{image.data}"


IMAGE_OMITTED = "(image omitted: this model does not accept images)"

# --------------------------------------------------------------------------- blobs

# The image types all three APIs accept inline; anything else (an SVG, say)
# goes as a file or a note.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@dataclass(frozen=True, slots=True)
class Blob:
    """One blob of a request, resolved: its bytes, or where the provider finds it."""

    part: BlobPart
    data: bytes = b""
    ref: BlobRef | None = None

    @property
    def kind(self) -> Literal["image", "pdf", "text", "other"]:
        media = self.part.media_type.split(";", 1)[0].strip().lower()
        if media in IMAGE_TYPES:
            return "image"
        if media == "application/pdf":
            return "pdf"
        if media.startswith("text/") or media in ("application/json", "application/xml"):
            return "text"
        return "other"

    @property
    def name(self) -> str:
        return self.part.name or f"{self.part.sha256[:12]}.{self.kind}"

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.part.media_type};base64,{self.base64}"

    def text(self) -> str:
        """A text file's content, for a model that takes it as text."""
        return f"File {self.name} ({self.part.media_type}):\n" + self.data.decode(
            "utf-8", "replace")

    def note(self) -> str:
        """What a model that cannot take this file reads instead."""
        return (f"(attachment {self.name} omitted: {self.part.media_type}, "
                f"{self.part.size:,} bytes; this model does not accept this type)")


Blobs = Mapping[str, Blob]
"""A request's resolved blobs, by SHA-256."""


def resolved(blobs: Blobs | None, part: BlobPart) -> Blob:
    """``part`` as ``resolve_blobs`` read it."""
    blob = (blobs or {}).get(part.sha256)
    if blob is None:
        raise BlobNotFound(part.sha256, "the blobs resolved for this request (a transcript "
                           "converted without resolve_blobs)")
    return blob


async def resolve_blobs(request: Request, upload: BlobUpload | None,
                        origin: Origin) -> dict[str, Blob]:
    """Every blob the request's messages reference, read (or handed to ``upload``) once.

    A missing blob raises ``BlobNotFound`` from the reader, which names the
    session, the entry and the hash; it is never dropped from the request.
    """
    parts: dict[str, BlobPart] = {}
    for m in request.messages:
        if not isinstance(m, AssistantMessage):
            for p in m.content:
                if isinstance(p, BlobPart):
                    parts.setdefault(p.sha256, p)
    if not parts:
        return {}
    read = request.blobs
    if read is None:
        raise BlobNotFound(next(iter(parts)), f"the request to {origin}: the messages "
                           "reference blobs but the request has no reader (Request.blobs); "
                           "run it through a durable agent, or pass one")
    out: dict[str, Blob] = {}
    for key, part in parts.items():
        ref = await upload(part, read) if upload is not None else None
        out[key] = Blob(part, ref=ref) if ref is not None else Blob(part, await read(part))
    return out


class StreamState(Protocol):
    """Per-request parser state: feeds SDK events into a ``Builder``."""

    def handle(self, event: Any) -> Iterable[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


class SDKModel:
    """The plumbing every SDK-backed model shares: the client's lifetime and the
    stream driver. A subclass builds its client, names its ``API``, and supplies
    ``request_body``, ``_create`` (open the SDK stream), ``_state``,
    ``BACKEND_ERRORS`` (the exception types its SDK and transport raise) and
    ``_translate`` (one of those -> ``ModelError``): the provider's single
    error-mapping point."""

    API = ""
    BACKEND_ERRORS: tuple[type[Exception], ...] = ()

    def __init__(self, info: ModelInfo, client: Any, upload: BlobUpload | None = None) -> None:
        self._info = info
        self._client = client
        self._upload = upload

    @property
    def info(self) -> ModelInfo:
        return self._info

    async def aclose(self) -> None:
        """Close the pooled HTTP connections."""
        await self._client.close()

    async def stream(
        self, request: Request, options: StreamOptions | None = None
    ) -> AsyncIterator[StreamEvent]:
        options = options or StreamOptions()
        builder = Builder(self._info, self.API, self.origin.base_url)
        state = self._state(builder)
        # Before StartEvent: a missing blob raises (a stored reference without
        # its bytes is not a provider failure, and it is not retried).
        blobs = await resolve_blobs(request, self._upload, self.origin)
        body = self.request_body(request, options, blobs)

        async def open_stream() -> Any:
            return await self._create(body)

        async for event in drive(builder, open_stream=open_stream, handle=state.handle,
                                 finish=state.finish, backend_errors=self.BACKEND_ERRORS,
                                 translate=self._translate, abort=options.abort):
            yield event

    @property
    def origin(self) -> Origin:
        url = getattr(self._client, "base_url", None)
        return Origin(self._info, str(url).rstrip("/") if url is not None else None)

    def request_body(self, request: Request, options: StreamOptions,
                     blobs: Blobs | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def _create(self, body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _state(self, builder: Builder) -> StreamState:
        raise NotImplementedError

    def _translate(self, exc: Exception) -> ModelError:
        raise NotImplementedError

