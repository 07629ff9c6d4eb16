"""Helpers of the threadline.web tests: a real HTTP server, an SSE reader, a slow model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from threadline.ai import Request
from threadline.testing import Delay, Gate, ScriptedModel, Text, Turn

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/support/web.py
EXAMPLE = ROOT / "examples" / "web_chat"


class Users:
    """The host's authentication in these tests: header ``x-user`` may touch the
    sessions whose id starts with ``<user>:``."""

    def __call__(self, request: Any) -> Any:
        user = request.headers.get("x-user") or request.cookies.get("user")
        return _Prefix(f"{user}:" if user else None)


@dataclass(frozen=True)
class _Prefix:
    prefix: str | None

    def __contains__(self, session_id: object) -> bool:
        return (self.prefix is not None and isinstance(session_id, str)
                and session_id.startswith(self.prefix))


def words(n: int) -> list[str]:
    return [f"w{i} " for i in range(n)]


def slow_model(n: int = 20, delay: float = 0.0, gates: list[asyncio.Event] | None = None
               ) -> ScriptedModel:
    """Each reply streams ``n`` words, ``delay`` seconds apart; with ``gates``, the reply
    waits at gate k before word k (as many as given)."""

    def reply(request: Request) -> Turn:
        blocks: list[Any] = []
        for i, w in enumerate(words(n)):
            if gates is not None and i < len(gates):
                blocks.append(Gate(gates[i]))
            elif delay:
                blocks.append(Delay(delay))
            blocks.append(Text(w))
        return Turn(*blocks)

    return ScriptedModel([reply] * 1000)


def in_thread(coro: Any) -> Any:
    """Run a coroutine on a fresh loop in another thread (Playwright's sync API keeps a
    loop running in the test's own)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` on a real uvicorn server on 127.0.0.1, in a thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server did not start")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@dataclass
class Event:
    data: str
    id: str | None = None
    event: str | None = None

    def json(self) -> Any:
        return json.loads(self.data)


async def events(response: httpx2.Response) -> AsyncIterator[Event]:
    """The server-sent events of ``response`` as they arrive."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in fields:
                yield Event(fields["data"], fields.get("id"), fields.get("event"))
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        fields[name] = fields[name] + "\n" + value if name == "data" and name in fields \
            else value


@dataclass
class Seen:
    """What a client saw of a plain event stream."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    last_id: str | None = None

    def text(self) -> str:
        return "".join(f["piece"][2] for f in self.frames
                       if f["type"] == "part" and f["piece"][0] == "t")

    def ended(self) -> dict[str, Any] | None:
        return next((f for f in self.frames if f["type"] == "run_closed"), None)


def plain(response: httpx2.Response) -> AsyncIterator[Event]:
    """The events of a plain threadline stream, read once however often ``read_plain`` is
    called on them."""
    return events(response)


async def read_plain(stream: httpx2.Response | AsyncIterator[Event], seen: Seen, *,
                     stop_after: int | None = None) -> None:
    """Read frames into ``seen`` until the run closes, or ``stop_after`` more parts."""
    parts = 0
    source = events(stream) if isinstance(stream, httpx2.Response) else stream
    async for event in source:
        frame = event.json()
        seen.frames.append(frame)
        seen.last_id = event.id
        if frame["type"] == "part":
            parts += 1
            if stop_after is not None and parts >= stop_after:
                return
        if frame["type"] == "run_closed":
            return


class ChildServer:
    """The example app (examples/web_chat/app.py) in a child process of its own."""

    def __init__(self, store: str, *, delay: float = 0.02, words: int = 40,
                 lease: float = 30.0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE / "app.py"), "--store", store, "--port",
             str(self.port), "--delay", str(delay), "--words", str(words), "--no-build",
             "--lease", str(lease)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "http://" not in line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"the example app did not start: {line!r} {err[-3000:]}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)

    def __enter__(self) -> ChildServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
