"""A chat page on the Vercel AI SDK's ``useChat``, served by ``threadline.web``.

    python examples/web_chat/app.py            # then open http://127.0.0.1:8000/

It builds the page the first time (``npm ci`` and esbuild, in this folder),
keeps sessions in ``./web-chat-sessions`` (``--store`` takes any store URL)
and answers with a demo model that streams a reply word by word, offline.
``--model openai:gpt-4.1-mini`` (or any ``threadline.ai.get_model`` name)
talks to a real one. Reload the page mid-answer: the answer goes on. Press
Stop: the run ends, keeping what was written. Kill the server mid-answer and
start it again: the page shows what had streamed, ended as aborted.

Each browser gets a user id in a cookie, and may touch only the sessions
whose id starts with it: the host application's authentication, in small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Container
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Mount, Route

from threadline import durable, web
from threadline.ai import (
    AssistantMessage,
    DoneEvent,
    ErrorEvent,
    LanguageModel,
    ModelInfo,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDelta,
    TextEnd,
    TextPart,
    TextStart,
)
from threadline.ai import Request as ModelRequest
from threadline.stores import open_store

HERE = Path(__file__).resolve().parent
BUNDLE = HERE / "static" / "app.js"

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>threadline chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
.msg { padding: .5rem .75rem; margin: .5rem 0; border-radius: .5rem; white-space: pre-wrap; }
.user { background: #e8f0fe; } .assistant { background: #f1f3f4; }
.aborted::after { content: " (stopped)"; color: #a50e0e; }
form { display: flex; gap: .5rem; } input { flex: 1; padding: .5rem; }
#status { color: #5f6368; font-size: .9rem; }
</style></head>
<body><h1>threadline chat</h1><div id="root" data-user="{user}"></div>
<script type="module" src="/static/app.js"></script></body></html>
"""


class DemoModel:
    """Streams a reply word by word, ``delay`` seconds apart, and stops when aborted."""

    def __init__(self, words: int = 40, delay: float = 0.05) -> None:
        self.words = words
        self.delay = delay

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(provider="demo", id="demo-words")

    async def stream(self, request: ModelRequest,
                     options: StreamOptions | None = None) -> AsyncIterator[StreamEvent]:
        abort = options.abort if options is not None else None
        asked = request.messages[-1]
        said = getattr(asked, "text", "")
        words = [f"You said {said!r}."] + [f"word{i}" for i in range(1, self.words)]
        yield StartEvent(model="demo-words", provider="demo")
        yield TextStart(index=0)
        text = ""
        for i, word in enumerate(words):
            if abort is not None and abort.is_set():
                yield ErrorEvent(message=_message(text, "aborted"))
                return
            delta = word if i == 0 else " " + word
            text += delta
            yield TextDelta(index=0, delta=delta)
            if self.delay:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_wait(abort), self.delay)
        yield TextEnd(index=0, text=text)
        yield DoneEvent(message=_message(text, "stop"))


async def _wait(abort: asyncio.Event | None) -> None:
    if abort is None:
        await asyncio.Event().wait()
    else:
        await abort.wait()


def _message(text: str, stop_reason: Any) -> AssistantMessage:
    return AssistantMessage(content=(TextPart(text=text),) if text else (), model="demo-words",
                            provider="demo", stop_reason=stop_reason,
                            error_message="aborted" if stop_reason == "aborted" else None)


class UserSessions:
    """The sessions a request may touch: those whose id starts with its user's id."""

    def __init__(self, request: Request) -> None:
        user = request.cookies.get("user") or request.headers.get("x-user") or ""
        self.prefix = f"{user}:" if user else None

    def __contains__(self, session_id: object) -> bool:
        return (self.prefix is not None and isinstance(session_id, str)
                and session_id.startswith(self.prefix))


def sessions(request: Request) -> Container[str]:
    return UserSessions(request)


def make_app(store_url: str, model: LanguageModel, *, lease: float = 30.0) -> Starlette:
    store = open_store(store_url)
    factory = durable.model(model, system="You are a helpful assistant.")
    runs = durable.LiveRuns(store, factory, lease=lease)
    chat = web.create_app(store, factory, sessions=sessions, runs=runs)

    async def page(request: Request) -> Response:
        user = request.cookies.get("user") or secrets.token_hex(8)
        response = HTMLResponse(PAGE.replace("{user}", user))
        response.set_cookie("user", user, httponly=True, samesite="strict")
        return response

    async def bundle(request: Request) -> Response:
        if not BUNDLE.exists():
            return Response("the page is not built: run 'npm ci && npm run build' in "
                            f"{HERE}", status_code=503)
        return FileResponse(BUNDLE, media_type="text/javascript")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await runs.close()  # the mounted app's own lifespan does not run
        close = getattr(store, "close", None)
        if close is not None:
            await close()

    return Starlette(routes=[Route("/", page), Route("/static/app.js", bundle),
                             Mount("/api", chat)], lifespan=lifespan)


def build() -> None:
    """Install the page's packages and bundle it, when that is not done yet."""
    source = HERE / "src" / "main.jsx"
    if BUNDLE.exists() and BUNDLE.stat().st_mtime >= source.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("building the page needs Node.js and npm (apt-get install nodejs npm)")
    if not (HERE / "node_modules").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True)
    subprocess.run([npm, "run", "--silent", "build"], cwd=HERE, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("THREADLINE_STORE", "./web-chat-sessions"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default=None, help="a real model, e.g. openai:gpt-4.1-mini")
    ap.add_argument("--words", type=int, default=40, help="the demo model's reply length")
    ap.add_argument("--delay", type=float, default=0.05, help="seconds between its words")
    ap.add_argument("--lease", type=float, default=30.0)
    ap.add_argument("--no-build", action="store_true", help="serve without building the page")
    args = ap.parse_args()
    if not args.no_build:
        build()
    if args.model is not None:
        from threadline.ai import get_model

        model: LanguageModel = get_model(args.model)
    else:
        model = DemoModel(args.words, args.delay)
    app = make_app(args.store, model, lease=args.lease)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    # Bound here, so the address is taken (or refused) before it is announced; a
    # client that connects at once waits in the backlog until the server accepts.
    sock = socket.create_server((args.host, args.port))
    print(f"threadline web chat on http://{args.host}:{args.port}/", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
