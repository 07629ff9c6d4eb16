"""Serving chats (``threadline.web``): per-delta cost, rejoin latency, many streams at once.

- delta: the server's CPU per streamed delta of a rejoinable stream (``POST
  /chat`` of ``threadline.web``: a live run, its frames, its partials, the UI
  message stream) against a bare SSE relay of the same run's deltas (a
  Starlette endpoint iterating ``agent.run`` and writing each text delta as a
  UI chunk). Memory store, 2,000 deltas a reply; the server thread's own CPU
  clock, read around each request.
- rejoin: a client rejoins, through another store handle (as another server
  process would), a run streaming elsewhere, with a cursor whose next delta
  is already stored: time from ``follow(after=...)`` to that delta, against
  the store's own ``watch`` delivery p50 in the same run (a writer on one
  handle, the watch on another).
  Twice: the deltas in a burst (the stream writes what has come at once) and
  each alone (the model lets the loop run between two, so every delta is a
  write of its own in both).
- streams: 100 streams at once on one server process (file store, fsync),
  each a reply of 100 words 20 ms apart read over HTTP by a client in another
  process: the event loop's lag (a 10 ms ticker's overshoot) p99.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import statistics
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from bench._harness import Run, at_most, pct
from threadline import durable, web
from threadline.agent import MessageUpdate
from threadline.ai import (
    AssistantMessage,
    DoneEvent,
    ModelInfo,
    Request,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDelta,
    TextEnd,
    TextPart,
    TextStart,
    UserMessage,
)
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, MemoryStore, SQLiteStore, Store
from threadline.testing import Delay, ScriptedModel, Text, Turn

NEEDS = ("import:starlette,uvicorn,httpx2",)
MINUTES = 3


class _Everyone:
    def __contains__(self, session_id: object) -> bool:
        return True


def _everyone(request: Any) -> _Everyone:
    return _Everyone()


class _Server:
    """``app`` on uvicorn on 127.0.0.1, in a thread with an event loop of its own."""

    def __init__(self, app: Any) -> None:
        import socket

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(self.server.serve()), daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def cpu(self) -> float:
        """The server thread's CPU seconds so far."""
        assert self.thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _bare_relay(store: Store, factory: durable.Factory) -> Any:
    """The floor: the same run's text deltas written as UI chunks, nothing kept."""
    import msgspec
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    encode = msgspec.json.Encoder().encode

    async def chat(request: Request) -> StreamingResponse:
        body = msgspec.json.decode(await request.body())
        agent = await durable.open(factory, store=store, session_id=body["id"])

        async def stream() -> Any:
            async with agent.run(UserMessage.of("go")) as events:
                async for event in events:
                    if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                        yield b"data: " + encode({"type": "text-delta", "id": "0",
                                                  "delta": event.event.delta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), headers=web.HEADERS)

    return Starlette(routes=[Route("/chat", chat, methods=["POST"])])


class _Paced:
    """A model that streams ``n`` deltas of one text block, ``pause`` seconds apart
    (``0``: it lets the event loop run between two, as a network read does)."""

    def __init__(self, n: int, pause: float) -> None:
        self.n, self.pause = n, pause

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(provider="bench", id="paced")

    async def stream(self, request: Request, options: StreamOptions | None = None
                     ) -> AsyncIterator[StreamEvent]:
        abort = options.abort if options is not None else None
        yield StartEvent(model="paced", provider="bench")
        yield TextStart(index=0)
        parts = []
        for i in range(self.n):
            await asyncio.sleep(self.pause)
            if abort is not None and abort.is_set():
                break
            parts.append(f"d{i} ")
            yield TextDelta(index=0, delta=parts[-1])
        text = "".join(parts)
        yield TextEnd(index=0, text=text)
        yield DoneEvent(message=AssistantMessage(content=(TextPart(text=text),),
                                                 model="paced", provider="bench"))


