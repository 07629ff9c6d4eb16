"""``threadline.web`` against real clients and real faults.

- The ``ai`` package from npm (the version tests/web_client/package.json pins),
  run by Node: its ``DefaultChatTransport`` and ``readUIMessageStream`` read
  the app's stream and rebuild the UI message.
- The example page in a browser: tests/test_web_browser.py.
- The example server killed with SIGKILL mid-answer and started again; two
  server processes on one store; many streams at once with random
  disconnects and rejoins.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest

from support.web import ROOT, ChildServer, Seen, Users, plain, read_plain, serve, slow_model, words
from threadline import durable, web
from threadline.ai import AssistantMessage, tool
from threadline.session import MessageEntry
from threadline.stores import FileStore, MemoryStore
from threadline.testing import Call, Gate, ScriptedModel, Text, Thinking, Turn

CLIENT = ROOT / "tests" / "web_client"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI installs it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        _unavailable("node is missing (apt-get install nodejs npm)")
    if not (CLIENT / "node_modules" / "ai").exists():
        _unavailable(f"the ai package is not installed: npm ci in {CLIENT}")
    return str(found)


def run_node(node: str, *argv: str) -> dict[str, Any]:
    done = subprocess.run([node, str(CLIENT / "reader.mjs"), *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def normal(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("type", "text", "toolCallId", "input", "output", "errorText")
    return [{k: p[k] for k in keys if k in p} for p in parts]


@tool
def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: What to look up.
    """
    return f"found {q}"


