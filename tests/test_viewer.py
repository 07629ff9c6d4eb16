"""S29: the viewer and the HTML export escape everything and run nothing
from a transcript; the viewer is read-only, serves only the store, answers
only on localhost, and its live stream resumes where it left off.

Checked three ways: on the HTML with a parser, over HTTP against a real
``threadline serve`` child process, and in a real browser (Debian's chromium,
driven by Playwright). In the browser a detector is installed before any
page script runs: the payloads set ``window.__pwned`` or call ``alert``, and
every CSP violation is recorded. A page passes when nothing ran and nothing
was even blocked (the escaping held on its own), while a script the test
injects on purpose is blocked by the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from support.viewer import (
    CHAT,
    FORK,
    HOSTILE,
    PAYLOADS,
    Page,
    append_from_child,
    assert_nothing_ran,
    browser,
    build_chat,
    build_hostile,
    http_get,
    in_thread,
    page,
    start_server,
    stop,
)
from threadline.ai import AssistantMessage, TextPart, ToolCall, ToolResultMessage, UserMessage
from threadline.session import Entry, MessageEntry, SessionRecord, TreeIndex
from threadline.stores import FileStore, MemoryStore
from threadline.viewer import render_html, serve
from threadline.viewer._server import CSP

__all__ = ["browser", "page"]  # the fixtures, imported for these tests

# The picture in docs/viewer.md. CI writes it as an artifact; elsewhere set
# THREADLINE_SCREENSHOT=1 to refresh it (a plain test run leaves docs alone).
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "viewer.png"


# --- helpers -------------------------------------------------------------------


def _visible(text: str) -> str:
    """How the page draws control characters."""
    return "".join(chr(0x2400 + ord(c)) if ord(c) < 32 and c not in "\t\n" else c
                   for c in text)


def _assert_inert(doc: str) -> Page:
    page = Page(doc)
    for tag, attrs in page.tags:
        assert tag not in {"iframe", "object", "embed", "base", "svg", "math", "form",
                           "textarea", "body", "meta"} or (tag, attrs.get("http-equiv")) in {
            ("meta", None), ("meta", "Content-Security-Policy"), ("body", None),
            ("form", None)}, (tag, attrs)
        if tag == "script":
            assert attrs == {"src": "/static/viewer.js", "defer": None}
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, attrs)
            if name in ("href", "src", "action"):
                assert value is not None
                ok = (value.startswith(("#", "/session?id=", "/?", "/static/viewer."))
                      or value in ("/", "/session", "/search", "data:,")
                      or value.startswith(("data:image/png;base64,",)))
                assert ok, (tag, name, value)
    text = "".join(page.text)
    for payload in PAYLOADS:
        assert _visible(payload).strip() in text or payload.strip() in text, payload
    return page


def _events(url: str, path: str, count: int,
            headers: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The first ``count`` SSE events of ``path`` (fields id, event, data)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("content-type", "").startswith("text/event-stream")
        out: list[dict[str, str]] = []
        event: dict[str, str] = {}
        while len(out) < count:
            line = resp.readline().decode("utf-8")
            assert line, "stream ended early"
            line = line.rstrip("\n")
            if not line:
                if "event" in event:
                    out.append(event)
                event = {}
                continue
            name, _, value = line.partition(": ")
            event[name] = value
        return out
    finally:
        conn.close()


def _tree_bytes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("viewer") / "store"
    in_thread(build_chat(root))
    in_thread(build_hostile(root))
    return root


@pytest.fixture(scope="module")
def server(store_root: Path) -> Iterator[str]:
    proc, url = start_server(store_root)
    try:
        yield url
    finally:
        stop(proc)


async def _entries(root: Path, sid: str) -> list[Entry]:
    store = FileStore(root)
    try:
        return await store.load_entries(sid)
    finally:
        await store.close()


# --- the HTML itself ------------------------------------------------------------


def test_s29_export_html_escapes_every_field_and_loads_nothing(store_root: Path) -> None:
    entries = in_thread(_entries(store_root, HOSTILE))
    record = SessionRecord(id=HOSTILE, parent_id=PAYLOADS[0])
    doc = render_html(TreeIndex(entries, session_id=HOSTILE), record,
                      [SessionRecord(id=PAYLOADS[1], parent_id=HOSTILE)])
    page = _assert_inert(doc)
    assert not any(tag == "script" for tag, _ in page.tags)
    csp = next(a["content"] for t, a in page.tags if a.get("http-equiv") ==
               "Content-Security-Policy")
    assert csp is not None and "default-src 'none'" in csp and "script-src" not in csp
    # The only style the page may apply is its own, admitted by its hash.
    import base64
    (style,) = page.styles
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in csp
    # Lineage is named, never linked: the export has no other pages.
    assert not any(a.get("href", "").startswith("/session") for _, a in page.tags)


def test_s29_tool_results_pair_with_the_call_on_their_own_branch() -> None:
    """Two branches reuse the call id c1; each call shows its own branch's result."""
    u = MessageEntry(id="u", message=UserMessage.of("q"))
    calls = [MessageEntry(id=f"a{i}", parent_id="u", message=AssistantMessage(
        content=(ToolCall(id="c1", name="look", arguments={"n": i}),), stop_reason="tool_use"))
        for i in (1, 2)]
    r1 = MessageEntry(id="r1", parent_id="a1", message=ToolResultMessage(
        tool_call_id="c1", tool_name="look", content=(TextPart(text="one"),)))
    r2 = MessageEntry(id="r2", parent_id="a2", message=ToolResultMessage(
        tool_call_id="c1", tool_name="look", content=(TextPart(text="two"),), is_error=True))
    stray = MessageEntry(id="s", parent_id="u", message=ToolResultMessage(
        tool_call_id="c1", tool_name="look", content=(TextPart(text="stray"),)))
    doc = render_html(TreeIndex([u, *calls, r1, r2, stray], session_id="s"))

    def block(start: str) -> str:
        i = doc.rindex("<details", 0, doc.index(start))
        return doc[i:doc.index("</details>", i)]

    first, second = block('id="t-a1-0"'), block('id="t-a2-0"')
    assert 'class="tool ok"' in first and "one" in first and 'href="#e-r1"' in first
    assert 'class="tool error"' in second and "two" in second and 'href="#e-r2"' in second
    assert "stray" not in first + second
    assert "no matching call on this branch" in doc  # the stray result is shown on its own


