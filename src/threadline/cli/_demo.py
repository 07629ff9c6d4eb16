"""``threadline demo``: what durability buys, in a few seconds, offline.

A scripted model (no network) talks in a file-store session. A child process
runs the first turn and is killed with SIGKILL while a tool is running; the
parent reopens the session, shows the repaired transcript, continues, rewinds
to an earlier entry and branches, forks the session, and draws the tree.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from threadline import durable
from threadline.ai._tools import Tool, tool
from threadline.cli._render import describe, session_tree, short
from threadline.durable._events import LifecycleEvent, StoredMessageEnd
from threadline.session._file import FileStore
from threadline.session._tree import TreeIndex
from threadline.testing._scripted import Call, ScriptedModel, Turn
from threadline.testing._scripted import Text as Say

__all__ = ["run_demo"]

SYSTEM = "You are a travel assistant. Use tools for live data."


def _weather_tool(slow: bool) -> Tool:
    @tool
    async def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city name.
        """
        if slow:
            # The child announces the tool started, then hangs until killed.
            print(json.dumps({"tool_started": city}), flush=True)
            await asyncio.sleep(3600)
        return f"{city}: 18°C, light wind, clear sky."

    return get_weather


async def _child(root: Path, session_id: str) -> None:
    """The first turn, in a process that is about to die."""
    model = ScriptedModel([
        Turn(Say("Let me check ", "the weather ", "in Lisbon."),
             Call("get_weather", {"city": "Lisbon"})),
    ])
    agent = await durable.open(
        durable.model(model, [_weather_tool(slow=True)], system=SYSTEM),
        store=FileStore(root), session_id=session_id,
    )
    async for event in agent.run("What's the weather in Lisbon right now?"):
        if isinstance(event, StoredMessageEnd):
            for entry in event.entries:
                print(json.dumps({"stored": entry.id, "line": describe(entry).plain}),
                      flush=True)


async def run_demo(root: Path, console: Console) -> None:
    """Run the demo in the folder ``root`` (an absolute path)."""
    store = FileStore(root)
    session_id = f"demo-{datetime.now():%Y%m%d-%H%M%S-%f}"
    published: list[LifecycleEvent] = []

    def step(n: int, title: str) -> None:
        console.print()
        console.rule(f"[bold]{n}. {title}")

    console.print(Panel.fit(
        Text.assemble(
            ("threadline demo\n", "bold"),
            "A scripted model (offline) in a session stored as JSON lines under\n",
            (str(root), "cyan"), ".  Session id: ", (session_id, "bold"),
        )
    ))

    step(1, "A turn with a tool call, in a child process that gets killed mid-tool")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "threadline.cli._demo", "--child", str(root), session_id,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not raw:
            raise RuntimeError("the demo's child process ended before its tool started")
        msg = json.loads(raw)
        if "stored" in msg:
            console.print(f"  child [dim]stored[/] {short(msg['stored'])}  {msg['line']}")
        elif "tool_started" in msg:
            console.print(f"  child is running get_weather({msg['tool_started']!r}) ...")
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            console.print(f"  [bold red]SIGKILL[/] sent to pid {proc.pid} while the tool ran. "
                          "Its result was never written.")
            break

    step(2, "Reopen: every acknowledged message is there; the dangling call is repaired")
    model = ScriptedModel([
        Turn(Say("The lookup was interrupted, so I ran it again."),
             Call("get_weather", {"city": "Lisbon"})),
        Turn.text("Lisbon: 18°C with a light wind and clear skies. A fine afternoon."),
        Turn.text("Porto is usually a few degrees cooler and cloudier than Lisbon."),
        Turn.text("In the fork: pack a light jacket for the evening."),
    ])
    factory = durable.model(model, [_weather_tool(slow=False)], system=SYSTEM)
    agent = await durable.open(factory, store=store, session_id=session_id,
                               publisher=published.append)
    for entry in agent.path():
        mark = "  [bold red]← appended by crash repair[/]" if entry in agent.repaired else ""
        console.print(f"  {short(entry.id)}  ", describe(entry), mark)
    console.print("  Repair only appends: lines already in the file are never rewritten.")

    step(3, "Continue the conversation where it stopped")
    after_repair = agent.leaf_id
    async for event in agent.run("Please try again."):
        if isinstance(event, StoredMessageEnd):
            for entry in event.entries:
                console.print(f"  [dim]stored[/] {short(entry.id)}  ", describe(entry))

    step(4, "Rewind to an earlier entry and branch")
    assert after_repair is not None
    agent.branch(after_repair)
    console.print(f"  leaf moved back to {short(after_repair)} (in memory; nothing rewritten)")
    async for event in agent.run("Never mind Lisbon. How does Porto compare?"):
        if isinstance(event, StoredMessageEnd):
            for entry in event.entries:
                console.print(f"  [dim]stored[/] {short(entry.id)}  ", describe(entry))

    step(5, "Fork the active path into a new session")
    child = await agent.fork(f"{session_id}-fork")
    async for event in child.run("Anything to pack?"):
        if isinstance(event, StoredMessageEnd):
            for entry in event.entries:
                console.print(f"  [dim]stored in fork[/] {short(entry.id)}  ", describe(entry))
    record = await store.load_session(child.session_id)
    console.print(f"  fork {child.session_id} has parent_id {record.parent_id}")

    step(6, "The session tree, reloaded from disk")
    reloaded = TreeIndex(await store.load_entries(session_id), session_id=session_id)
    console.print(session_tree(reloaded, title=f"session {session_id}",
                               leaf_id=agent.leaf_id))
    forked = TreeIndex(await store.load_entries(child.session_id),
                       session_id=child.session_id)
    console.print(session_tree(forked, title=f"session {child.session_id}  (fork of "
                               f"{session_id})"))
    console.print("  ● marks the active path. Lifecycle events this process published:",
                  ", ".join(e.type for e in published))

    console.print()
    for sid in (session_id, child.session_id):
        data = store.path_for(sid).read_bytes()
        console.print(f"  {store.path_for(sid)}  ({len(data):,} bytes, "
                      f"{len(data.splitlines())} lines)")
    console.print(f"\n  Look inside: [bold]head -3 {store.path_for(session_id)}[/]")


def main() -> None:
    """Entry point of the demo's child process."""
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        asyncio.run(_child(Path(sys.argv[2]), sys.argv[3]))
    else:
        raise SystemExit("usage: python -m threadline.cli._demo --child ROOT SESSION_ID")


if __name__ == "__main__":
    main()
