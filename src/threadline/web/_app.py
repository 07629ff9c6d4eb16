"""The ASGI app: a session's runs over HTTP, as server-sent events.

Routes (under wherever the app is mounted; ``{id}`` is the session id,
percent-encoded):

- ``POST /chat``: the body ``useChat`` sends (``id``, ``messages``); runs the
  last message and answers with the run as a UI message stream.
- ``GET /chat/{id}/stream``: the session's active run as a UI message
  stream, replayed from its start (``useChat``'s ``resume``); 204 when none
  (and for a session not created yet).
  With ``Last-Event-ID`` it continues after that event instead.
- ``POST /chat/{id}/runs``: the same start for other clients (``{"text": ...}``
  or ``{"message": <a threadline user message>}``), answered with the plain
  event stream: one event per frame, ``id`` the frame's id, ``event`` its type.
- ``GET /chat/{id}/events``: that stream for the active run, or, with
  ``Last-Event-ID`` (or ``?after=``), from right after that frame; 204 when
  there is nothing to follow.
- ``POST /chat/{id}/stop``: store a stop for the active run (202), 409 when none.
- ``GET /chat/{id}/messages``: the session as UI messages for a reload, with
  the active run's message as far as it streamed.

Runs belong to the app's ``LiveRuns``, not to the request: a client that
leaves changes nothing. ``sessions(request)`` says which session ids the
caller may touch; every other id is answered 404, exactly like an id that
does not exist, so guessing learns nothing.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Container
from typing import Any, TypeAlias

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from threadline.ai._messages import UserMessage
from threadline.durable._factory import Factory
from threadline.durable._live import Frame
from threadline.durable._runs import LiveRuns
from threadline.errors import (
    ConfigError,
    InvalidMessage,
    InvalidSessionId,
    RunActive,
    SessionNotFound,
    StoreError,
)
from threadline.stores._contract import Store
from threadline.stores._rules import check_session_id
from threadline.web._ui import HEADERS, UIStream, ui_messages, user_message

__all__ = ["MAX_BODY_BYTES", "MAX_MESSAGE_BYTES", "Sessions", "create_app"]

Sessions: TypeAlias = Callable[[Request], Container[str] | Awaitable[Container[str]]]
"""Maps a request to the session ids its caller may touch (a set, or anything with ``in``)."""

MAX_MESSAGE_BYTES = 256 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
KEEPALIVE = 15.0

_encode = msgspec.json.Encoder().encode
_PLAIN_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache",
                  "x-accel-buffering": "no"}


class _Refused(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def create_app(
    store: Store,
    factory: Factory,
    *,
    sessions: Sessions,
    runs: LiveRuns | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_body_bytes: int = MAX_BODY_BYTES,
    keepalive: float = KEEPALIVE,
) -> Starlette:
    """The chat app over ``store``, running ``factory``'s loop for each message.

    Mount it in a Starlette or FastAPI application (``app.mount("/api", ...)``).
    ``runs`` is the worker that owns the runs (default: one made here, closed
    with the app's lifespan; when mounted, close ``app.state.runs`` in yours).
    A posted message over ``max_message_bytes`` (its JSON), or a body over
    ``max_body_bytes``, is refused with 413.
    """
    if max_message_bytes <= 0 or max_body_bytes <= 0 or keepalive <= 0:
        raise ConfigError("max_message_bytes, max_body_bytes and keepalive must be positive")
    live = runs if runs is not None else LiveRuns(store, factory)
    chat = _Chat(live, sessions, max_message_bytes, max_body_bytes, keepalive)
    routes = [
        Route("/chat", chat.post_ui, methods=["POST"]),
        Route("/chat/{session_id:path}/stream", chat.rejoin_ui, methods=["GET"]),
        Route("/chat/{session_id:path}/runs", chat.post_plain, methods=["POST"]),
        Route("/chat/{session_id:path}/events", chat.rejoin_plain, methods=["GET"]),
        Route("/chat/{session_id:path}/stop", chat.stop, methods=["POST"]),
        Route("/chat/{session_id:path}/messages", chat.messages, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await live.close()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={_Refused: _refused,  # type: ignore[dict-item]
                                        StoreError: _store_failed})
    app.state.runs = live
    return app


async def _refused(request: Request, exc: _Refused) -> Response:
    return _error(exc.status, str(exc), **exc.extra)


async def _store_failed(request: Request, exc: Exception) -> Response:
    return _error(503, f"the store failed: {exc}")


class _Chat:
    def __init__(self, runs: LiveRuns, sessions: Sessions, max_message: int, max_body: int,
                 keepalive: float) -> None:
        self.runs = runs
        self.sessions = sessions
        self.max_message = max_message
        self.max_body = max_body
        self.keepalive = keepalive

    # -- checks ----------------------------------------------------------------------

    async def _allowed(self, request: Request, session_id: Any) -> str:
        """The session id, if the caller may touch it; 404 otherwise, as for none."""
        if not isinstance(session_id, str):
            raise _Refused(400, "the body must name the chat's session in 'id', a string")
        try:
            checked: str = check_session_id(session_id)
        except InvalidSessionId as exc:
            raise _Refused(400, str(exc)) from exc
        allowed = self.sessions(request)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if checked not in allowed:
            raise _Refused(404, "no such session")
        return checked

    async def _session(self, request: Request) -> str:
        return await self._allowed(request, request.path_params["session_id"])

    async def _json(self, request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise _Refused(413, f"the body is over {self.max_body} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise _Refused(413, f"the body is over {self.max_body} bytes")
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise _Refused(400, f"the body is not JSON: {exc}") from exc

    def _sized(self, message: Any) -> Any:
        if len(_encode(message)) > self.max_message:
            raise _Refused(413, f"the message is over {self.max_message} bytes")
        return message

    def _follow(self, session_id: str, *, after: str | None = None,
                run_id: str | None = None) -> AsyncIterator[list[Frame]]:
        return self.runs.follow_batches(session_id, after=after, run_id=run_id,
                                        idle=self.keepalive)

    async def _start(self, session_id: str, message: UserMessage) -> str:
        try:
            run = await self.runs.start(session_id, message)
        except RunActive as exc:
            raise _Refused(409, str(exc), run_id=exc.run_id) from exc
        return run.run_id

    # -- the UI message stream -----------------------------------------------------------

    async def post_ui(self, request: Request) -> Response:
        body = await self._json(request)
        if not isinstance(body, dict):
            raise _Refused(400, "the body must be a JSON object")
        session_id = await self._allowed(request, body.get("id"))
        if body.get("trigger", "submit-message") != "submit-message":
            raise _Refused(400, f"trigger {body.get('trigger')!r} is not supported: only "
                           "'submit-message'")
        ui = body.get("message")
        if ui is None:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _Refused(400, "the body has no 'messages' (or 'message') to run")
            ui = messages[-1]
        try:
            message = user_message(self._sized(ui))
        except InvalidMessage as exc:
            raise _Refused(400, str(exc)) from exc
        run_id = await self._start(session_id, message)
        return self._ui(self._follow(session_id, run_id=run_id))

    async def rejoin_ui(self, request: Request) -> Response:
        session_id = await self._session(request)
        after = request.headers.get("last-event-id")
        if after is not None:
            # The whole run, to know its parts; the stream starts after ``after``.
            return self._ui(self._follow(session_id, run_id=after.split(".", 1)[0]), after)
        run_id = await self._active(session_id)
        if run_id is None:
            return Response(status_code=204)
        return self._ui(self._follow(session_id, run_id=run_id))

    def _ui(self, frames: AsyncIterator[list[Frame]], after: str | None = None) -> Response:
        stream = UIStream()
        skipping = [after is not None]

        def render(frame: Frame) -> bytes:
            if skipping[0]:
                stream.chunks(frame)  # what the client has: the stream's state only
                skipping[0] = frame.id != after
                return b""
            return stream.sse(frame)

        return StreamingResponse(_sse(frames, render), headers=HEADERS)

    async def _active(self, session_id: str) -> str | None:
        """The session's run going on; None for a session not created yet (a new chat's
        page asks to resume before its first message)."""
        try:
            return await self.runs.active(session_id)
        except SessionNotFound:
            return None

    # -- the plain event stream -----------------------------------------------------------

    async def post_plain(self, request: Request) -> Response:
        session_id = await self._session(request)
        body = await self._json(request)
        if not isinstance(body, dict):
            raise _Refused(400, "the body must be a JSON object")
        if isinstance(body.get("text"), str) and body["text"]:
            message = UserMessage.of(self._sized(body["text"]))
        elif "message" in body:
            try:
                message = msgspec.convert(self._sized(body["message"]), UserMessage)
            except msgspec.ValidationError as exc:
                raise _Refused(400, f"'message' is not a user message: {exc}") from exc
        else:
            raise _Refused(400, "the body needs 'text' (a non-empty string) or 'message'")
        run_id = await self._start(session_id, message)
        return self._plain(self._follow(session_id, run_id=run_id))

    async def rejoin_plain(self, request: Request) -> Response:
        session_id = await self._session(request)
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        if after is None:
            run_id = await self._active(session_id)
            if run_id is None:
                return Response(status_code=204)
            return self._plain(self._follow(session_id, run_id=run_id))
        if after.endswith(".end"):
            return Response(status_code=204)
        try:
            await self.runs.active(session_id)  # ends a run whose owner is gone
        except SessionNotFound as exc:
            raise _Refused(404, "no such session") from exc
        return self._plain(self._follow(session_id, after=after))

    def _plain(self, frames: AsyncIterator[list[Frame]]) -> Response:
        def render(frame: Frame) -> bytes:
            return (b"id: " + frame.id.encode() + b"\nevent: " + frame.type.encode()
                    + b"\ndata: " + _encode(frame) + b"\n\n")

        return StreamingResponse(_sse(frames, render), headers=_PLAIN_HEADERS)

    # -- the rest ------------------------------------------------------------------------

    async def stop(self, request: Request) -> Response:
        session_id = await self._session(request)
        by = request.query_params.get("by", "")
        try:
            record = await self.runs.stop(session_id, reason="stopped by the user", by=by)
        except SessionNotFound as exc:
            raise _Refused(404, "no such session") from exc
        if record is None:
            return _error(409, "no run is going on in this session")
        return JSONResponse({"run_id": record.data.run, "stop": record.id}, status_code=202)

    async def messages(self, request: Request) -> Response:
        session_id = await self._session(request)
        try:
            snap = await self.runs.snapshot(session_id)
        except SessionNotFound as exc:
            raise _Refused(404, "no such session") from exc
        pending = snap.pending[1] if snap.pending is not None else None
        return JSONResponse({"messages": ui_messages(snap.path, active=snap.active,
                                                     pending=pending),
                             "active_run": snap.active})


async def _sse(batches: AsyncIterator[list[Frame]],
               render: Callable[[Frame], bytes]) -> AsyncIterator[bytes]:
    """The stream's bytes: each batch of frames in one write; a comment for an empty
    batch (the follower was quiet), so proxies keep the connection."""
    yield b": stream-open\n\n"
    async for batch in batches:
        yield b"".join(map(render, batch)) if batch else b": keep-alive\n\n"