def test_s29_pending_interrupted_folded_and_unknown_kinds_are_shown(store_root: Path) -> None:
    entries = in_thread(_entries(store_root, CHAT))
    doc = render_html(TreeIndex(entries, session_id=CHAT), custom=True)
    assert 'class="tool interrupted"' in doc and 'class="tool ok"' in doc
    assert doc.count("in summary</span>") == 4  # the first question and its tool round trip
    assert "custom · tool_ledger.approval" in doc and "agent-7" in doc
    assert "What the model sees" in doc and "condensed into the summary" in doc
    pending = render_html(TreeIndex([MessageEntry(id="a", message=AssistantMessage(
        content=(ToolCall(id="c", name="slow"),), stop_reason="tool_use"))], session_id="p"))
    assert 'class="tool pending"' in pending
    # A struct built in memory is not type-checked: a bad state word stays out.
    forged = ToolResultMessage(tool_call_id="c", tool_name="t",
                               synthesized='"><script>x</script>')  # type: ignore[arg-type]
    doc = render_html(TreeIndex([MessageEntry(id="a", message=AssistantMessage(
        content=(ToolCall(id="c", name="t"),), stop_reason="tool_use")),
        MessageEntry(id="r", parent_id="a", message=forged)], session_id="f"))
    assert "<script>" not in doc and 'class="tool synthesized"' in doc


def test_s29_deep_and_cyclic_logs_render_without_recursion() -> None:
    chain = [MessageEntry(id="0", message=UserMessage.of("start"))]
    chain += [MessageEntry(id=str(i), parent_id=str(i - 1), message=UserMessage.of(str(i)))
              for i in range(1, 20_000)]
    # Every tenth entry also gets a sibling: thousands of nested forks.
    chain += [MessageEntry(id=f"b{i}", parent_id=str(i), message=UserMessage.of("alt"))
              for i in range(0, 20_000, 10)]
    cycle = [MessageEntry(id="x", parent_id="y", message=UserMessage.of("x")),
             MessageEntry(id="y", parent_id="x", message=UserMessage.of("y"))]
    doc = render_html(TreeIndex(chain + cycle, session_id="deep"), per_page=None)
    # The tree shows all but the cycle; the model view shows the leaf's path,
    # which is the cycle (y was appended last).
    assert doc.count('<article class="entry') == 22_000 + 2
    assert "2 entries form a cycle" in doc


