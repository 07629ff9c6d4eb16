"""Sessions the viewer tests browse: an ordinary branched and forked chat,
and one whose every field is an XSS payload."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

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
    FileStore,
    MessageEntry,
    SessionRecord,
)

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
