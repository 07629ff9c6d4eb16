"""``threadline.web`` over real HTTP (uvicorn on 127.0.0.1): the two streams, rejoin,
stop, the messages of a reload, authentication and bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from support.web import Seen, Users, events, plain, read_plain, serve, slow_model, words
from threadline import durable, web
from threadline.ai import AssistantMessage
from threadline.session import MessageEntry
from threadline.stores import FileStore, Store
from threadline.testing import Gate, ScriptedModel, Text, Turn

ANN = {"x-user": "ann"}
EVE = {"x-user": "eve"}


class Server:
    def __init__(self, url: str, store: Store, runs: durable.LiveRuns) -> None:
        self.url, self.store, self.runs = url, store, runs

    def client(self, headers: dict[str, str] = ANN) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.url, headers=headers, timeout=30)


def _server(tmp_path: Path, model: ScriptedModel, **options: Any) -> Iterator[Server]:
    store = FileStore(tmp_path / "sessions")
    runs = durable.LiveRuns(store, durable.model(model), flush_interval=0.01)
    app = web.create_app(store, runs.factory, sessions=Users(), runs=runs, **options)
    with serve(app) as url:
        yield Server(url, store, runs)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    yield from _server(tmp_path, slow_model(8))


def ui_body(session: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": session, "trigger": "submit-message", **extra,
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}]}


async def chunks(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    async for event in events(response):
        if event.data != "[DONE]":
            yield event.json()


async def test_s56_a_message_is_answered_with_the_ui_message_stream(server: Server) -> None:
    async with server.client() as c, c.stream("POST", "/chat",
                                              json=ui_body("ann:1", "hello")) as r:
        assert r.status_code == 200
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert r.headers["content-type"].startswith("text/event-stream")
        got = [x async for x in chunks(r)]
    types = [x["type"] for x in got]
    assert types[:3] == ["start", "start-step", "text-start"]
    assert types[-2:] == ["finish-step", "finish"]
    assert "".join(x["delta"] for x in got if x["type"] == "text-delta") == "".join(words(8))
    assert got[-1]["finishReason"] == "stop"
    run_id = got[0]["messageId"]
    assert got[-1]["messageMetadata"] == {"threadline": {"runId": run_id, "stopReason": "done"}}
    async with server.client() as c:
        reload = (await c.get("/chat/ann:1/messages")).json()
        assert (await c.get("/chat/ann:1/stream")).status_code == 204  # nothing going on
    assert reload["active_run"] is None
    user, answer = reload["messages"]
    assert user["role"] == "user" and user["parts"] == [{"type": "text", "text": "hello"}]
    assert answer["id"] == run_id and answer["role"] == "assistant"
    assert "".join(p["text"] for p in answer["parts"] if p["type"] == "text") == \
        "".join(words(8))


async def test_s53_the_plain_stream_resumes_after_the_last_event_id(server: Server) -> None:
    seen = Seen()
    async with server.client() as c:
        async with c.stream("POST", "/chat/ann:2/runs", json={"text": "hi"}) as r:
            assert r.status_code == 200
            await read_plain(r, seen, stop_after=3)
        cut = len(seen.frames)
        while seen.ended() is None:
            async with c.stream("GET", "/chat/ann:2/events",
                                headers={"last-event-id": seen.last_id or ""}) as r:
                assert r.status_code == 200
                await read_plain(r, seen, stop_after=2)
    ids = [f["id"] for f in seen.frames]
    assert len(ids) == len(set(ids))  # each frame once
    assert seen.text() == "".join(words(8))  # every delta, in order
    assert cut < len(seen.frames)
    assert seen.ended() == {"type": "run_closed", "id": seen.frames[0]["id"] + ".end",
                            "run_id": seen.frames[0]["id"], "stop_reason": "done"}
    async with server.client() as c:
        assert (await c.get("/chat/ann:2/events",
                            headers={"last-event-id": seen.frames[-1]["id"]})).status_code == 204


async def test_s52_post_stop_ends_the_run_for_every_client(tmp_path: Path) -> None:
    model = ScriptedModel([Turn(Text("partial "), Gate(asyncio.Event()), Text("never"))])
    for server in _server(tmp_path, model):
        async with server.client() as c:
            async with c.stream("POST", "/chat/ann:3/runs", json={"text": "hi"}) as r:
                seen, stream = Seen(), plain(r)
                await read_plain(stream, seen, stop_after=2)
                stopped = await c.post("/chat/ann:3/stop")
                assert stopped.status_code == 202
                assert stopped.json()["run_id"] == seen.frames[0]["id"]
                await read_plain(stream, seen)
            assert seen.ended()["stop_reason"] == "stopped"  # type: ignore[index]
            assert (await c.post("/chat/ann:3/stop")).status_code == 409
            reload = (await c.get("/chat/ann:3/messages")).json()
        answer = reload["messages"][-1]
        assert answer["metadata"]["threadline"]["stopReason"] == "stopped"
        assert [p["text"] for p in answer["parts"] if p["type"] == "text"] == ["partial "]
        stored = [e.message for e in await server.store.load_entries("ann:3")
                  if isinstance(e, MessageEntry)]
        assert isinstance(stored[-1], AssistantMessage)
        assert stored[-1].stop_reason == "aborted" and stored[-1].text == "partial "


async def test_s56_a_rejoin_replays_the_run_from_its_start_and_then_follows_it(
        tmp_path: Path) -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text(*words(3)), Gate(gate), Text(*words(2)))])
    for server in _server(tmp_path, model):
        async with server.client() as c:
            async with c.stream("POST", "/chat", json=ui_body("ann:4", "hi")) as r:
                first = []
                async for x in chunks(r):
                    first.append(x)
                    if sum(y["type"] == "text-delta" for y in first) == 3:
                        break  # the tab reloads
            reload = (await c.get("/chat/ann:4/messages")).json()
            assert reload["active_run"] == first[0]["messageId"]
            streaming = reload["messages"][-1]
            assert streaming["id"] == first[0]["messageId"]
            assert [p.get("state") for p in streaming["parts"] if p["type"] == "text"] == \
                ["streaming"]
            async with c.stream("GET", "/chat/ann:4/stream") as r:
                assert r.status_code == 200
                assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
                replay = []
                async for x in chunks(r):
                    replay.append(x)
                    if len(replay) == len(first):
                        assert replay == first  # from the start, the same chunks
                        _set_on_server(server, "ann:4", gate)
        deltas = "".join(x["delta"] for x in replay if x["type"] == "text-delta")
        assert deltas == "".join(words(3)) + "".join(words(2))
        assert replay[-1]["type"] == "finish"


def _set_on_server(server: Server, session_id: str, event: asyncio.Event) -> None:
    """Set an event the server's loop waits on, from the test's thread."""
    run = server.runs.owned(session_id)
    assert run is not None and run.task is not None
    run.task.get_loop().call_soon_threadsafe(event.set)


def own_only(before: list[Any], after: list[Any]) -> bool:
    """Nothing was stored between two loads but what the session's own run streamed."""
    return after[:len(before)] == before and all(
        getattr(e, "kind", "") == "threadline.partial" for e in after[len(before):])