def test_s29_export_html_needs_no_viewer_extra(store_root: Path) -> None:
    """``export --format html`` runs with Starlette and uvicorn unimportable."""
    code = ("import sys\n"
            "sys.modules.update(starlette=None, uvicorn=None)\n"
            "from threadline.cli import main\n"
            "main(sys.argv[1:])\n")
    out = subprocess.run([sys.executable, "-c", code, "--store", str(store_root), "export",
                          CHAT, "--format", "html"], capture_output=True, check=True,
                         timeout=60)
    assert out.stdout.startswith(b"<!doctype html>") and b"support-4711-retry" in out.stdout
    serve_run = subprocess.run([sys.executable, "-c", code, "--store", str(store_root),
                                "serve"], check=False, capture_output=True, text=True,
                               timeout=60)
    assert serve_run.returncode == 1
    # (The hint's [viewer] is eaten by the CLI's rich markup until h5-cli's rewrite.)
    assert "needs the viewer extra" in serve_run.stderr and "Traceback" not in serve_run.stderr


# --- the server ------------------------------------------------------------------


def test_s29_every_response_sends_the_security_headers(server: str) -> None:
    paths = ["/", "/?q=support", f"/session?id={CHAT}", "/session?id=nope", "/nope",
             "/static/viewer.css", "/static/viewer.js", "/session", "/?limit=x",
             f"/session?id={quote(HOSTILE, safe='')}"]
    statuses = []
    for path in paths:
        status, headers, _ = http_get(server, path)
        statuses.append(status)
        assert headers["content-security-policy"] == CSP, path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"
    assert statuses == [200, 200, 200, 404, 404, 200, 200, 400, 400, 200]
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP


def test_s29_pages_escape_every_field(server: str) -> None:
    status, _, body = http_get(server, f"/session?id={quote(HOSTILE, safe='')}")
    assert status == 200
    _assert_inert(body.decode())
    status, _, body = http_get(server, "/?q=" + quote(HOSTILE, safe=""))
    assert status == 200 and body.count(b'class="sid" href=') >= 2
    Page(body.decode())
    status, _, body = http_get(server, "/session?id=" + quote(PAYLOADS[0], safe=""))
    assert status == 404 and b"<script>" not in body and b"&lt;script&gt;" in body


