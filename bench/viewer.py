"""Viewer benchmark: each figure next to a floor measured in the same run.

    .venv/bin/python bench/viewer.py            # full run (about 20 seconds)
    .venv/bin/python bench/viewer.py --quick    # smaller, for a smoke test

Prints a table and writes bench/results/viewer.json.

- render: ``render_html`` of a session (every entry escaped and laid out as
  the tree plus the model's view) against ``export_lines`` of the same
  entries, which is what ``export --format jsonl`` writes.
- page: one ``GET /session`` from the running viewer (loading the log from a
  file store, reading lineage, rendering, sending) against the store's
  ``load_entries`` of that session alone.
- import: the time a fresh interpreter takes to import the server stack
  (``threadline.viewer._server``: Starlette, uvicorn) against importing
  ``threadline.session`` alone, and, when installed, aiohttp's web module as
  the peer stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from threadline.ai._messages import (
    AssistantMessage,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.session import Entry, FileStore, MessageEntry, SessionRecord, TreeIndex
from threadline.session._codec import export_lines
from threadline.viewer import render_html, serve

RESULTS = Path(__file__).parent / "results" / "viewer.json"


def session(n: int) -> list[Entry]:
    """A chat of ``n`` entries: questions, tool round trips, answers, and a
    branch every 50 entries."""
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
        # Every 50 entries the next one continues from 10 entries back.
        parent = out[-10].id if i % 50 == 49 else entry.id
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def import_time(module: str, repeat: int) -> float | None:
    if importlib.util.find_spec(module.split(".", maxsplit=1)[0]) is None:
        return None
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout) for _ in range(repeat)]
    return statistics.median(runs)


def page_times(root: Path, sid: str, repeat: int) -> tuple[float, float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    store = FileStore(root)
    urls: list[str] = []
    ready = threading.Event()
    async def start() -> asyncio.Task[None]:
        return asyncio.create_task(
            serve(store, port=0, ready=lambda u: (urls.append(u), ready.set())))

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

        return best(get, repeat), best(load, repeat)
    finally:
        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await store.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    quick = ap.parse_args().quick
    sizes = [200, 2_000] if quick else [200, 2_000, 10_000]
    repeat = 3 if quick else 7
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        async def write(sid: str, entries: list[Entry]) -> None:
            store = FileStore(root)
            await store.create_session(SessionRecord(id=sid))
            await store.append_entries(sid, entries)
            await store.close()

        for n in sizes:
            entries = session(n)
            tree = TreeIndex(entries, session_id="s")
            html_s = best(lambda t=tree: render_html(t), repeat)
            jsonl_s = best(lambda e=entries: export_lines(e), repeat)
            sid = f"s{n}"
            asyncio.run(write(sid, entries))
            page_s, load_s = page_times(root, sid, repeat)
            rows.append({"entries": n, "render_ms": html_s * 1e3, "jsonl_ms": jsonl_s * 1e3,
                         "render_ratio": html_s / jsonl_s, "page_ms": page_s * 1e3,
                         "load_ms": load_s * 1e3, "page_ratio": page_s / load_s})
    stack = import_time("threadline.viewer._server", repeat)
    floor = import_time("threadline.session", repeat)
    peer = import_time("aiohttp.web", repeat)
    assert stack is not None and floor is not None
    imports = {"viewer_server_ms": stack * 1e3, "session_ms": floor * 1e3,
               "added_ms": (stack - floor) * 1e3,
               "aiohttp_web_ms": None if peer is None else peer * 1e3}

    print(f"{'entries':>8} {'render_html':>12} {'jsonl':>9} {'ratio':>7} "
          f"{'GET page':>10} {'load':>9} {'ratio':>7}")
    for r in rows:
        print(f"{r['entries']:>8} {r['render_ms']:>10.1f}ms {r['jsonl_ms']:>7.1f}ms "
              f"{r['render_ratio']:>6.1f}x {r['page_ms']:>8.1f}ms {r['load_ms']:>7.1f}ms "
              f"{r['page_ratio']:>6.1f}x")
    print(f"import threadline.viewer._server {imports['viewer_server_ms']:.0f} ms vs "
          f"threadline.session {imports['session_ms']:.0f} ms "
          f"(+{imports['added_ms']:.0f} ms)"
          + ("" if peer is None else f"; aiohttp.web {imports['aiohttp_web_ms']:.0f} ms"))
    machine = {"python": platform.python_version(), "platform": platform.platform(),
               "quick": quick}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, "render": rows, "import": imports},
                                  indent=2) + "\n")


if __name__ == "__main__":
    main()
