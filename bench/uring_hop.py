"""What an fsync'd append costs with and without a worker thread: io_uring against the thread hop.

    .venv/bin/python bench/uring_hop.py [--samples 300] [--runs 3]

Prints a table and writes bench/results/uring_hop.json.

The file store keeps every fsync off the event loop. Through a worker thread
that costs a Python thread waking, taking the GIL and waking the loop back.
Where the kernel allows it, the store instead writes the lines on the loop,
submits the fdatasync to io_uring and awaits the ring's report
(``threadline/session/_uring.py``). Each run interleaves, sample by sample,
on files of one disk, each variant first in turn:

- floor: ``os.write`` + ``os.fdatasync`` on the calling thread (blocks the loop);
- thread: the same two calls handed to a worker thread and awaited, the least
  a threaded path can cost;
- io_uring: ``os.write`` on the loop, then the fdatasync submitted to the
  store's own ring and awaited on its report;
- FileStore (io_uring) and FileStore (thread): ``append_entries`` of one
  entry of the same size with fsync durability, through each path.

Every figure is the median over the samples, divided by the floor's median of
the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from threadline.ai._messages import UserMessage
from threadline.session import FileStore, MessageEntry, SessionRecord, _file, _uring, new_id

RESULTS = Path(__file__).parent / "results" / "uring_hop.json"
_LINE = b'{"x":"' + b"a" * 580 + b'"}\n'


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


class _Variants:
    """The five ways of making one line durable, each on its own file or session."""

    def __init__(self, root: Path, ring: _uring.Ring) -> None:
        self.loop = asyncio.get_running_loop()
        self.ring = ring
        self.fds = {name: _open(root / f"{name}.jsonl") for name in ("floor", "thread", "uring")}
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.text = "a" * (len(_LINE) - 200)
        self.stores: dict[str, tuple[FileStore, str, list[str | None]]] = {}
        self.root = root

    async def open_stores(self) -> None:
        for name in ("store", "store_thread"):
            store = FileStore(self.root / name, durability="fsync")
            sid = new_id()
            await store.create_session(SessionRecord(id=sid))
            self.stores[name] = (store, sid, [None])

    def floor_on(self, fd: int) -> None:
        os.write(fd, _LINE)
        os.fdatasync(fd)

    async def floor(self) -> None:
        self.floor_on(self.fds["floor"])

    async def thread(self) -> None:
        await self.loop.run_in_executor(self.pool, self.floor_on, self.fds["thread"])

    async def uring(self) -> None:
        os.write(self.fds["uring"], _LINE)
        synced = await self.ring.wait(self.fds["uring"])
        if synced != 0:
            raise SystemExit(f"io_uring fdatasync failed: {os.strerror(-synced)}")

    async def _append(self, name: str) -> None:
        store, sid, parent = self.stores[name]
        entry = MessageEntry(id=new_id(), parent_id=parent[0], message=UserMessage.of(self.text))
        if name == "store_thread":  # this store's appends take the worker thread
            _file.ring_for = lambda _loop: None  # type: ignore[assignment]
        try:
            await store.append_entries(sid, [entry])
        finally:
            _file.ring_for = _uring.ring_for
        parent[0] = entry.id

    async def store(self) -> None:
        await self._append("store")

    async def store_thread(self) -> None:
        await self._append("store_thread")

    async def close(self) -> None:
        sizes = {name: os.fstat(fd).st_size for name, fd in self.fds.items()}
        self.pool.shutdown()
        for fd in self.fds.values():
            os.close(fd)
        for store, _, _ in self.stores.values():
            await store.close()
        if len(set(sizes.values())) != 1:
            raise SystemExit(f"the variants wrote different amounts: {sizes}")


async def _one_run(root: Path, samples: int) -> dict[str, float]:
    ring = _uring.ring_for(asyncio.get_running_loop())
    if ring is None:
        raise SystemExit(f"no io_uring here: {_uring._shared.unusable}")
    v = _Variants(root, ring)
    await v.open_stores()
    variants: dict[str, Callable[[], Awaitable[None]]] = {
        "floor": v.floor, "thread": v.thread, "uring": v.uring,
        "store": v.store, "store_thread": v.store_thread,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(20):
            for fn in variants.values():
                await fn()
        order = list(variants.items())
        for k in range(samples):
            # Each variant first in turn: the thread's worker is still settling
            # when the next one starts, which slowed whichever came next.
            for i in range(len(order)):
                name, fn = order[(k + i) % len(order)]
                start = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - start)
                await asyncio.sleep(0)
    finally:
        await v.close()
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="put the files on this disk")
    args = parser.parse_args()

    runs: list[dict[str, Any]] = []
    print(f"{'run':>3} {'floor ms':>9} {'thread':>7} {'io_uring':>9} "
          f"{'store (io_uring)':>17} {'store (thread)':>15}   (÷ floor)")
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            p50 = asyncio.run(_one_run(Path(tmp), args.samples))
        ratios = {name: p50[name] / p50["floor"] for name in p50}
        runs.append({"p50_ms": p50, "ratio": ratios})
        print(
            f"{n + 1:>3} {p50['floor']:9.3f} {ratios['thread']:7.2f} {ratios['uring']:9.2f} "
            f"{ratios['store']:17.2f} {ratios['store_thread']:15.2f}"
        )

    machine = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"machine": machine, "samples": args.samples, "runs": runs}, indent=2) + "\n"
    )
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
