"""The session viewer: rendering a session as HTML, and serving it, against exporting it.

- render: ``render_html`` of a session (every entry escaped and laid out as
  the tree plus the model's view) against msgspec encoding the same entries
  one JSON line each, the least an export does;
- page: one ``GET /session`` from the running viewer (loading the log from a
  file store, rendering, sending) against the store's ``load_entries`` alone;
- import: a fresh interpreter importing the server stack (``from
  threadline.viewer import serve``: Starlette, uvicorn) against importing
  ``threadline.session`` alone.

Sessions of 200, 2,000, 10,000 and 40,000 entries: questions, tool round
trips, answers, and a branch every 50 entries. A page draws at most 500
stored entries (the ones around the leaf), so past that its cost should
follow the load, not the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from bench._harness import Measured, Run, alternate, alternate_sync, at_most
from bench._targets import (
    AssistantMessage,
    Entry,
    FileStore,
    MessageEntry,
    SessionRecord,
    TextPart,
    ToolCall,
    ToolResultMessage,
    TreeIndex,
    UserMessage,
    render_html,
    serve,
)

NEEDS = ("import:starlette,uvicorn",)
_encode = msgspec.json.Encoder().encode
MINUTES = 1


def session(n: int) -> list[Entry]:
    out: list[Entry] = []
    parent: str | None = None
    for i in range(n):
        k = i % 4
        if k == 0:
            m: Any = UserMessage.of(f"question {i}: <what> & \"why\" " * 8)
        elif k == 1:
            m = AssistantMessage(content=(TextPart(text="Let me look. " * 6),
                                          ToolCall(id=f"c{i}", name="search",
                                                   arguments={"q": f"term {i}", "n": 5})),
                                 stop_reason="tool_use")
        elif k == 2:
            m = ToolResultMessage(tool_call_id=f"c{i - 1}", tool_name="search",
                                  content=(TextPart(text="result line\n" * 20),))
        else:
            m = AssistantMessage(content=(TextPart(text="Here is the answer. " * 15),))
        entry = MessageEntry(id=f"e{i:07d}", parent_id=parent, message=m)
        out.append(entry)
        parent = out[-10].id if i % 50 == 49 else entry.id
    return out


def _import_s(code: str) -> Measured:
    code = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    return Measured(float(out))


def _pages(root: Path, sid: str, turns: int) -> Any:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    store = FileStore(root)
    urls: list[str] = []
    ready = threading.Event()

    async def start() -> asyncio.Task[None]:
        return asyncio.create_task(serve()(store, port=0,
                                         ready=lambda u: (urls.append(u), ready.set())))

    task = asyncio.run_coroutine_threadsafe(start(), loop).result()
    try:
        ready.wait(30)
        port = int(urls[0].rsplit(":", 1)[1].strip("/"))

        def get() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", f"/session?id={sid}")
            assert conn.getresponse().read()
            conn.close()

        def load() -> None:
            asyncio.run_coroutine_threadsafe(store.load_entries(sid), loop).result()

        return alternate_sync({"page": get, "load": load}, turns)
    finally:
        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await store.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)


def main(run: Run) -> None:
    sizes, turns = run.pick(((200, 2_000, 10_000, 40_000), 7), ((200,), 2))
    root = run.tmp / "sessions"
    for n in sizes:
        entries = session(n)
        tree = TreeIndex(entries, session_id="s")
        got = alternate_sync({"html": lambda t=tree: render_html(t),
                              "jsonl": lambda e=entries: b"".join(
                                  _encode(x) + b"\n" for x in e)}, turns)
        run.row(f"viewer: HTML of a {n:,}-entry session", got.median("html") * 1e3, "ms",
                versus="the same entries as JSON lines, msgspec encoding each",
                versus_value=got.median("jsonl") * 1e3,
                ratio=got.paired("html", "jsonl"), detail=f"median of {turns} paired turns")

        async def write(sid: str = f"s{n}", entries: list[Entry] = entries) -> None:
            store = FileStore(root)
            await store.create_session(SessionRecord(id=sid))
            await store.append_entries(sid, entries)
            await store.close()

        asyncio.run(write())
        pages = _pages(root, f"s{n}", turns)
        run.row(f"viewer: GET of a {n:,}-entry session's page", pages.median("page") * 1e3,
                "ms", versus="load_entries of it from the same store",
                versus_value=pages.median("load") * 1e3, ratio=pages.paired("page", "load"),
                goal=at_most(5.0) if n >= 10_000 else None,
                detail=f"median of {turns} paired turns")
    got = asyncio.run(alternate({
        "server": lambda: _import_s("from threadline.viewer import serve"),
        "session": lambda: _import_s("import threadline.session"),
    }, turns, warm=False))
    run.row("viewer: import of the server stack (Starlette, uvicorn) in a new interpreter",
            got.median("server") * 1e3, "ms", versus="importing threadline.session",
            versus_value=got.median("session") * 1e3, ratio=got.paired("server", "session"),
            detail=f"median of {turns} paired turns")
