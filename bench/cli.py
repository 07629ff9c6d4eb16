"""CLI benchmark: ``show`` of a long session against ``export`` of the same session.

    .venv/bin/python bench/cli.py            # 100,000 entries (about a minute)
    .venv/bin/python bench/cli.py --quick    # 10,000 entries, for a smoke test

Prints a table and writes bench/results/cli.json.

One linear file-store session of realistic messages (user text, assistant
text with a tool call, tool results). Each command runs as a real child
process with stdout redirected to a file, the way ``threadline show S > f``
or a pager would consume it, so process start-up, loading and writing all
count. ``export`` (load, then write the stored bytes) is the floor: ``show``
has to load the same log and then describe every entry on the path.
Commands are interleaved, and the median of the repetitions is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from threadline.ai import AssistantMessage, TextPart, ToolCall, ToolResultMessage, UserMessage
from threadline.session import FileStore, MessageEntry, SessionRecord

RESULTS = Path(__file__).parent / "results" / "cli.json"
CLI = [sys.executable, "-c", "from threadline.cli import main; main()"]
WORDS = ("the", "order", "shipped", "yesterday", "from", "our", "warehouse", "and", "should",
         "arrive", "within", "three", "business", "days", "please", "check", "the",
         "tracking", "link", "for", "updates")


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def build(root: Path, count: int) -> None:
    rng = random.Random(7)
    store = FileStore(root, durability="flush")
    await store.create_session(SessionRecord(id="long"))
    parent: str | None = None
    batch: list[MessageEntry] = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            msg: UserMessage | AssistantMessage | ToolResultMessage = UserMessage(
                content=(TextPart(text=_text(rng, 30)),))
        elif kind == 1:
            msg = AssistantMessage(content=(TextPart(text=_text(rng, 60)), ToolCall(
                id=f"c{i}", name="lookup_order", arguments={"order_id": str(i)})),
                stop_reason="tool_use")
        else:
            msg = ToolResultMessage(tool_call_id=f"c{i - 1}", tool_name="lookup_order",
                                    content=(TextPart(text=_text(rng, 40)),))
        entry = MessageEntry(parent_id=parent, message=msg)
        parent = entry.id
        batch.append(entry)
        if len(batch) == 1000:
            await store.append_entries("long", batch)
            batch = []
    if batch:
        await store.append_entries("long", batch)
    await store.close()


def timed(argv: list[str], out: Path) -> float:
    env = dict(os.environ, NO_COLOR="1")
    with out.open("wb") as f:
        start = time.perf_counter()
        subprocess.run([*CLI, *argv], stdout=f, check=True, env=env)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    opts = ap.parse_args()
    count = 10_000 if opts.quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "s"
        asyncio.run(build(root, count))
        size = (root / "long.jsonl").stat().st_size
        store = ["--store", str(root)]
        commands = {
            "export": [*store, "export", "long"],
            "show": [*store, "show", "long", "--no-pager"],
            "show --json": [*store, "show", "long", "--json"],
            "show --tail 20": [*store, "show", "long", "--tail", "20"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(opts.repeat):
            for name, argv in commands.items():
                times[name].append(timed(argv, Path(tmp) / "out"))
    medians = {name: statistics.median(t) for name, t in times.items()}
    floor = medians["export"]
    rows = [{"command": name, "median_s": m, "ratio_to_export": m / floor,
             "samples": len(times[name])} for name, m in medians.items()]
    print(f"\nthreadline CLI on one session of {count:,} entries ({size / 1e6:.0f} MB), "
          f"median of {opts.repeat}\n")
    print(f"| {'command':<16} | {'seconds':>8} | {'÷ export':>8} |")
    print(f"|{'-' * 18}|{'-' * 10}:|{'-' * 10}:|")
    for row in rows:
        print(f"| {row['command']:<16} | {row['median_s']:>8.2f} "
              f"| {row['ratio_to_export']:>8.2f} |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpu_count": os.cpu_count()},
        "entries": count, "file_bytes": size, "rows": rows,
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