def delta_cost(run: Run, *, paced: bool) -> None:
    import httpx2

    n, turns = run.pick(2000, 200), run.pick(15, 2)
    if paced:
        model: Any = _Paced(n, 0)
        how = "each delta alone (the loop runs between two)"
    else:
        model = ScriptedModel([Turn(Text(*(f"d{i} " for i in range(n))))] * (4 * turns + 4))
        how = "deltas in a burst (the stream writes what is there at once)"
    store = MemoryStore()
    factory = durable.model(model)
    apps = {"rejoinable": web.create_app(store, factory, sessions=_everyone),
            "bare": _bare_relay(store, factory)}
    servers = {name: _Server(app) for name, app in apps.items()}
    cpu: dict[str, list[float]] = {name: [] for name in apps}
    counter = iter(range(10**9))
    with httpx2.Client(timeout=60) as client:
        for k in range(-1, turns):
            for name in (list(apps) if k % 2 else list(apps)[::-1]):
                server = servers[name]
                body = {"id": f"s{next(counter)}", "trigger": "submit-message",
                        "messages": [{"id": "u", "role": "user",
                                      "parts": [{"type": "text", "text": "go"}]}]}
                c0 = server.cpu()
                with client.stream("POST", f"{server.url}/chat", json=body) as response:
                    for _ in response.iter_bytes():
                        pass
                if k >= 0:
                    cpu[name].append((server.cpu() - c0) / n)
    for server in servers.values():
        server.close()
    ratios = [a / b for a, b in zip(cpu["rejoinable"], cpu["bare"], strict=True)]
    run.row(f"server CPU per delta, rejoinable stream (threadline.web POST /chat), {how}",
            statistics.median(cpu["rejoinable"]) * 1e6, "µs",
            versus="a bare SSE relay of the same run's deltas, same run",
            versus_value=statistics.median(cpu["bare"]) * 1e6,
            ratio=statistics.median(ratios), goal=at_most(1.5),
            detail=f"median of {turns} paired turns of {n} deltas; memory store")


def _open(kind: str, target: str, schema: str) -> Store:
    if kind == "file":
        return FileStore(target)
    if kind == "sqlite":
        return SQLiteStore(target)
    from threadline.stores import PostgresStore

    return PostgresStore(target, schema=schema, max_size=4)


async def _watch_p50(writer: Store, reader: Store, count: int) -> float:
    from threadline.stores import WatchableStore

    sid = f"watch-{secrets.token_hex(4)}"
    await writer.create_session(SessionRecord(id=sid))
    assert isinstance(reader, WatchableStore)
    started: dict[str, float] = {}
    delivered: list[float] = []
    watch = reader.watch(sid)

    async def follow() -> None:
        async for entry in watch:
            delivered.append(time.perf_counter() - started[entry.id])
            if len(delivered) == count:
                return

    following = asyncio.ensure_future(follow())
    await asyncio.sleep(0.05)
    parent = None
    for i in range(count):
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"entry {i}"))
        started[entry.id] = time.perf_counter()
        await writer.append_entries(sid, [entry])
        parent = entry.id
        await asyncio.sleep(0.01)
    await asyncio.wait_for(following, 60)
    await watch.aclose()  # type: ignore[attr-defined]
    return pct(delivered, 0.5)


async def _rejoins(owner: durable.LiveRuns, other: durable.LiveRuns, count: int) -> list[float]:
    """Start a run on ``owner``; rejoin it ``count`` times through ``other``."""
    sid = f"rejoin-{secrets.token_hex(4)}"
    run = await owner.start(sid, "go")
    got: list[float] = []
    seen = 0
    while len(got) < count and run.closed is None:
        stored = [f for f in run.frames if f.type == "part"]
        if len(stored) < seen + 4:
            await asyncio.sleep(0.005)
            continue
        seen = len(stored)
        # A cursor whose next piece is stored: two pieces back from the newest flushed.
        entries = await other.store.load_entries(sid)
        flushed = sum(len(e.data.pieces) for e in entries
                      if getattr(e, "kind", "") == "threadline.partial"
                      and isinstance(e.data, durable.Partial))
        if flushed < 3:
            continue
        cursor = f"{run.run_id}.0.{flushed - 3}"
        t0 = time.perf_counter()
        frames = other.follow(sid, after=cursor)
        await anext(frames)
        got.append(time.perf_counter() - t0)
        await frames.aclose()  # type: ignore[attr-defined]
    await owner.stop(sid)
    await run.wait()
    return got