GUESSES = ["ann:5", "ann:5 ", "ANN:5", "ann:", "ann", "ann%3A5", "ann:5/x", "../ann:5", "ann:5/.."]


async def test_s55_one_user_cannot_read_rejoin_or_stop_anothers_session(tmp_path: Path) -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text("secret "), Gate(gate), Text("answer"))])
    for server in _server(tmp_path, model):
        async with server.client() as ann, server.client(EVE) as eve:
            async with ann.stream("POST", "/chat", json=ui_body("ann:5", "mine")) as r:
                async for x in chunks(r):
                    if x["type"] == "text-delta":
                        break
            before = await server.store.load_entries("ann:5")
            answers = []
            for guess in GUESSES:
                path = "/chat/" + guess
                answers += [
                    await eve.get(path + "/messages"),
                    await eve.get(path + "/stream"),
                    await eve.get(path + "/events"),
                    await eve.get(path + "/events", headers={"last-event-id":
                                                             before[0].id + ".0.0"}),
                    await eve.post(path + "/stop"),
                    await eve.post(path + "/runs", json={"text": "let me in"}),
                    await eve.post("/chat", json=ui_body(guess, "let me in")),
                ]
            for answer in answers:
                # The same answer as for a session that does not exist (or no route at all,
                # for a guess the client's URL normalisation turned into another path).
                assert answer.status_code in (400, 404), (answer.request.url, answer.text)
                assert answer.text in ('{"error":"no such session"}', "Not Found") \
                    or answer.status_code == 400, (answer.request.url, answer.text)
            assert sum(a.status_code == 404 for a in answers) > len(GUESSES) * 5
            # No credential at all is the same as someone else's.
            async with httpx2.AsyncClient(base_url=server.url) as nobody:
                assert (await nobody.get("/chat/ann:5/messages")).status_code == 404
            assert own_only(before, await server.store.load_entries("ann:5"))
            _set_on_server(server, "ann:5", gate)
            async with ann.stream("GET", "/chat/ann:5/events") as r:
                await read_plain(r, Seen())  # to the run's end
            reload = (await ann.get("/chat/ann:5/messages")).json()
        assert reload["messages"][-1]["metadata"]["threadline"]["stopReason"] == "done"