def test_s29_the_viewer_is_read_only(server: str, store_root: Path) -> None:
    before = _tree_bytes(store_root)
    for path in ("/", f"/session?id={CHAT}", f"/events?id={CHAT}", "/static/viewer.js"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, _ = http_get(server, path, method=method)
            assert status == 405, (method, path)
            assert headers["content-security-policy"] == CSP
    assert _tree_bytes(store_root) == before


def test_s29_session_ids_cannot_reach_files_outside_the_store(server: str,
                                                              store_root: Path) -> None:
    outside = store_root.parent / "outside.jsonl"
    outside.write_bytes((store_root / f"{CHAT}.jsonl").read_bytes()
                        .replace(CHAT.encode(), b"outside") + b"")
    secret = store_root.parent / "secret.txt"
    secret.write_text("TOP-SECRET")
    for sid in ("../outside", "..%2Foutside", str(store_root.parent / "outside"),
                "../outside.jsonl", "..\\outside", "/etc/passwd", "../secret.txt",
                "%00", "....//outside"):
        status, _, body = http_get(server, "/session?id=" + quote(sid, safe=""))
        assert status in (400, 404), sid
        assert b"My order #4711" not in body and b"TOP-SECRET" not in body
    for path in ("/static/../secret.txt", "/static/%2e%2e/secret.txt", "/../secret.txt",
                 "/static/viewer.js/../../secret.txt", "/static/"):
        status, _, body = http_get(server, path)
        assert status == 404, path
        assert b"TOP-SECRET" not in body


def test_s29_a_foreign_host_header_is_refused(server: str) -> None:
    port = urlsplit(server).port
    assert http_get(server, "/", headers={"Host": "evil.example"})[0] == 400
    assert http_get(server, "/", headers={"Host": f"attacker.test:{port}"})[0] == 400
    assert http_get(server, "/", headers={"Host": f"localhost:{port}"})[0] == 200


def test_s29_it_listens_on_loopback_only_by_default(server: str) -> None:
    parts = urlsplit(server)
    assert parts.hostname == "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: it picks a route
        own = probe.getsockname()[0]
    except OSError:
        own = "127.0.0.1"
    finally:
        probe.close()
    if own.startswith("127."):
        pytest.skip("this machine has no non-loopback address to probe")
    with pytest.raises(OSError):
        socket.create_connection((own, parts.port), timeout=5).close()


def test_s29_events_resume_after_the_last_event_id(server: str, store_root: Path) -> None:
    entries = in_thread(_entries(store_root, CHAT))
    ids = [e.id for e in entries]
    got = _events(server, f"/events?id={CHAT}", len(ids))
    assert [unquote(e["id"]) for e in got] == ids
    assert [json.loads(e["data"])["id"] for e in got] == ids
    # A reconnect names the last id it saw; the header wins over ?after=.
    got = _events(server, f"/events?id={CHAT}&after={ids[0]}", 3,
                  headers={"Last-Event-ID": quote(ids[5], safe="")})
    assert [unquote(e["id"]) for e in got] == ids[6:9]
    got = _events(server, f"/events?id={CHAT}&after={quote(ids[-2], safe='')}", 1)
    assert unquote(got[0]["id"]) == ids[-1]


def test_s29_event_ids_carry_any_entry_id(server: str, store_root: Path) -> None:
    entries = in_thread(_entries(store_root, HOSTILE))
    sid = quote(HOSTILE, safe="")
    got = _events(server, f"/events?id={sid}", len(entries))
    assert [unquote(e["id"]) for e in got] == [e.id for e in entries]
    # Resuming from an id with quotes, angle brackets and spaces.
    got = _events(server, f"/events?id={sid}", 1, headers={"Last-Event-ID": got[2]["id"]})
    assert unquote(got[0]["id"]) == entries[3].id


def test_s29_events_bring_an_append_from_another_process(server: str,
                                                        store_root: Path) -> None:
    entries = in_thread(_entries(store_root, FORK))
    parts = urlsplit(server)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", f"/events?id={FORK}&after={quote(entries[-1].id, safe='')}")
        resp = conn.getresponse()
        assert resp.readline() == b"retry: 1000\n"
        append_from_child(store_root, FORK, "appended elsewhere")
        lines = [resp.readline() for _ in range(4)]
    finally:
        conn.close()
    new = in_thread(_entries(store_root, FORK))[-1]
    assert lines[1] == f"id: {quote(new.id, safe='')}\n".encode()
    assert json.loads(lines[3].removeprefix(b"data: "))["parent_id"] == entries[-1].id


class _WatchingStore(MemoryStore):
    """A store offering ``watch``: it wakes the stream on each append itself."""

    def __init__(self) -> None:
        super().__init__()
        self.watch_calls: list[tuple[str, str | None]] = []
        self._changed = asyncio.Event()

    async def append_entries(self, session_id: str, entries: Any) -> None:
        await super().append_entries(session_id, entries)
        self._changed.set()

    async def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        self.watch_calls.append((session_id, after))
        sent = 0
        entries = await self.load_entries(session_id)
        if after is not None:
            sent = next(i + 1 for i, e in enumerate(entries) if e.id == after)
        while True:
            for entry in entries[sent:]:
                yield entry
            sent = len(entries)
            self._changed.clear()
            await self._changed.wait()
            entries = await self.load_entries(session_id)


class _InThread:
    """``viewer.serve`` on its own event loop in a thread, for stores that live in
    this process; ``call`` runs a coroutine on that loop."""

    def __init__(self, store: Any, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.store = store
        self.options = options
        self.url = ""

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def __enter__(self) -> _InThread:
        self.thread.start()
        ready = threading.Event()

        def ready_at(url: str) -> None:
            self.url = url
            ready.set()

        async def start() -> asyncio.Task[None]:
            return asyncio.create_task(serve(self.store, port=0, ready=ready_at,
                                             **self.options))

        self.task = self.call(start())
        assert ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


async def _two_entries(store: Any) -> None:
    await store.create_session(SessionRecord(id="w"))
    await store.append_entries("w", [MessageEntry(id="m1", message=UserMessage.of("a")),
                                     MessageEntry(id="m2", parent_id="m1",
                                                  message=UserMessage.of("b"))])


def test_s29_events_follow_the_store_watch_when_it_has_one() -> None:
    store = _WatchingStore()
    # Polling once an hour: only watch can bring the new entry in time.
    with _InThread(store, poll_interval=3600) as server:
        server.call(_two_entries(store))
        parts = urlsplit(server.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/events?id=w", headers={"Last-Event-ID": "m1"})
        resp = conn.getresponse()
        assert resp.readline() == b"retry: 1000\n"
        assert resp.readline() == b"\n"
        assert resp.readline() == b"id: m2\n"
        for _ in range(3):
            resp.readline()
        server.call(store.append_entries("w", [MessageEntry(
            id="m3", parent_id="m2", message=UserMessage.of("c"))]))
        assert resp.readline() == b"id: m3\n"
        conn.close()
        assert store.watch_calls == [("w", "m1")]


class _ThreeMethodStore:
    """A store with only the contract's three methods, which records every call
    and refuses to be written to once the viewer runs."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.calls: list[str] = []
        self.frozen = False

    async def create_session(self, record: SessionRecord) -> None:
        self.calls.append("create_session")
        assert not self.frozen
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        self.calls.append("load_entries")
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Any) -> None:
        self.calls.append("append_entries")
        assert not self.frozen
        await self.inner.append_entries(session_id, entries)


def test_s29_a_store_with_only_the_contract_is_browsed_and_never_written() -> None:
    store = _ThreeMethodStore()
    with _InThread(store, poll_interval=0.05) as server:
        server.call(_two_entries(store))
        store.frozen = True
        store.calls.clear()
        status, _, body = http_get(server.url, "/")
        assert status == 200 and b"cannot list its sessions" in body
        status, _, body = http_get(server.url, "/session?id=w")
        assert status == 200 and body.count(b'<article class="entry') == 4
        assert http_get(server.url, "/session?id=nope")[0] == 404
        got = _events(server.url, "/events?id=w&after=m1", 1)
        assert got[0]["id"] == "m2"
        for method in ("POST", "PUT", "DELETE"):
            assert http_get(server.url, "/session?id=w", method=method)[0] == 405
    assert set(store.calls) == {"load_entries"}


def test_s29_the_list_pages_newest_first_and_filters_by_id(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    async def setup() -> None:
        store = FileStore(tmp_path)
        base = datetime(2026, 1, 1, tzinfo=UTC)
        for i in range(7):
            name = f"{'even' if i % 2 == 0 else 'odd'}-{i}"
            await store.create_session(SessionRecord(id=name, created_at=base
                                                     + timedelta(minutes=i)))
        await store.close()

    in_thread(setup())
    proc, url = start_server(tmp_path)
    try:
        def ids(body: bytes) -> list[str]:
            page = Page(body.decode())
            return [unquote(a["href"].removeprefix("/session?id="))  # type: ignore[union-attr]
                    for t, a in page.tags if t == "a" and a.get("class") == "sid"]

        def next_link(body: bytes) -> str | None:
            page = Page(body.decode())
            return next((a["href"] for t, a in page.tags if a.get("rel") == "next"), None)

        seen: list[str] = []
        path: str | None = "/?limit=3"
        while path is not None:
            status, _, body = http_get(url, path)
            assert status == 200
            seen += ids(body)
            path = next_link(body)
        assert seen == [f"{'even' if i % 2 == 0 else 'odd'}-{i}" for i in range(6, -1, -1)]
        seen = []
        path = "/?limit=2&q=even"
        while path is not None:
            status, _, body = http_get(url, path)
            seen += ids(body)
            path = next_link(body)
        assert seen == ["even-6", "even-4", "even-2", "even-0"]
        assert b"no sessions match" in http_get(url, "/?q=nothing")[2]
    finally:
        stop(proc)


def test_s29_serve_refuses_a_port_in_use(store_root: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", "from threadline.cli import main; main()",
                              "--store", str(store_root), "serve", "--port", str(port)],
                             check=False, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


# --- in a real browser --------------------------------------------------------------


def test_s29_the_detector_sees_a_script_that_runs(page: Any, tmp_path: Path) -> None:
    """The checks below would catch a payload that ran, or one the CSP blocked."""
    ran = tmp_path / "ran.html"
    ran.write_text('<img src="data:," onerror="window.__pwned = 1">')
    page.goto(ran.as_uri())
    page.wait_for_function("window.__pwned === 1")
    blocked = tmp_path / "blocked.html"
    blocked.write_text('<meta http-equiv="Content-Security-Policy" content="script-src \'none\'">'
                       "<script>alert(1)</script>")
    page.goto(blocked.as_uri())
    page.wait_for_function("window.__csp.length === 1")
    assert page.evaluate("window.__pwned") == 0


def test_s29_browser_opens_the_list_and_navigates_branches_and_forks(
    page: Any, server: str, tmp_path: Path
) -> None:
    page.goto(server)
    assert page.title() == "threadline sessions"
    rows = page.locator("table.sessions tbody tr")
    assert rows.count() == 4
    page.get_by_role("link", name=CHAT, exact=True).first.click()
    page.wait_for_selector("#live-state.on")
    assert page.locator("h1 code.sid").inner_text() == CHAT
    # Two branches from the first question; the active one is open.
    branches = page.locator("details.branch")
    assert branches.count() == 2
    active = page.locator("details.branch.active")
    assert active.get_attribute("open") is not None
    other = page.locator("details.branch:not(.active)")
    assert other.get_attribute("open") is None
    hidden = other.locator("pre.text", has_text="Could you share the e-mail address")
    assert not hidden.is_visible()
    other.locator("summary").click()
    assert hidden.is_visible()
    # A tool call opens onto its arguments and its result.
    tool = page.locator("details.tool.ok").first
    assert not tool.get_by_text("shipped 2026-11-28").is_visible()
    tool.locator("summary").click()
    assert tool.get_by_text("shipped 2026-11-28, DHL 00340434").is_visible()
    assert page.locator("details.tool.interrupted .badge").first.inner_text() == "interrupted"
    # Compaction: stored entries folded into the summary, and the model's view.
    assert page.locator("#tree .entry.folded").count() == 4
    assert page.locator("#context").get_by_text("condensed into the summary").is_visible()
    assert page.get_by_text("custom · tool_ledger.approval").count() == 0
    page.get_by_role("link", name="show custom entries").click()
    page.wait_for_selector("#live-state.on")
    assert page.get_by_text("custom · tool_ledger.approval").is_visible()
    page.get_by_role("link", name="hide custom entries").click()
    page.wait_for_selector("#live-state.on")
    assert_nothing_ran(page)
    page.locator("details.branch:not(.active) summary").click()  # close it again
    # Only on request: the suite never writes into the checkout by itself.
    keep = os.environ.get("THREADLINE_SCREENSHOT", "").lower() in ("1", "true")
    shot = SCREENSHOT if keep else tmp_path / "viewer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    # Fork lineage: to the child and back to the parent.
    page.get_by_role("link", name=FORK).click()
    page.wait_for_url(f"**/session?id={FORK}")
    assert page.locator(".lineage").inner_text() == f"forked from {CHAT}"
    assert page.get_by_text("jane@example.com").first.is_visible()
    page.locator(".lineage a").click()
    page.wait_for_url(f"**/session?id={CHAT}")
    page.go_back()
    page.get_by_role("link", name="threadline").click()
    page.fill("form.filter input[name=q]", "retry")
    page.get_by_role("button", name="Filter").click()
    assert page.locator("table.sessions tbody tr").count() == 1
    assert_nothing_ran(page)


def test_s29_browser_shows_an_append_from_another_process_live(
    page: Any, server: str, store_root: Path
) -> None:
    page.goto(f"{server}session?id={CHAT}")
    page.wait_for_selector("#live-state.on")
    # Open a branch and a tool call: a live update must leave them as they are.
    page.locator("details.branch:not(.active) summary").click()
    page.locator("details.tool.ok summary").first.click()
    before = page.locator("#tree .entry").count()
    append_from_child(store_root, CHAT, "Sent from <b>another</b> process")
    page.get_by_text("Sent from <b>another</b> process").first.wait_for()
    assert page.locator("#tree .entry").count() == before + 1
    assert page.locator("#context").get_by_text("Sent from <b>another</b> process").is_visible()
    assert page.locator("details.branch:not(.active)").get_attribute("open") is not None
    assert page.locator("details.tool.ok").first.get_attribute("open") is not None
    append_from_child(store_root, CHAT, "and a second one")
    page.get_by_text("and a second one").first.wait_for()
    assert page.locator("#tree .entry").count() == before + 2
    assert_nothing_ran(page)


def test_s29_browser_resumes_the_stream_after_the_server_restarts(
    page: Any, store_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    shutil.copytree(store_root, root)
    proc, url = start_server(root)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    try:
        page.goto(f"{url}session?id={FORK}")
        page.wait_for_selector("#live-state.on")
        stop(proc)  # kill -9: the browser sees the stream drop
        page.wait_for_selector("#live-state:not(.on)")
        append_from_child(root, FORK, "written while the viewer was down")
        proc, url = start_server(root, port)
        page.get_by_text("written while the viewer was down").first.wait_for()
        assert page.locator("#live-state").inner_text() == "live"
    finally:
        stop(proc)


def test_s29_browser_runs_no_script_from_a_hostile_transcript(page: Any, server: str) -> None:
    page.goto(f"{server}session?id={quote(HOSTILE, safe='')}")
    page.wait_for_selector("#live-state.on")
    # Open everything, hover and focus everything: handlers would fire now.
    page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
    for el in page.locator("main pre, main summary, main .sid").all()[:60]:
        el.hover()
    page.keyboard.press("Tab")
    text = page.locator("main").inner_text()
    assert PAYLOADS[0] in text and PAYLOADS[5] in text and "␛[2J" in text
    assert_nothing_ran(page)
    page.goto(f"{server}?q={quote(HOSTILE, safe='')}")
    assert page.locator("table.sessions tbody tr").count() == 2
    assert_nothing_ran(page)
    page.goto(f"{server}session?id={quote(PAYLOADS[1], safe='')}")  # not found, echoed
    assert PAYLOADS[1] in page.locator("main").inner_text()
    assert_nothing_ran(page)


def test_s29_browser_csp_blocks_an_inline_script(page: Any, server: str) -> None:
    page.goto(f"{server}session?id={CHAT}")
    page.evaluate("""() => {
      const s = document.createElement("script");
      s.textContent = "window.__pwned = 1";
      document.body.appendChild(s);
      const i = document.createElement("img");
      i.setAttribute("onerror", "window.__pwned = 3");
      i.src = "data:,";
      document.body.appendChild(i);
    }""")
    page.wait_for_function("window.__csp.length >= 2")
    assert page.evaluate("window.__pwned") == 0
    assert all(v.startswith("script-src") for v in page.evaluate("window.__csp"))


def test_s29_browser_exported_file_runs_no_script(page: Any, store_root: Path,
                                                  tmp_path: Path) -> None:
    async def export() -> str:
        store = FileStore(store_root)
        try:
            entries = await store.load_entries(HOSTILE)
            record = await store.load_session(HOSTILE)
        finally:
            await store.close()
        return render_html(TreeIndex(entries, session_id=HOSTILE), record)

    path = tmp_path / "hostile.html"
    path.write_text(in_thread(export()), encoding="utf-8")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
    for el in page.locator("main pre").all()[:30]:
        el.hover()
    assert PAYLOADS[0] in page.locator("main").inner_text()
    assert page.evaluate("window.__pwned") == 0 and page.dialogs == []
    assert page.evaluate("window.__csp") == []
    assert page.evaluate("document.scripts.length") == 0
    # The inline style applies (admitted by its hash); nothing else was fetched.
    assert page.evaluate("getComputedStyle(document.body).margin") == "0px"
    assert [r for r in requests if not r.startswith(("file:", "data:"))] == []
    # And a script injected later is blocked by the file's own policy.
    page.evaluate("""() => { const s = document.createElement("script");
      s.textContent = "window.__pwned = 1"; document.body.appendChild(s); }""")
    page.wait_for_function("window.__csp.length >= 1")
    assert page.evaluate("window.__pwned") == 0