def rejoin(run: Run) -> None:
    count = run.pick(60, 8)
    stores = [("file", str(run.tmp / "files"), ""), ("sqlite", str(run.tmp / "r.db"), "")]
    schema = f"tl_bench_web_{secrets.token_hex(4)}"
    if run.postgres():
        stores.append(("postgres", run.pg_url, schema))
    model = ScriptedModel([Turn(*[b for i in range(4000) for b in (Delay(0.002),
                                                                    Text(f"w{i} "))])] * 10)
    try:
        for kind, target, sch in stores:
            async def measure(kind: str = kind, target: str = target,
                              sch: str = sch) -> tuple[float, list[float]]:
                a, b = _open(kind, target, sch), _open(kind, target, sch)
                watch = await _watch_p50(a, b, count)
                owner = durable.LiveRuns(a, durable.model(model), flush_interval=0.05)
                other = durable.LiveRuns(b, durable.model(model), flush_interval=0.05)
                times = await _rejoins(owner, other, count)
                for s in (a, b):
                    await s.close()  # type: ignore[attr-defined]
                return watch, times

            watch, times = asyncio.run(measure())
            run.row(f"rejoin to the first missed delta, {kind} store, through another handle",
                    pct(times, 0.5) * 1e3, "ms",
                    versus="the store's watch delivery p50, same run",
                    versus_value=watch * 1e3, goal=at_most(2.0),
                    detail=f"{len(times)} rejoins; p99 {pct(times, 0.99) * 1e3:.1f} ms")
    finally:
        if run.postgres():
            from bench.disk import drop_schema

            drop_schema(run.pg_url, schema)


def _clients(url: str, count: int, out: Any) -> None:
    """``count`` streams at once, read with bare sockets (HTTP/1.1, one request each) so
    the clients take as little of the machine as they can; the pieces each one got."""
    host, port = url.removeprefix("http://").split(":")

    async def one(n: int) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"text": "go"}'
        writer.write(b"POST /chat/s%d/runs HTTP/1.1\r\nhost: %s\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                     % (n, host.encode(), len(body)) + body)
        data = bytearray()
        while chunk := await reader.read(65536):
            data += chunk
        writer.close()
        return data.count(b"event: part\n")

    async def main() -> None:
        out.put(await asyncio.gather(*(one(n) for n in range(count))))

    asyncio.run(main())


def streams(run: Run) -> None:
    count, words = run.pick(100, 20), run.pick(100, 20)
    model = _Paced(words, 0.02)
    store = FileStore(run.tmp / "streams")
    app = web.create_app(store, durable.model(model), sessions=_everyone)
    server = _Server(app)
    lags: list[float] = []
    stop = threading.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - t0 - 0.01)

    ticking = asyncio.run_coroutine_threadsafe(ticker(), server.loop)
    time.sleep(run.pick(3.0, 1.0))  # the same server idle: the machine's own share of lag
    idle, lags[:] = list(lags), []
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    clients = ctx.Process(target=_clients, args=(server.url, count, out))
    t0, c0 = time.perf_counter(), server.cpu()
    clients.start()
    got = out.get(timeout=600)
    seconds, cpu = time.perf_counter() - t0, server.cpu() - c0
    clients.join()
    stop.set()
    ticking.result(30)
    server.close()
    if min(got) < words + 2:  # the block's start, a piece a word, its end
        raise RuntimeError(f"a stream missed pieces: {min(got)} of {words + 2}")
    run.row(f"event-loop lag p99, {count} streams at once on one process (file store)",
            pct(lags, 0.99) * 1e3, "ms", versus="the same server idle, same run",
            versus_value=pct(idle, 0.99) * 1e3, goal=at_most(50, on="value"),
            detail=f"{count} replies of {words} words 20 ms apart in {seconds:.1f} s; "
            f"lag p50 {pct(lags, 0.5) * 1e3:.2f} ms over {len(lags)} ticks; server "
            f"thread CPU {cpu:.2f} s; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores")


def main(run: Run) -> None:
    delta_cost(run, paced=False)
    delta_cost(run, paced=True)
    rejoin(run)
    streams(run)

