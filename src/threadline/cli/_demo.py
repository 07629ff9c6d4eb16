"""``threadline demo``: what durability buys, in a few seconds, offline.

A scripted model (no network) talks in a session of the ``--store`` store
(default: a file store in ``./threadline-demo``). A child process
runs the first turn and is killed with SIGKILL while a tool is running; the
parent reopens the session, shows the repaired transcript, continues, rewinds
to an earlier entry and branches, forks the session, and draws the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from datetime import datetime

from rich.panel import Panel
from rich.rule import Rule

from threadline import durable
from threadline.ai._tools import Tool, tool
from threadline.cli._command import Ctx, Verb
from threadline.cli._output import Out
from threadline.cli._render import describe, short, spans_text, tree_lines
from threadline.durable._events import LifecycleEvent, StoredMessageEnd
from threadline.errors import ConfigError
from threadline.session._tree import TreeIndex
from threadline.stores import open_store
from threadline.stores._contract import CatalogStore
from threadline.stores.file._store import FileStore
from threadline.testing._scripted import Call, ScriptedModel, Turn
from threadline.testing._scripted import Text as Say

__all__ = ["VERBS"]

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


async def _child(url: str, session_id: str) -> None:
    """The first turn, in a process that is about to die."""
    model = ScriptedModel([
        Turn(Say("Let me check ", "the weather ", "in Lisbon."),
             Call("get_weather", {"city": "Lisbon"})),
    ])
    agent = await durable.open(
        durable.model(model, [_weather_tool(slow=True)], system=SYSTEM),
        store=open_store(url), session_id=session_id,
    )
    async for event in agent.run("What's the weather in Lisbon right now?"):
        if isinstance(event, StoredMessageEnd):
            for entry in event.entries:
                line = "".join(s if isinstance(s, str) else s[0] for s in describe(entry))
                print(json.dumps({"stored": entry.id, "line": line}), flush=True)


def _print_stored(out: Out, label: str, event: object) -> None:
    if isinstance(event, StoredMessageEnd):
        for entry in event.entries:
            out.line((f"  {label} ", "dim"), f"{short(entry.id)}  ", *describe(entry))


async def _kill_child(out: Out, url: str, session_id: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "threadline.cli._demo", "--child", url, session_id,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not raw:
            raise RuntimeError("the demo's child process ended before its tool started")
        msg = json.loads(raw)
        if "stored" in msg:
            out.line("  child ", ("stored", "dim"), f" {short(msg['stored'])}  {msg['line']}")
        elif "tool_started" in msg:
            out.line(f"  child is running get_weather({msg['tool_started']!r}) ...")
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            out.line("  ", ("SIGKILL", "bold red"), f" sent to pid {proc.pid} while the tool "
                     "ran. Its result was never written.")
            return


async def run_demo(url: str, store: CatalogStore, out: Out) -> None:
    """Run the demo in ``store``, which ``url`` names for the child process."""
    session_id = f"demo-{datetime.now():%Y%m%d-%H%M%S-%f}"
    published: list[LifecycleEvent] = []
    console = out.console()

    def step(n: int, title: str) -> None:
        out.line()
        console.print(Rule(spans_text([(f"{n}. {title}", "bold")])))

    console.print(Panel.fit(spans_text([
        ("threadline demo\n", "bold"), "A scripted model (offline) in a session stored in\n",
        (url, "cyan"), ".  Session id: ", (session_id, "bold")])))

    step(1, "A turn with a tool call, in a child process that gets killed mid-tool")
    await _kill_child(out, url, session_id)

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
        mark = ("  ← appended by crash repair", "bold red") if entry in agent.repaired else ""
        out.line(f"  {short(entry.id)}  ", *describe(entry), mark)
    out.line("  Repair only appends: what was already stored is never rewritten.")

    step(3, "Continue the conversation where it stopped")
    after_repair = agent.leaf_id
    async for event in agent.run("Please try again."):
        _print_stored(out, "stored", event)

    step(4, "Rewind to an earlier entry and branch")
    assert after_repair is not None
    agent.branch(after_repair)
    out.line(f"  leaf moved back to {short(after_repair)} (in memory; nothing rewritten)")
    async for event in agent.run("Never mind Lisbon. How does Porto compare?"):
        _print_stored(out, "stored", event)

    step(5, "Fork the active path into a new session")
    child = await agent.fork(f"{session_id}-fork")
    async for event in child.run("Anything to pack?"):
        _print_stored(out, "stored in fork", event)
    record = await store.load_session(child.session_id)
    out.line(f"  fork {child.session_id} has parent_id {record.parent_id}")

    step(6, "The session tree, reloaded from the store")
    reloaded = TreeIndex(await store.load_entries(session_id), session_id=session_id)
    forked = TreeIndex(await store.load_entries(child.session_id), session_id=child.session_id)
    for tree, title, leaf in (
            (reloaded, f"session {session_id}", agent.leaf_id),
            (forked, f"session {child.session_id}  (fork of {session_id})", None)):
        out.line((title, "bold"))
        for line in tree_lines(tree, leaf_id=leaf):
            out.line(*line)
    out.line("  ● marks the active path. Lifecycle events this process published: "
             + ", ".join(e.type for e in published))
    out.line()
    if isinstance(store, FileStore):
        for sid in (session_id, child.session_id):
            data = store.path_for(sid).read_bytes()
            out.line(f"  {store.path_for(sid)}  ({len(data):,} bytes, "
                     f"{len(data.splitlines())} lines)")
        out.line()
        out.line("  Look inside: ", (f"head -3 {store.path_for(session_id)}", "bold"))
    else:
        out.line("  Look inside: ", (f"threadline --store {url} show {session_id}", "bold"))


def _conf(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None,
                   help="folder for a file store (the same as --store DIR)")


async def _run(ctx: Ctx, args: argparse.Namespace) -> None:
    url = args.dir or ctx.store_url
    if url.strip().lower().startswith("memory:"):
        raise ConfigError("the demo kills a child process that writes to the store, so it "
                          f"needs a store another process can open, not {url!r}")
    store = ctx.open(url, create=True)
    if isinstance(store, FileStore):
        url = str(store.root.absolute())  # the child may resolve paths elsewhere
    await run_demo(url, store, ctx.out)


VERBS = [Verb("demo", "crash, repair, branch and fork a session, offline", _conf, _run)]


def main() -> None:
    """Entry point of the demo's child process."""
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        asyncio.run(_child(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit("usage: python -m threadline.cli._demo --child STORE_URL SESSION_ID")


if __name__ == "__main__":
    main()
