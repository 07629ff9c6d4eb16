"""The local web viewer: a read-only Starlette app over a store.

What keeps it safe to point at untrusted transcripts:

- Read-only: every route is GET (HEAD); anything else is 405. It calls only
  the store's read methods.
- Nothing outside the store: the only files it serves are its own stylesheet
  and script, held in memory. A session id travels in a query string and goes
  to the store as an opaque string, so it cannot name a path.
- Localhost: it binds 127.0.0.1 by default and refuses requests whose Host
  header is not the address it serves (a page on another site cannot reach
  it by DNS rebinding).
- Every response carries a strict Content-Security-Policy: scripts and styles
  only from the viewer itself, no inline script, no frames, no plugins, and
  other hardening headers.

Live updates: ``/events`` is a server-sent-events stream of the entries
appended to a session after a given one. Each event's ``id`` is the entry id
(percent-encoded, so any id fits on the line), so a browser reconnecting with
``Last-Event-ID`` resumes right after the last entry it received. When the
store offers ``watch(session_id, after=...)`` the stream follows it; otherwise
it reloads the log every ``poll_interval`` seconds (default 0.5) and sends
what is new.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from urllib.parse import quote, unquote

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from threadline.durable._usage import PriceTable
from threadline.errors import BlobNotFound, ConfigError, SessionNotFound, StoreError
from threadline.session._entries import Entry
from threadline.session._tree import TreeIndex
from threadline.stores._blobs import blob_parts, open_blob
from threadline.stores._contract import SearchHit, Store
from threadline.stores._search import query_terms
from threadline.viewer import _html
from threadline.viewer._assets import SCRIPT
from threadline.viewer._common import MAX_PAGE, is_loopback, lineage, matching
from threadline.viewer._search import SEARCH_CSS, search_body
from threadline.viewer._usage import usage_html

__all__ = ["POLL_INTERVAL", "blob_href", "create_app", "serve"]

POLL_INTERVAL = 0.5
PAGE_SIZE = 50

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]
_LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]
_HEX64 = re.compile(r"[0-9a-f]{64}")


def blob_href(session_id: str, sha256: str) -> str:
    """The viewer's URL of one attachment of a session."""
    return f"/blob?session={quote(session_id, safe='')}&sha={sha256}"


