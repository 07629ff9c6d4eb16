"""Sessions the viewer tests browse: an ordinary branched and forked chat,
and one whose every field is an XSS payload; the viewer as a child process, an
HTTP client and HTML parser for its pages, and a headless Chromium (the
``browser`` and ``page`` fixtures) that records any script that ran."""

from __future__ import annotations

import asyncio
import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest

from threadline import durable
from threadline.ai import (
    AssistantMessage,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.session import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    MessageEntry,
    SessionRecord,
)
from threadline.stores import FileStore

CHAT = "support-4711"
FORK = "support-4711-retry"

# Each one would set window.__pwned (or call alert) if it ever ran.
PAYLOADS = [
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1;alert(1)">',
    "<svg onload=window.__pwned=1>",
    "<svg><script>window.__pwned=1</script></svg>",
    "javascript:window.__pwned=1",
    '<a href="javascript:window.__pwned=1">click me</a>',
    '" onmouseover="window.__pwned=1" x="',
    "' onfocus='window.__pwned=1' autofocus='",
    "</details><script>window.__pwned=1</script><details>",
    "</pre><script>window.__pwned=1</script><pre>",
    "</style><script>window.__pwned=1</script>",
    "</title><script>window.__pwned=1</script>",
    "</textarea><script>window.__pwned=1</script>",
    '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>',
    "<details open ontoggle=window.__pwned=1>",
    "<body onload=window.__pwned=1>",
    "<meta http-equiv=refresh content='0;url=javascript:window.__pwned=1'>",
    '<base href="javascript:window.__pwned=1//">',
    "<math><mtext></p><script>window.__pwned=1</script>",
    "<!--<script>window.__pwned=1</script>-->",
    "<object data='javascript:window.__pwned=1'></object>",
    "<style>@import 'http://127.0.0.1:9/x.css';</style>",
    "<link rel=stylesheet href=http://127.0.0.1:9/x.css>",
    "\u2028\u2029<script>window.__pwned=1</script>\x00\x1b[2J",
]
HOSTILE = '"><svg onload=window.__pwned=1>'
ALL = " ".join(PAYLOADS)
# A session id may not hold NUL and is at most 1,024 bytes (one rule for every
# store), so the lineage link carries every payload that fits an id.
ALL_ID = ALL.replace("\x00", "").encode()[:1024].decode("utf-8", "ignore")


async def build_chat(root: Path) -> None:
    """A support chat: tool calls (one answered, one interrupted by a crash),
    two branches, a compaction, an unknown custom kind, and a fork."""
    store = FileStore(root)
    try:
        agent = await durable.open(None, store=store, session_id=CHAT)
        u1, = await agent.append(UserMessage.of("My order #4711 hasn't arrived. Where is it?"))
        # A first answer, later abandoned: its branch is forked to try again.
        await agent.append(
            AssistantMessage(content=(TextPart(
                text="Could you share the e-mail address you ordered with?"),),
                model="claude-sonnet-4", provider="anthropic"),
            UserMessage.of("jane@example.com"),
        )
        await agent.fork(FORK)
        agent.branch(u1.id)
        await agent.append(
            AssistantMessage(content=(
                ThinkingPart(thinking="Look the order up before answering."),
                TextPart(text="Let me check the order status."),
                ToolCall(id="call_1", name="lookup_order", arguments={"order_id": "4711"}),
            ), model="gpt-4.1", provider="openai", stop_reason="tool_use"),
            ToolResultMessage(tool_call_id="call_1", tool_name="lookup_order",
                              content=(TextPart(text="shipped 2026-11-28, DHL 00340434"),)),
            AssistantMessage(content=(TextPart(
                text="It shipped on 28 November with DHL (tracking 00340434)."),),
                model="gpt-4.1", provider="openai"),
            UserMessage.of("Please refund it instead."),
            CustomEntry(kind="tool_ledger.approval", data={
                "call_id": "call_2", "tool": "refund", "state": "approved", "by": "agent-7"}),
            AssistantMessage(content=(
                ToolCall(id="call_2", name="refund",
                         arguments={"order_id": "4711", "amount": 39.9}),
            ), model="gpt-4.1", provider="openai", stop_reason="tool_use"),
        )
        # The process dies before the refund's result: reopening repairs the
        # call as interrupted.
        agent = await durable.open(None, store=store, session_id=CHAT)
        kept = next(e for e in agent.entries if isinstance(e, MessageEntry)
                    and isinstance(e.message, UserMessage)
                    and e.message.text.startswith("Please refund"))
        await agent.append(
            CompactionEntry(summary="Customer asked where order #4711 is: shipped on "
                                    "28 Nov with DHL. Now wants a refund.",
                            first_kept_entry_id=kept.id, tokens_before=1830),
            UserMessage.of("Any news on the refund?"),
        )
    finally:
        await store.close()


def _id(n: int) -> str:
    return f"{HOSTILE}{n}"


