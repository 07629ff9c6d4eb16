"""Opening a long session from the file store: time and memory, against reading the file.

A session of 100,000 realistic entries (user prompts, assistant messages
with thinking, text and a tool call, tool results), one line each:

- time: ``load_entries`` on a new ``FileStore``, against reading the same file
  and parsing every line with msgspec, untyped, with the garbage collector
  paused (the least any reader of the file does), in turns; goal 1.2x;
- memory: what the loaded entries keep (tracemalloc, after the load) over the
  file's size; goal 1.2x.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from bench._floors import read_decode
from bench._harness import Run, alternate, at_most, ms
from bench._targets import FileStore, SessionRecord
from bench._workloads import realistic

NEEDS = ()
MINUTES = 1


def _paused(fn: object) -> object:
    def run() -> object:
        gc.disable()
        try:
            return fn()  # type: ignore[operator]
        finally:
            gc.enable()

    return run


def main(run: Run) -> None:
    n, turns = run.pick((100_000, 7), (5_000, 2))
    root = run.tmp / "open"
    entries = realistic(n)

    async def fill() -> None:
        store = FileStore(root, durability="flush")
        await store.create_session(SessionRecord(id="s"))
        for entry in entries:  # one line per entry, as single appends write them
            await store.append_entries("s", [entry])
        await store.close()

    asyncio.run(fill())
    path = root / "s.jsonl"
    size = path.stat().st_size

    async def load() -> None:
        store = FileStore(root)
        assert len(await store.load_entries("s")) == n
        await store.close()

    got = asyncio.run(alternate({"store": load, "floor": _paused(lambda: read_decode(path))},
                                turns, collect=True))
    run.row(f"file store: open a session of {n:,} entries ({size / 1e6:.0f} MB)",
            ms(got.median("store")), "ms",
            versus="read the file + parse each line with msgspec, untyped, GC paused",
            versus_value=ms(got.median("floor")), ratio=got.paired("store", "floor"),
            goal=at_most(1.2), detail=f"median of {turns} paired turns")

    async def held() -> int:
        store = FileStore(root)
        gc.collect()
        tracemalloc.start()
        log = await store.load_entries("s")
        retained, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(log) == n
        await store.close()
        return retained

    retained = asyncio.run(held())
    run.row(f"memory a loaded session of {n:,} entries keeps", retained / 1e6, "MB",
            versus="the file's size", versus_value=size / 1e6, goal=at_most(1.2),
            detail="tracemalloc, after the load")