class _SecurityHeaders:
    """Adds the hardening headers to every response, errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                # A response that sets its own (stricter) header keeps it: a blob's CSP.
                own = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in _HEADERS if h[0] not in own)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _html_response(body: str, status: int = 200) -> Response:
    # Encoded here, not by Starlette: a stored string may hold a lone
    # surrogate, which strict UTF-8 refuses; the page shows U+FFFD instead.
    return Response(body.encode("utf-8", "replace"), status_code=status,
                    media_type="text/html; charset=utf-8",
                    headers={"cache-control": "no-store"})


def _head() -> str:
    return ('<link rel="stylesheet" href="/static/viewer.css">'
            '<script src="/static/viewer.js" defer></script>')


def _error(title: str, message: str, status: int) -> Response:
    body = f'<h1>{_html._e(title)}</h1><p class="error">{_html._e(message)}</p>'
    return _html_response(_html.document(title, body, head=_head()), status)


def create_app(
    store: Store,
    *,
    poll_interval: float = POLL_INTERVAL,
    allowed_hosts: Sequence[str] = _LOOPBACK_NAMES,
    prices: PriceTable | None = None,
) -> Starlette:
    """The viewer as an ASGI app, reading ``store``.

    ``allowed_hosts`` are the Host header values it answers (default: the
    loopback names); requests naming any other host get 400. With ``prices``
    a session's usage table has a cost column (docs/usage.md).
    """
    if poll_interval <= 0:
        raise ConfigError(f"poll_interval must be positive, got {poll_interval!r}")
    viewer = _Viewer(store, poll_interval, prices)
    routes = [
        Route("/", viewer.index, methods=["GET"]),
        Route("/session", viewer.session, methods=["GET"]),
        Route("/events", viewer.events, methods=["GET"]),
        Route("/blob", viewer.blob, methods=["GET"]),
        Route("/search", viewer.search, methods=["GET"]),
        Route("/static/viewer.css", _stylesheet, methods=["GET"]),
        Route("/static/viewer.js", _script, methods=["GET"]),
    ]
    middleware = [
        Middleware(_SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
    ]
    return Starlette(routes=routes, middleware=middleware)


class _Viewer:
    """The pages that read the store: the session list, one session, its live events."""

    def __init__(self, store: Store, poll_interval: float,
                 prices: PriceTable | None = None) -> None:
        self.store = store
        self.poll_interval = poll_interval
        self.prices = prices

    async def index(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        cursor = request.query_params.get("cursor") or None
        try:
            limit = min(max(int(request.query_params.get("limit", PAGE_SIZE)), 1), MAX_PAGE)
        except ValueError:
            return _error("Bad request", "limit must be a whole number", 400)
        lister = getattr(self.store, "list_sessions", None)
        if lister is None:
            body = _html.list_body([], query=query, next_href=None, paged=False,
                                   can_list=False)
            return _html_response(_html.document("threadline sessions", body, head=_head()))
        try:
            titles: dict[str, str] = {}
            found, next_cursor = await matching(lister, query, limit, cursor, titles)
        except (ConfigError, StoreError) as exc:
            return _error("Cannot list sessions", str(exc), 400)
        next_href = None
        if next_cursor is not None:
            next_href = (f"/?limit={limit}&cursor={quote(next_cursor, safe='')}"
                         + (f"&q={quote(query, safe='')}" if query else ""))
        body = _html.list_body(found, query=query, next_href=next_href,
                               paged=cursor is not None, can_list=True, titles=titles)
        return _html_response(_html.document("threadline sessions", body, head=_head()))

    async def search(self, request: Request) -> Response:
        """Hits across sessions for ``?q=`` (``&owner=``, ``&tenant=``, ``&active=1``)."""
        query = request.query_params.get("q", "")
        owner = request.query_params.get("owner") or None
        tenant = request.query_params.get("tenant") or None
        active = request.query_params.get("active") == "1"
        searcher = getattr(self.store, "search", None)
        if searcher is None:
            return _error("Cannot search", "this store has no search", 400)
        status, error = 200, None
        terms: list[str] = []
        hits: list[SearchHit] = []
        if query.strip():
            try:
                terms = query_terms(query)
                hits = await searcher(query, owner=owner, tenant=tenant, active_path=active)
            except ConfigError as exc:
                status, error = 400, str(exc)
            except StoreError as exc:
                status, error = 500, str(exc)
        body = search_body(query, terms, hits, owner=owner, tenant=tenant, active=active,
                           error=error)
        return _html_response(_html.document(f"search {query}", body, head=_head()), status)

    async def session(self, request: Request) -> Response:
        sid = request.query_params.get("id")
        if not sid:
            return _error("Bad request", "no session id given (?id=...)", 400)
        page: int | None = None
        if "page" in request.query_params:
            try:
                page = int(request.query_params["page"])
            except ValueError:
                return _error("Bad request", "page must be a whole number", 400)
        custom = request.query_params.get("custom") == "1"
        try:
            entries = await self.store.load_entries(sid)
        except SessionNotFound as exc:
            return _error("Session not found", str(exc), 404)
        except StoreError as exc:
            return _error("Cannot read session", str(exc), 500)
        tree = TreeIndex(entries, session_id=sid)
        record, children = await lineage(self.store, sid)
        last = entries[-1].id if entries else ""
        # The script gets URLs, not the id: an id is any string, and what an
        # attribute shows of it (control pictures, escapes) is not the id.
        this = (_html.session_href(sid) + (f"&page={page}" if page is not None else "")
                + ("&custom=1" if custom else ""))
        follow = f"/events?id={quote(sid, safe='')}" + (
            f"&after={quote(last, safe='')}" if last else "")
        live = (f'<span id="live-state" data-events="{_html._e(follow)}" '
                f'data-page="{_html._e(this)}">static</span>')
        notes = list(getattr(entries, "diagnostics", ()))
        with _html.blob_sources(lambda part: blob_href(sid, part.sha256)):
            body = _html.session_body(tree, record, children=children, notes=notes, page=page,
                                      custom=custom, usage=usage_html(tree, entries, self.prices))
        doc = _html.document(f"session {sid}", body, head=_head(), live=live)
        return _html_response(doc)

    async def blob(self, request: Request) -> Response:
        """One attachment of a session: an image inline, anything else as a download.

        Only a blob that an entry of the named session references is served,
        with the media type that reference gives. Every response is also
        sandboxed by its own CSP, so even a file a browser is told to save
        could run nothing if it were ever shown.
        """
        sid, sha = request.query_params.get("session"), request.query_params.get("sha", "")
        if not sid or not _HEX64.fullmatch(sha):
            return _error("Bad request", "give ?session=...&sha=<64 hex digits>", 400)
        try:
            entries = await self.store.load_entries(sid)
            part = next((p for p in blob_parts(entries) if p.sha256 == sha), None)
            if part is None:
                return _error("Attachment not found",
                              f"no entry of session {sid!r} references blob {sha}", 404)
            data = await open_blob(self.store, sid, part)
        except (SessionNotFound, BlobNotFound) as exc:
            return _error("Attachment not found", str(exc), 404)
        except StoreError as exc:
            return _error("Cannot read attachment", str(exc), 500)
        headers = {"cache-control": "private, max-age=86400",
                   "content-security-policy": "sandbox; default-src 'none'"}
        if part.media_type in _html.IMAGE_TYPES:
            return Response(data, media_type=part.media_type,
                            headers={**headers, "content-disposition": "inline"})
        name = part.name or f"{sha[:12]}.bin"
        # An ASCII fallback and the exact name, percent-encoded: no quote, no
        # control character, no path can reach the header.
        plain = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100] or "attachment"
        disposition = f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"
        return Response(data, media_type="application/octet-stream",
                        headers={**headers, "content-disposition": disposition})

    async def events(self, request: Request) -> Response:
        sid = request.query_params.get("id")
        if not sid:
            return Response("no session id given (?id=...)", 400, media_type="text/plain")
        resume = request.headers.get("last-event-id")
        after = unquote(resume) if resume else request.query_params.get("after") or None
        try:
            entries = await self.store.load_entries(sid)
        except SessionNotFound as exc:
            return Response(str(exc), 404, media_type="text/plain")
        except StoreError as exc:
            return Response(str(exc), 500, media_type="text/plain")
        stream = _frames(_follow(self.store, sid, after, entries, self.poll_interval))
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})


async def _stylesheet(request: Request) -> Response:
    return Response(_html.CSS + SEARCH_CSS, media_type="text/css; charset=utf-8")


async def _script(request: Request) -> Response:
    return Response(SCRIPT, media_type="text/javascript; charset=utf-8")


async def _follow(
    store: Store, sid: str, after: str | None, loaded: list[Entry], interval: float
) -> AsyncIterator[Entry]:
    """Entries appended after ``after`` (all of them if it is unknown), then new ones."""
    watch = getattr(store, "watch", None)
    if callable(watch):
        async for entry in watch(sid, after=after):
            yield entry
        return
    entries = loaded
    position = 0
    if after is not None:
        # Search from the end: a reconnect names an entry near the tail.
        for i in range(len(entries) - 1, -1, -1):
            if entries[i].id == after:
                position = i + 1
                break
    while True:
        for entry in entries[position:]:
            yield entry
        position = len(entries)
        await asyncio.sleep(interval)
        entries = await store.load_entries(sid)


async def _frames(entries: AsyncIterator[Entry]) -> AsyncIterator[bytes]:
    yield b"retry: 1000\n\n"
    try:
        async for entry in entries:
            data = msgspec.json.encode({"id": entry.id, "parent_id": entry.parent_id})
            # SSE fields end at CR or LF; the percent-encoded id has neither, and
            # msgspec escapes control characters inside JSON strings.
            yield (f"id: {quote(entry.id, safe='')}\nevent: entry\n".encode()
                   + b"data: " + data + b"\n\n")
    except StoreError:
        # The browser reconnects and resumes from the last id it got.
        return


async def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    poll_interval: float = POLL_INTERVAL,
    ready: Callable[[str], None] | None = None,
    prices: PriceTable | None = None,
) -> None:
    """Serve the viewer until cancelled. ``port=0`` picks a free port;
    ``ready`` is called with the URL once the socket listens."""
    hosts = _LOOPBACK_NAMES if is_loopback(host) else [*_LOOPBACK_NAMES, host.strip("[]"), "*"]
    app = create_app(store, poll_interval=poll_interval, allowed_hosts=hosts, prices=prices)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(app, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    if ready is not None:
        ready(f"http://{shown}:{bound}/")
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
