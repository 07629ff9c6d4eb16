"""The ``threadline`` command on long sessions, against ``export`` of the same session.

One linear file-store session of 100,000 realistic messages, and a store
holding one session of 40,000 with a branch every 50 entries. Each command
runs as a real child process with stdout sent to a file, as ``threadline
show S > f`` or a pager would consume it, so start-up, loading and writing
all count. ``export`` (load, then write the stored bytes) is the floor for
what reads a whole session: ``show`` and ``tree`` describe every entry,
``export --format html`` draws the page holding the leaf. ``list`` reads
only the catalog, so its floor is the command starting (``--version``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import msgspec

from bench._harness import Run, alternate, at_most
from bench._targets import Entry, FileStore, SessionRecord
from bench._workloads import realistic

NEEDS = ()
MINUTES = 2
CLI = [sys.executable, "-c", "from threadline.cli import main; main()"]


def _branched(count: int) -> list[Entry]:
    """``realistic`` messages in a chain that forks every 50 entries."""
    entries: list[Entry] = []
    for n, entry in enumerate(realistic(count, seed=11)):
        parent = entries[-10].id if n % 50 == 49 else (entries[-1].id if entries else None)
        entries.append(msgspec.structs.replace(entry, parent_id=parent))
    return entries


def main(run: Run) -> None:
    count, forty, turns = run.pick((100_000, 40_000, 5), (2_000, 2_000, 2))
    root = run.tmp / "s"
    branched = run.tmp / "b"

    async def build() -> None:
        for where, sid, entries in ((root, "long", realistic(count, seed=7)),
                                    (branched, "forty", _branched(forty))):
            store = FileStore(where, durability="flush")
            await store.create_session(SessionRecord(id=sid))
            for start in range(0, len(entries), 1000):
                await store.append_entries(sid, entries[start:start + 1000])
            await store.close()

    asyncio.run(build())
    out = run.tmp / "out"
    env = dict(os.environ, NO_COLOR="1")

    def command(*argv: str, store: Path = root) -> object:
        def call() -> None:
            with out.open("wb") as f:
                subprocess.run([*CLI, "--store", str(store), *argv], stdout=f, check=True,
                               env=env, stderr=subprocess.DEVNULL)
        return call

    got = asyncio.run(alternate({
        "export": command("export", "long"),
        "show": command("show", "long", "--no-pager"),
        "show --json": command("show", "long", "--json"),
        "show --tail 20": command("show", "long", "--tail", "20"),
    }, turns))
    size = Path(root / "long.jsonl").stat().st_size
    for name in ("show", "show --json", "show --tail 20"):
        run.row(f"threadline {name}, a session of {count:,} entries ({size / 1e6:.0f} MB)",
                got.median(name), "s", versus="threadline export of the same session",
                versus_value=got.median("export"), ratio=got.paired(name, "export"),
                detail=f"child processes, median of {turns} paired turns")
    got = asyncio.run(alternate({
        "export": command("export", "forty", store=branched),
        "tree": command("tree", "forty", "--no-pager", store=branched),
        "tree --json": command("tree", "forty", "--json", store=branched),
        "export --format html": command("export", "forty", "--format", "html", store=branched),
        "list": command("list", store=branched),
        "--version": command("--version", store=branched),
    }, turns))
    size = Path(branched / "forty.jsonl").stat().st_size
    for name in ("tree", "tree --json", "export --format html"):
        run.row(f"threadline {name}, a session of {forty:,} entries with a branch every 50 "
                f"({size / 1e6:.0f} MB)", got.median(name), "s",
                versus="threadline export of the same session",
                versus_value=got.median("export"), ratio=got.paired(name, "export"),
                goal=at_most(3.0), detail=f"child processes, median of {turns} paired turns")
    run.row(f"threadline list, a store holding that one session of {forty:,} entries",
            got.median("list"), "s", versus="threadline --version (the command starting)",
            versus_value=got.median("--version"), ratio=got.paired("list", "--version"),
            goal=at_most(2.0), detail=f"child processes, median of {turns} paired turns")