async def build_hostile(root: Path) -> None:
    """Every field a page shows holds payloads, including ids and kinds."""
    store = FileStore(root)
    try:
        await store.create_session(SessionRecord(id=HOSTILE, parent_id=ALL_ID))
        await store.create_session(SessionRecord(id=HOSTILE + " child", parent_id=HOSTILE))
        entries: list[Any] = [
            MessageEntry(id=_id(1), message=UserMessage(content=(
                TextPart(text=ALL),
                ImagePart(data='x" onerror="window.__pwned=1', mime_type="image/png"),
                ImagePart(data="PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+", mime_type="image/svg+xml"),
                ImagePart(data="iVBORw0KGgo=", mime_type='image/png" onerror="alert(1)'),
            ))),
            MessageEntry(id=_id(2), parent_id=_id(1), message=AssistantMessage(
                content=(ThinkingPart(thinking=ALL), TextPart(text=ALL),
                         ToolCall(id=ALL, name=ALL, arguments={p: p for p in PAYLOADS})),
                model=ALL, provider=ALL, stop_reason="error", error_message=ALL)),
            MessageEntry(id=_id(3), parent_id=_id(2), message=ToolResultMessage(
                tool_call_id=ALL, tool_name=ALL, content=(TextPart(text=ALL),),
                is_error=True, details={"html": ALL})),
            MessageEntry(id=_id(4), parent_id=_id(1), message=ToolResultMessage(
                tool_call_id="nobody", tool_name=ALL, content=(TextPart(text=ALL),))),
            CompactionEntry(id=_id(5), parent_id=_id(3), summary=ALL,
                            first_kept_entry_id=ALL, details=ALL),
            BranchSummaryEntry(id=_id(6), parent_id=_id(5), from_id=ALL, summary=ALL),
            CustomEntry(id=_id(7), parent_id=_id(6), kind=ALL, data={ALL: ALL}),
            CustomMessageEntry(id=_id(8), parent_id=_id(7), kind=ALL,
                               content=(TextPart(text=ALL),), display=False),
        ]
        await store.append_entries(HOSTILE, entries)
        # An entry type this version does not know, written by "a newer version".
        line = msgspec.json.encode({"type": PAYLOADS[2], "id": _id(9), "parent_id": _id(8),
                                    "payload": ALL})
        with store.path_for(HOSTILE).open("ab") as f:
            f.write(line + b"\n")
    finally:
        await store.close()


def append_from_child(root: Path, session_id: str, text: str) -> None:
    """Append one user message from another process, as another writer would."""
    code = (
        "import asyncio, sys\n"
        "from threadline import durable\n"
        "from threadline.ai import UserMessage\n"
        "from threadline.session import FileStore\n"
        "async def main():\n"
        "    store = FileStore(sys.argv[1])\n"
        "    agent = await durable.open(None, store=store, session_id=sys.argv[2])\n"
        "    await agent.append(UserMessage.of(sys.argv[3]))\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root), session_id, text], check=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=60)


def start_server(root: Path, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``threadline serve`` on ``root`` in a child process; returns it and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from threadline.cli import main; main()",
         "--store", str(root), "serve", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"threadline serve did not start: {line!r} {err!r}")
    return proc, line.split(" on ", 1)[1].split(" ", 1)[0]


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate(timeout=30)


def in_thread(coro: Any) -> Any:
    """Run a coroutine to completion on a fresh loop in another thread
    (Playwright's sync API keeps a loop running in the test's thread)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


CHROMIUM = "/usr/bin/chromium"


ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


DETECTOR = """
window.__pwned = 0;
window.__csp = [];
window.alert = window.confirm = window.prompt = () => { window.__pwned = 2; };
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


class Page(HTMLParser):
    """Every tag with its attributes, and the text, as a browser's parser sees them."""

    def __init__(self, doc: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self._in_style = False
        self.feed(doc)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.text).append(data)


def http_get(url: str, path: str, *, method: str = "GET",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = b"" if path.startswith("/events") and resp.status == 200 else resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI installs it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is missing (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.add_init_script(DETECTOR)
    dialogs: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.dialogs = dialogs
    try:
        yield p
    finally:
        context.close()


def assert_nothing_ran(page: Any) -> None:
    assert page.evaluate("window.__pwned") == 0
    assert page.dialogs == []
    assert page.evaluate("window.__csp") == []
    found = page.evaluate("""() => {
      const bad = [];
      for (const el of document.querySelectorAll("*")) {
        for (const a of el.attributes) {
          if (a.name.startsWith("on")) bad.push(el.tagName + " " + a.name);
        }
        const banned = ["IFRAME", "OBJECT", "EMBED", "BASE", "svg", "math"];
        if (banned.includes(el.tagName)) bad.push(el.tagName);
      }
      for (const a of document.querySelectorAll("a[href]")) {
        const own = a.href.startsWith(location.origin + "/") || a.href.startsWith("file:");
        if (!own) bad.push(a.href);
      }
      for (const s of document.scripts) bad.push("script " + (s.src || s.text));
      return bad;
    }""")
    allowed = [f"script {page.url.split('/session')[0].split('?')[0].rstrip('/')}"
               "/static/viewer.js"]
    assert [x for x in found if x not in allowed] == []
