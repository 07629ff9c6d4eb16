"""A real HTTP/1.1 server on 127.0.0.1 that replays scripted provider responses.

Tests queue ``Reply`` objects; each incoming request takes the next one and
the server records what it received (path, headers, JSON body). Streaming
replies are written chunk by chunk with chunked transfer encoding, the way
provider APIs send server-sent events. A ``HANG`` marker keeps the response
open until the client goes away, which sets ``disconnected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

HANG = object()
"""In ``Reply.chunks``: stop sending and wait until the client closes the connection."""

CUT = object()
"""In ``Reply.chunks``: drop the connection mid-response, as a crashed server would."""


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[Any] = field(default_factory=list)
    """bytes to send, a float to sleep that many seconds, ``HANG`` or ``CUT``."""


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def sse_data(objs: list[Any], done: bool = True) -> list[Any]:
    """OpenAI-style events: ``data: {json}`` lines, then ``data: [DONE]``."""
    out: list[Any] = [o if not isinstance(o, dict) else f"data: {json.dumps(o)}\n\n".encode()
                      for o in objs]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def sse_named(objs: list[Any]) -> list[Any]:
    """Anthropic-style events: ``event: <type>`` then ``data: {json}``."""
    return [
        o if not isinstance(o, dict)
        else f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode()
        for o in objs
    ]


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, headers={"content-type": "application/json", **(headers or {})},
                 chunks=[json.dumps(body).encode()])


def sse_reply(chunks: list[Any]) -> Reply:
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


class WireServer:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.disconnected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        await self._server.wait_closed()

    def reply(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except ConnectionError:
            self.disconnected.set()  # the client went away while a reply was being written
        except asyncio.CancelledError:
            pass  # the server is shutting down
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return False  # an idle keep-alive connection closed
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip()
                   for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        self.received.append(Received(method, path, headers, body))
        reply = self.replies.pop(0) if self.replies else json_reply(
            500, {"error": {"message": "wire server: no reply queued", "type": "server_error"}})
        status_text = {200: "OK"}.get(reply.status, "Status")
        out = [f"HTTP/1.1 {reply.status} {status_text}", "transfer-encoding: chunked"]
        out += [f"{k}: {v}" for k, v in reply.headers.items()]
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode())
        await writer.drain()
        for chunk in reply.chunks:
            if chunk is HANG:
                # Nothing more will come; a closed client shows up as EOF.
                while await reader.read(1024):
                    pass
                self.disconnected.set()
                return False
            if chunk is CUT:
                writer.transport.abort()
                return False
            if isinstance(chunk, float):
                await asyncio.sleep(chunk)
                continue
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
