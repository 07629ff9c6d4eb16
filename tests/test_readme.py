"""The README's example runs as written, against a real HTTP server speaking
the Chat Completions wire format (the openai SDK is pointed at it)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

from support.wire_server import WireServer, sse_data, sse_reply

README = Path(__file__).resolve().parent.parent / "README.md"
BASE = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1-mini"}


def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {**BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_readme_example_runs(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert code is not None, "README.md has no python example"
    (tmp_path / "example.py").write_text(code.group(1), encoding="utf-8")
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": "12"})}}
    async with WireServer() as server:
        server.reply(
            sse_reply(sse_data([chunk({"role": "assistant", "tool_calls": [call]}),
                                chunk({}, "tool_calls")])),
            sse_reply(sse_data([chunk({"role": "assistant", "content": "It has shipped."}),
                                chunk({}, "stop")])),
        )
        env = dict(os.environ, OPENAI_API_KEY="test", OPENAI_BASE_URL=f"{server.url}/v1")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "example.py", cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
    # The tool ran and its result went back to the model.
    sent = server.received[1].body["messages"]
    assert sent[-1]["role"] == "tool" and "shipped" in sent[-1]["content"]
    files = sorted(p.name for p in (tmp_path / "sessions").iterdir())
    assert "ticket-4711.jsonl" in files and len(files) == 2  # the session and its fork
    assert out.count(b"MessageEntry") >= 4  # receipts printed for each stored message
