"""``ThreadlineSession`` where the interoperability tests broke it (S31-S33).

``close()`` works called plainly, as the SDK's own sessions are closed, and
awaited; a caller's event loop closed after use leaves nothing behind (no
"Event loop is closed" from a PostgreSQL pool); each item is kept once, as a
message where it is one, and comes back exactly, whatever shape it has.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from threadline.ai import AssistantMessage, ToolResultMessage, UserMessage
from threadline.integrations.openai_agents import ThreadlineSession
from threadline.session import CustomEntry, MessageEntry, encode_entry
from threadline.stores import MemoryStore


def _connections(url: str, app: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (app,)).fetchone()
    return int(row[0]) if row else 0


def _wait_for_no_connections(url: str, app: str) -> None:
    deadline = time.monotonic() + 30
    while _connections(url, app) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections(url, app) == 0


def test_s33_close_called_plainly_closes_the_store(pg_url: str, pg_schema: str) -> None:
    app = f"tl-close-{os.getpid()}-plain"
    session = ThreadlineSession.from_url("c", f"{pg_url}?schema={pg_schema}&application_name={app}")
    asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    assert _connections(pg_url, app) > 0
    result = session.close()  # no await: as SQLiteSession.close() is called
    assert _connections(pg_url, app) == 0
    asyncio.run(result)  # and awaiting what it gave is harmless
    with pytest.raises(Exception, match="closed"):
        asyncio.run(session.get_items())


async def test_s33_close_awaited_or_not_closes_the_store(pg_url: str, pg_schema: str) -> None:
    for form in ("awaited", "dropped"):
        app = f"tl-close-{os.getpid()}-{form}"
        session = ThreadlineSession.from_url(
            form, f"{pg_url}?schema={pg_schema}&application_name={app}")
        await session.add_items([{"role": "user", "content": "hi"}])
        assert _connections(pg_url, app) > 0
        if form == "awaited":
            await session.close()
            assert _connections(pg_url, app) == 0
        else:
            session.close()  # forgotten await: the close still happens, off this loop
            await asyncio.to_thread(_wait_for_no_connections, pg_url, app)


_CLOSED_LOOP = """
import asyncio, gc, sys
from threadline.integrations.openai_agents import ThreadlineSession
from threadline.stores import PostgresStore

store = PostgresStore(sys.argv[1], schema=sys.argv[2])
session = ThreadlineSession("loops", store)
for n in range(3):
    loop = asyncio.new_event_loop()
    loop.run_until_complete(session.add_items([{"role": "user", "content": f"turn {n}"}]))
    items = loop.run_until_complete(session.get_items())
    loop.close()
    gc.collect()
print(len(items), flush=True)
"""


def test_s33_a_loop_closed_after_use_leaves_no_traceback(pg_url: str, pg_schema: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CLOSED_LOOP, pg_url, pg_schema],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3"
    assert proc.stderr == "", proc.stderr


SHAPES: list[dict[str, Any]] = [
    {"role": "user", "content": "plain"},
    {"type": "message", "role": "user", "content": "with a type"},
    {"role": "user", "content": [{"type": "input_text", "text": "part one"},
                                 {"type": "input_text", "text": "part two"}]},
    {"role": "assistant", "content": "an easy reply"},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "model reply", "annotations": [],
                  "logprobs": []}]},
    {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "refusal", "refusal": "no"}]},
    {"type": "function_call", "call_id": "c1", "name": "weather",
     "arguments": '{"city":  "Paris"}', "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {"type": "function_call_output", "call_id": "c1", "output": "again", "status": None},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
    {"role": "user", "content": "user"},  # the text equals another string of the item
    {"role": "user", "content": "true", "flag": True, "n": 1.0, "m": 1},
    {"role": "system", "content": "be brief"},
]


async def test_s31_each_item_comes_back_exactly_and_is_stored_once() -> None:
    store = MemoryStore()
    session = ThreadlineSession("shapes", store)
    await session.add_items(SHAPES)
    back = await ThreadlineSession("shapes", store).get_items()
    assert back == SHAPES
    for got, want in zip(back, SHAPES, strict=True):  # 1 and 1.0, True and 1 stay apart
        assert [(k, type(v)) for k, v in got.items()] == [(k, type(v)) for k, v in want.items()]
    entries = await store.load_entries("shapes")
    texts = [e.message.text for e in entries if isinstance(e, MessageEntry)]
    assert texts[:3] == ["plain", "with a type", "part onepart two"]
    assert "model reply" in texts and "sunny" in texts
    # Each text is in the log once: the entries after a message hold what it does not.
    raw = b"\n".join(encode_entry(e) for e in entries)
    assert raw.count(b"model reply") == 1 and raw.count(b"part two") == 1
    kinds = [e.kind for e in entries if isinstance(e, CustomEntry)]
    assert "openai_agents.item" in kinds  # the reasoning and system items, whole
    roles = [type(e.message) for e in entries if isinstance(e, MessageEntry)]
    assert roles.count(UserMessage) == 5 and ToolResultMessage in roles
    assert AssistantMessage in roles
    # Pops take whole items off, whatever entries they are kept in.
    for want in reversed(SHAPES[-4:]):
        assert await session.pop_item() == want
    assert await session.get_items() == SHAPES[:-4]


async def test_s31_sessions_written_before_read_as_they_did() -> None:
    """Every item whole, and a message saying the same after the ones that are messages."""
    from threadline import durable
    from threadline.integrations.openai_agents._items import _Item, to_message

    store = MemoryStore()
    agent = await durable.open(None, store=store, session_id="old", repair=False)
    old = [{"role": "user", "content": "a"}, {"type": "reasoning", "id": "r", "summary": []},
           {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    for item in old:
        message = to_message(item, {})
        await agent.append(CustomEntry(kind="openai_agents.item", data=_Item(item)),
                           *([message] if message is not None else []))
    session = ThreadlineSession("old", store)
    assert await session.get_items() == old
    await session.add_items([{"role": "user", "content": "new"}])
    assert await session.get_items() == [*old, {"role": "user", "content": "new"}]
