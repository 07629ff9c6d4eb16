"""What an fsync'd append could cost without a worker thread: io_uring against the thread hop.

    bench/.venv/bin/pip install -r bench/requirements-peers.txt   # brings liburing
    bench/.venv/bin/python bench/uring_hop.py [--samples 300] [--runs 3]

Prints a table and writes bench/results/uring_hop.json.

The file store keeps every fsync off the event loop by handing the write and
fdatasync to a worker thread and waking the loop when they return. On this
kind of machine that hop costs about half an fdatasync (see the store section
of docs/benchmarks.md). io_uring is the one way on Linux to get the same
guarantee without a Python thread: the loop submits a linked write + fdatasync
to the kernel, and the kernel signals an eventfd the loop already watches.

Each run interleaves, sample by sample, on copies of one file:

- floor: ``os.write`` + ``os.fdatasync`` on the calling thread (blocks the loop);
- thread: the same two calls handed to a worker thread and awaited, the least
  the store's path can cost;
- io_uring: one linked write + fdatasync submitted from the loop, awaited on
  the ring's eventfd (the ``liburing`` binding);
- FileStore: ``append_entries`` of one entry of the same size, fsync durability.

Every figure is the median over the samples, divided by the floor's median of
the same run. The binding is measured here only; threadline does not depend on
it (it ships x86-64 Linux wheels only and no source distribution).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

import liburing  # type: ignore[import-not-found]

from threadline.ai._messages import UserMessage
from threadline.session import FileStore, MessageEntry, SessionRecord, new_id

RESULTS = Path(__file__).parent / "results" / "uring_hop.json"
_LINE = b'{"x":"' + b"a" * 580 + b'"}\n'


class _Ring:
    """One io_uring whose completions wake the running event loop through an eventfd."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ring = liburing.Ring()
        liburing.io_uring_queue_init(64, self._ring)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        liburing.io_uring_register_eventfd(self._ring, self._efd)
        self._cqe = liburing.Cqe()
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._next = 0
        loop.add_reader(self._efd, self._reap)

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        while ready := liburing.io_uring_cq_ready(self._ring):
            liburing.io_uring_peek_cqe(self._ring, self._cqe)
            for i in range(ready):
                cqe = self._cqe[i]
                fut = self._pending.pop(cqe.user_data, None)
                if fut is not None and not fut.done():
                    if cqe.res < 0:
                        fut.set_exception(OSError(-cqe.res, os.strerror(-cqe.res)))
                    else:
                        fut.set_result(cqe.res)
            liburing.io_uring_cq_advance(self._ring, ready)

    async def write_and_sync(self, fd: int, data: bytes) -> None:
        write = liburing.io_uring_get_sqe(self._ring)
        # -1 as the offset: write at the file position (O_APPEND), like os.write.
        liburing.io_uring_prep_write(write, fd, data, 2**64 - 1)
        # The write reports only on failure; a failed write also cancels the linked
        # sync, so the awaited sync fails with it.
        flags = liburing.IOSQE_IO_LINK | liburing.IOSQE_CQE_SKIP_SUCCESS
        liburing.io_uring_sqe_set_flags(write, flags)
        sync = liburing.io_uring_get_sqe(self._ring)
        liburing.io_uring_prep_fsync(sync, fd, liburing.IORING_FSYNC_DATASYNC)
        self._next += 1
        liburing.io_uring_sqe_set_data64(sync, self._next)
        fut = self._loop.create_future()
        self._pending[self._next] = fut
        liburing.io_uring_submit(self._ring)
        await fut

    def close(self) -> None:
        self._loop.remove_reader(self._efd)
        liburing.io_uring_queue_exit(self._ring)
        os.close(self._efd)


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


async def _one_run(root: Path, samples: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    store = FileStore(root / "store", durability="fsync")
    sid = new_id()
    await store.create_session(SessionRecord(id=sid))
    text = "a" * (len(_LINE) - 200)
    parent: str | None = None

    fds = {name: _open(root / f"{name}.jsonl") for name in ("floor", "thread", "uring")}
    ring = _Ring(loop)
    pool = ThreadPoolExecutor(max_workers=1)

    def floor(fd: int = fds["floor"]) -> None:
        os.write(fd, _LINE)
        os.fdatasync(fd)

    async def thread() -> None:
        await loop.run_in_executor(pool, floor, fds["thread"])

    async def uring() -> None:
        await ring.write_and_sync(fds["uring"], _LINE)

    async def file_store() -> None:
        nonlocal parent
        entry = MessageEntry(id=new_id(), parent_id=parent, message=UserMessage.of(text))
        await store.append_entries(sid, [entry])
        parent = entry.id

    async def blocking() -> None:
        floor()

    variants: dict[str, Callable[[], Awaitable[None]]] = {
        "floor": blocking,
        "thread": thread,
        "uring": uring,
        "store": file_store,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(20):
            for fn in variants.values():
                await fn()
        for _ in range(samples):
            for name, fn in variants.items():
                start = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - start)
                await asyncio.sleep(0)
        sizes = {name: os.fstat(fd).st_size for name, fd in fds.items()}
        if len(set(sizes.values())) != 1:
            raise SystemExit(f"the variants wrote different amounts: {sizes}")
    finally:
        ring.close()
        pool.shutdown()
        for fd in fds.values():
            os.close(fd)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="put the files on this disk")
    args = parser.parse_args()

    runs: list[dict[str, Any]] = []
    print(f"{'run':>3} {'floor ms':>9} {'thread':>7} {'io_uring':>9} {'FileStore':>10}   (÷ floor)")
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            p50 = asyncio.run(_one_run(Path(tmp), args.samples))
        ratios = {name: p50[name] / p50["floor"] for name in p50}
        runs.append({"p50_ms": p50, "ratio": ratios})
        print(
            f"{n + 1:>3} {p50['floor']:9.3f} {ratios['thread']:7.2f} {ratios['uring']:9.2f} "
            f"{ratios['store']:10.2f}"
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