async def test_s55_bad_input_gets_a_clear_4xx_and_nothing_is_stored(tmp_path: Path) -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text("busy "), Gate(gate), Text("done"))])
    for server in _server(tmp_path, model, max_message_bytes=1000, max_body_bytes=5000):
        async with server.client() as c:
            async def refused(status: int, method: str, path: str, **kw: Any) -> str:
                answer = await c.request(method, path, **kw)
                assert answer.status_code == status, answer.text
                return str(answer.json()["error"])

            raw = {"headers": {**ANN, "content-type": "application/json"}}
            assert "not JSON" in await refused(400, "POST", "/chat", content=b"{nope", **raw)
            assert "not JSON" in await refused(400, "POST", "/chat/ann:6/runs",
                                               content=b"[1,", **raw)
            assert "'id'" in await refused(400, "POST", "/chat", json={"messages": []})
            assert "'messages'" in await refused(400, "POST", "/chat", json={"id": "ann:6"})
            assert "role 'user'" in await refused(400, "POST", "/chat", json={
                "id": "ann:6", "messages": [{"role": "assistant", "parts": [
                    {"type": "text", "text": "x"}]}]})
            assert "empty" in await refused(400, "POST", "/chat", json=ui_body("ann:6", ""))
            assert "'source-url'" in await refused(400, "POST", "/chat", json={
                "id": "ann:6", "messages": [{"role": "user", "parts": [
                    {"type": "source-url", "url": "x"}]}]})
            assert "data: URL" in await refused(400, "POST", "/chat", json={
                "id": "ann:6", "messages": [{"role": "user", "parts": [
                    {"type": "file", "mediaType": "image/png", "url": "https://x/y.png"}]}]})
            assert "regenerate" in await refused(400, "POST", "/chat", json=ui_body(
                "ann:6", "x", trigger="regenerate-message"))
            assert "1000 bytes" in await refused(413, "POST", "/chat",
                                                 json=ui_body("ann:6", "x" * 2000))
            assert "5000 bytes" in await refused(413, "POST", "/chat/ann:6/runs",
                                                 json={"text": "x" * 6000})
            assert "'text'" in await refused(400, "POST", "/chat/ann:6/runs", json={"txt": 1})
            assert "user message" in await refused(400, "POST", "/chat/ann:6/runs",
                                                   json={"message": {"role": "user"}})
            for path in ("/messages", "/stop"):
                method = "POST" if path == "/stop" else "GET"
                assert "no such session" in await refused(404, method, "/chat/ann:6" + path)
            assert "no such session" in await refused(
                404, "GET", "/chat/ann:6/events", headers={**ANN, "last-event-id": "r.0.1"})
            for path in ("/stream", "/events"):  # a new chat asks to resume: nothing to
                assert (await c.get("/chat/ann:6" + path)).status_code == 204
            assert not (tmp_path / "sessions").exists() or not list(
                (tmp_path / "sessions").glob("*.jsonl"))  # nothing created, nothing stored
            # A message while a run is active: 409 naming the run, nothing stored.
            async with c.stream("POST", "/chat", json=ui_body("ann:7", "first")) as r:
                run_id = None
                async for x in chunks(r):
                    run_id = run_id or x.get("messageId")
                    if x["type"] == "text-delta":
                        break
            before = await server.store.load_entries("ann:7")
            answer = await c.post("/chat", json=ui_body("ann:7", "second"))
            assert answer.status_code == 409 and answer.json()["run_id"] == run_id
            answer = await c.post("/chat/ann:7/runs", json={"text": "second"})
            assert answer.status_code == 409 and run_id in answer.json()["error"]
            assert own_only(before, await server.store.load_entries("ann:7"))
            _set_on_server(server, "ann:7", gate)


def test_s56_the_app_mounts_in_a_host_application(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    store = FileStore(tmp_path / "s")
    chat = web.create_app(store, durable.model(slow_model(2)), sessions=Users())
    host = Starlette(routes=[Mount("/api", chat)])

    async def talk(url: str) -> list[str]:
        async with httpx2.AsyncClient(base_url=url, headers=ANN) as c, \
                c.stream("POST", "/api/chat", json=ui_body("ann:8", "hi")) as r:
            return [x["type"] async for x in chunks(r)]

    with serve(host) as url:
        assert asyncio.run(talk(url))[-1] == "finish"
    assert json.loads(json.dumps(web.HEADERS))["x-vercel-ai-ui-message-stream"] == "v1"
