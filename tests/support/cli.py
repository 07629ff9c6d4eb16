"""Running the ``threadline`` command as a real child process, on a pipe or a pty;
the sessions the CLI tests read: one full of terminal escapes, one awaiting approval."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from support.wire_server import Reply, sse_data, sse_reply
from threadline import durable
from threadline.ai import (
    AssistantMessage,
    TextPart,
    ToolCall,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    tool,
)
from threadline.session import CustomEntry, MessageEntry, SessionRecord
from threadline.stores import FileStore
from threadline.testing import Call, ScriptedModel, Turn

CLI = [sys.executable, "-c", "from threadline.cli import main; main()"]


def tl(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """The command with stdout and stderr on pipes."""
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", **(env or {})}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=full,
                          timeout=120, check=False, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def tl_pty(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           until: bytes | None = None, then: object = None) -> tuple[int, bytes]:
    """The command with stdout and stderr on a pseudo-terminal; (exit status, bytes).

    With ``until``, ``then(proc)`` is called once those bytes have appeared.
    """
    master, slave = os.openpty()
    full = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "PAGER": "cat",
            **(env or {})}
    full.pop("NO_COLOR", None)
    # A terminal's program gets Ctrl-C. One started from a background job of a
    # script (as CI's suites are) inherits SIGINT ignored and would never see
    # it; handled here instead of ignored, it starts at the default.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=slave, cwd=cwd, env=full)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                proc.kill()
                raise AssertionError(f"no output for 120 s; so far: {out!r}")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end of the terminal
                break
            if not data:
                break
            out += data
            if until is not None and until in out and callable(then):
                then(proc)
                until = None
    finally:
        os.close(master)
    return proc.wait(60), out


def chat_reply(text: str) -> Reply:
    """An OpenAI Chat Completions stream answering ``text``."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return sse_reply(sse_data([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]))


MARKUP = "[link=file:///etc/passwd]L[/link]"


HOSTILE = ("\x1b]0;pwned\x1b\\ \x1b[2J \x1b[5;35mblink \x1b]8;;http://evil.example\x1b\\"
           "click\x1b]8;;\x1b\\ \x9b2J \x07 \x1bP+q\x1b\\ \u202eabc [bold]x[/bold] [/] "
           f"{MARKUP} :smile:")


SID = f"evil{MARKUP}[/]x[bold]y\x1b[2J"


def make_hostile_store(root: Path) -> list[str]:
    """The hostile session; returns its entry ids in order."""
    user = MessageEntry(message=UserMessage(content=(TextPart(text=HOSTILE),)))
    call = MessageEntry(parent_id=user.id, message=AssistantMessage(
        content=(TextPart(text=HOSTILE), ToolCall(id="c1", name=HOSTILE, arguments={"q": HOSTILE})),
        stop_reason="tool_use"))
    result = MessageEntry(parent_id=call.id, message=ToolResultMessage(
        tool_call_id="c1", tool_name=HOSTILE, content=(TextPart(text=HOSTILE),)))
    failed = MessageEntry(parent_id=result.id, message=AssistantMessage(
        stop_reason="error", error_message=HOSTILE))
    custom = CustomEntry(parent_id=failed.id, kind=HOSTILE, data={"x": HOSTILE})
    entries = [user, call, result, failed, custom]

    async def write() -> None:
        store = FileStore(root)
        await store.create_session(SessionRecord(id=SID))
        await store.append_entries(SID, entries)
        await store.close()

    asyncio.run(write())
    # An entry of a type this version does not know, with a hostile type name.
    opaque = json.dumps({"type": HOSTILE, "id": "opaque-1", "parent_id": custom.id})
    with FileStore(root).path_for(SID).open("a") as f:
        f.write(opaque + "\n")
    return [e.id for e in entries] + ["opaque-1"]


def asking_session(root: Path) -> None:
    @tool(side_effects=True, approval=lambda a: "big refund" if a["amount"] > 100 else None)
    async def refund(amount: int, ctx: ToolContext) -> str:
        """Refund."""
        return f"refunded {amount}"

    async def go() -> None:
        lm = ScriptedModel([Turn(Call("refund", {"amount": 20}, id="small"),
                                 Call("refund", {"amount": 900}, id="big"))])
        agent = await durable.open(durable.model(lm, [refund]), store=FileStore(root),
                                   session_id="t-1")
        await agent.run("refund").collect()

    asyncio.run(go())