class Watching(Users):
    """``Users``, noting each request path so a test can wait for a client to arrive."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.arrived = threading.Event()

    def __call__(self, request: Any) -> Any:
        self.paths.append(request.url.path)
        if request.url.path.endswith("/stream"):
            self.arrived.set()
        return super().__call__(request)


def test_s56_the_ai_sdk_reader_rebuilds_the_message_the_log_holds(node: str,
                                                                 tmp_path: Path) -> None:
    model = ScriptedModel([
        Turn(Thinking("let me ", "look"), Text("Looking ", "it up."), Call("lookup", {"q": "x"})),
        Turn(Text(*words(6))),
    ])
    store = FileStore(tmp_path / "s")
    app = web.create_app(store, durable.model(model, [lookup]), sessions=Users())
    with serve(app) as url:
        got = run_node(node, url, "ann", "send", "ann:1", "what is x?")
        reload = httpx2.get(f"{url}/chat/ann:1/messages", headers={"x-user": "ann"}).json()
        none = run_node(node, url, "ann", "resume", "ann:1")
    message = got["message"]
    assert message["role"] == "assistant" and message["id"] == reload["messages"][-1]["id"]
    assert normal(message["parts"]) == normal(reload["messages"][-1]["parts"])
    types = [p["type"] for p in message["parts"]]
    assert types == ["step-start", "reasoning", "text", "tool-lookup", "step-start", "text"]
    tool_part = message["parts"][3]
    assert tool_part["state"] == "output-available"
    assert tool_part["input"] == {"q": "x"} and tool_part["output"] == "found x"
    assert message["parts"][-1]["text"] == "".join(words(6))
    assert message["metadata"]["threadline"]["stopReason"] == "done"
    assert none == {"message": None}  # nothing to resume: 204


def test_s56_the_ai_sdk_resumes_a_stream_it_left_mid_answer(node: str, tmp_path: Path) -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text(*words(4)), Gate(gate), Text(*words(3)))])
    watching = Watching()
    store = FileStore(tmp_path / "s")
    runs = durable.LiveRuns(store, durable.model(model), flush_interval=0.01)
    app = web.create_app(store, runs.factory, sessions=watching, runs=runs)
    with serve(app) as url:
        left = run_node(node, url, "ann", "send", "ann:2", "hi", "3")
        assert left["deltas"] == 3
        assert left["message"]["parts"][-1]["state"] == "streaming"

        def release() -> None:
            watching.arrived.wait(60)
            run = runs.owned("ann:2")
            assert run is not None and run.task is not None
            run.task.get_loop().call_soon_threadsafe(gate.set)

        releaser = threading.Thread(target=release)
        releaser.start()
        resumed = run_node(node, url, "ann", "resume", "ann:2")
        releaser.join()
        stored = [e.message for e in asyncio.run(store.load_entries("ann:2"))
                  if isinstance(e, MessageEntry)]
    message = resumed["message"]
    assert message["id"] == left["message"]["id"]
    text = "".join(p["text"] for p in message["parts"] if p["type"] == "text")
    assert isinstance(stored[-1], AssistantMessage)
    assert text == stored[-1].text == "".join(words(4) + words(3))  # each delta once


# -- faults ----------------------------------------------------------------------------


async def test_s54_a_server_killed_mid_answer_comes_back_with_what_had_streamed(
        tmp_path: Path) -> None:
    store = str(tmp_path / "sessions")
    seen = Seen()
    server = ChildServer(store, delay=0.02, words=400)
    try:
        async with httpx2.AsyncClient(base_url=server.url, headers={"x-user": "ann"},
                                      timeout=30) as c, \
                c.stream("POST", "/api/chat/ann:k/runs", json={"text": "hi"}) as r:
            await read_plain(r, seen, stop_after=40)
    finally:
        server.kill()  # SIGKILL, mid-answer
    assert seen.ended() is None
    with ChildServer(store) as again:
        async with httpx2.AsyncClient(base_url=again.url, headers={"x-user": "ann"},
                                      timeout=30) as c:
            async with c.stream("GET", "/api/chat/ann:k/events",
                                headers={"last-event-id": seen.last_id or ""}) as r:
                assert r.status_code == 200
                rest = Seen()
                await read_plain(r, rest)
            reload = (await c.get("/api/chat/ann:k/messages")).json()
    closed = rest.ended()
    assert closed is not None and closed["stop_reason"] == "interrupted"
    aborted = next(f for f in rest.frames if f["type"] == "message")["entry"]["message"]
    assert aborted["stop_reason"] == "aborted"
    text = aborted["content"][0]["text"]
    # What reached the log before the kill, and what the client saw, agree as far as
    # both go: the pieces of the last flush interval may be missing from the log.
    shorter, longer = sorted((text, seen.text() + rest.text()), key=len)
    assert longer.startswith(shorter) and len(text) > 0
    answer = reload["messages"][-1]
    assert answer["metadata"]["threadline"]["stopReason"] == "interrupted"
    assert "".join(p["text"] for p in answer["parts"] if p["type"] == "text") == text
    assert reload["active_run"] is None


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_s53_a_stream_started_on_one_server_is_rejoined_through_another(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "sqlite":
        store = f"sqlite:///{tmp_path / 's.db'}"
    else:
        pg_url, schema = request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")
        store = f"{pg_url}?schema={schema}"
    seen = Seen()
    with ChildServer(store, delay=0.01, words=120) as a, ChildServer(store) as b:
        async with httpx2.AsyncClient(headers={"x-user": "ann"}, timeout=30) as c:
            async with c.stream("POST", f"{a.url}/api/chat/ann:ab/runs",
                                json={"text": "hi"}) as r:
                await read_plain(r, seen, stop_after=15)
            while seen.ended() is None:
                async with c.stream("GET", f"{b.url}/api/chat/ann:ab/events",
                                    headers={"last-event-id": seen.last_id or ""}) as r:
                    assert r.status_code == 200
                    await read_plain(r, seen)
            reload = (await c.get(f"{b.url}/api/chat/ann:ab/messages")).json()
    ids = [f["id"] for f in seen.frames]
    assert len(ids) == len(set(ids))
    offsets = [f["offset"] for f in seen.frames if f["type"] == "part"]
    assert offsets == list(range(len(offsets)))  # every piece once, in order
    final = "".join(p["text"] for p in reload["messages"][-1]["parts"] if p["type"] == "text")
    assert seen.text() == final and final.endswith("word119")
    assert seen.ended()["stop_reason"] == "done"  # type: ignore[index]


async def _many_streams(count: int, seed: int) -> None:
    """``count`` streams at once on one store behind two servers: each client leaves
    after a random number of pieces and rejoins through either server (the one that
    owns the run follows it in memory, the other from the log), until the end."""
    rng = random.Random(seed)
    store = MemoryStore()
    factory = durable.model(slow_model(30, delay=0.002))
    owner = durable.LiveRuns(store, factory, flush_interval=0.01)
    other = durable.LiveRuns(store, factory, flush_interval=0.01)
    apps = [web.create_app(store, factory, sessions=Users(), runs=r) for r in (owner, other)]
    with serve(apps[0]) as url_a, serve(apps[1]) as url_b:
        limits = httpx2.Limits(max_connections=count * 2)
        async with httpx2.AsyncClient(headers={"x-user": "ann"}, timeout=60,
                                      limits=limits) as c:
            async def one(n: int) -> Seen:
                seen = Seen()
                async with c.stream("POST", f"{url_a}/chat/ann:{n}/runs",
                                    json={"text": "go"}) as r:
                    await read_plain(plain(r), seen, stop_after=rng.randint(1, 20))
                while seen.ended() is None:
                    url = rng.choice((url_a, url_b))
                    async with c.stream("GET", f"{url}/chat/ann:{n}/events",
                                        headers={"last-event-id": seen.last_id or ""}) as r:
                        await read_plain(plain(r), seen, stop_after=rng.randint(1, 30))
                return seen

            got = await asyncio.gather(*(one(n) for n in range(count)))
    for seen in got:
        ids = [f["id"] for f in seen.frames]
        assert len(ids) == len(set(ids))
        offsets = [f["offset"] for f in seen.frames if f["type"] == "part"]
        assert offsets == list(range(len(offsets)))
        assert seen.text() == "".join(words(30))
        assert seen.ended()["stop_reason"] == "done"  # type: ignore[index]


async def test_s53_many_streams_with_random_disconnects_get_every_delta_once() -> None:
    await _many_streams(20, seed=1)


@pytest.mark.stress
async def test_s53_a_hundred_streams_with_random_disconnects_get_every_delta_once() -> None:
    await _many_streams(100, seed=2)
