"""FileStore benchmark: every figure next to a floor measured in the same run.

    .venv/bin/python bench/store.py            # full run (about 15 seconds)
    .venv/bin/python bench/store.py --quick    # smaller, for a smoke test

Prints a table and writes bench/results/store.json.

- append: ``FileStore.append_entries`` (one ~600-byte message, fsync
  durability) against a bare ``os.write`` + ``os.fdatasync`` of the same bytes
  on a file of the same size, interleaved so both see the same disk. Measured
  at N=100 and N=10,000 entries already in the session. Also measured, for
  the reading: the same write + fdatasync handed to a worker thread and
  awaited from the event loop, the way the store runs an append (the least an
  append that keeps the fsync off the event loop costs), and a no-op handed
  over the same way (the bare thread hop). The four take turns going first
  in each sample: a thread hop's worker is still settling as the next one
  starts, and in a fixed order that slowed the store's append by up to 0.3x
  the floor.
- concurrent appends: 8 tasks of one store each append 50 single entries to
  one session (group commit), against the same 400 lines written one
  ``os.write`` + ``os.fdatasync`` at a time, 9 runs each next to its own floor
  (min, median and max of the ratios). Beside the store, the completion path
  it replaced (one event-loop wake-up per call instead of per group), and the
  appends each fdatasync covered.
- open: ``FileStore.load_entries`` of a 100,000-entry session of realistic
  messages against reading the file and decoding every line with msgspec
  (``Decoder.decode_lines``, same types) with the garbage collector paused.
- memory: peak and retained Python allocations (tracemalloc) of the load,
  against the file size.
- list: 10,000 sessions (a first line and two entries each). The first page
  (limit 50) and a full pagination (limit 50, 200 pages) on a fresh
  ``FileStore``, against one ``os.scandir`` of the root plus one open +
  first-line read + close per file. Also the first page after another handle
  created one more session (the listing re-scans, re-reading only new files).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from threadline.session import FileStore, MessageEntry, SessionRecord, _file, _uring
from threadline.session._codec import _Batch, _Compact, _WireEntry, encode_entry, export_lines

RESULTS = Path(__file__).parent / "results" / "store.json"
WORDS = [
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are",
    "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when",
    "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time",
    "if", "will", "way", "about", "many",
]


def realistic_entries(n: int, seed: int = 1) -> list[MessageEntry]:
    """A chain of user / assistant-with-tool-call / tool-result messages."""
    rnd = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(words))

    out: list[MessageEntry] = []
    parent: str | None = None
    for i in range(n):
        message: Message
        if i % 3 == 0:
            message = UserMessage.of(text(rnd.randint(20, 90)))
        elif i % 3 == 1:
            message = AssistantMessage(
                content=(
                    ThinkingPart(thinking=text(25), signature="s" * 48),
                    TextPart(text=text(50)),
                    ToolCall(id=f"call_{i}", name="read_file",
                             arguments={"path": f"src/module_{i}.py", "limit": 200}),
                ),
                model="model-x", provider="openai", usage=Usage(input_tokens=900 + i,
                                                                output_tokens=120),
                stop_reason="tool_use",
            )
        else:
            message = ToolResultMessage(tool_call_id=f"call_{i - 1}", tool_name="read_file",
                                        content=(TextPart(text=text(rnd.randint(60, 150))),))
        entry = MessageEntry(parent_id=parent, message=message)
        parent = entry.id
        out.append(entry)
    return out


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _durable_copy(source: Path, path: Path) -> int:
    """Copy ``source`` to ``path``, fsync it, and return a descriptor appending to it."""
    path.write_bytes(source.read_bytes())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.fsync(fd)
    return fd


def _p50_p99_ms(**samples: list[float]) -> dict[str, float]:
    """``<name>_p50_ms`` and ``<name>_p99_ms`` for each named list of seconds."""
    out: dict[str, float] = {}
    for name, seconds in samples.items():
        out[f"{name}_p50_ms"] = pct(seconds, 0.5) * 1e3
        out[f"{name}_p99_ms"] = pct(seconds, 0.99) * 1e3
    return out


class _ThreadHop:
    """How the store gets an append off the event loop and back: a worker thread
    writes and fdatasyncs ``data`` to ``fd`` (nothing when empty), a future says done."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pool = ThreadPoolExecutor(1)

    async def __call__(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self.pool.submit(self._in_thread, loop, done, data)
        await done

    def _in_thread(
        self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None], data: bytes
    ) -> None:
        if data:
            os.write(self.fd, data)
            os.fdatasync(self.fd)
        loop.call_soon_threadsafe(done.set_result, None)


def bench_append(root: Path, preload: int, samples: int) -> dict[str, Any]:
    store = FileStore(root / f"n{preload}")
    sid = f"append-{preload}"
    asyncio.run(store.create_session(SessionRecord(id=sid)))
    existing = realistic_entries(preload, seed=preload)
    asyncio.run(store.append_entries(sid, existing))
    # The floors append to copies of the same file, made durable first.
    floor_fd = _durable_copy(store.path_for(sid), root / f"floor-{preload}.jsonl")
    threaded_fd = _durable_copy(store.path_for(sid), root / f"threaded-{preload}.jsonl")
    new = realistic_entries(samples, seed=99)
    parent = existing[-1].id
    store_s: list[float] = []
    floor_s: list[float] = []
    hop_s: list[float] = []
    threaded_s: list[float] = []
    hop = _ThreadHop(threaded_fd)

    now: dict[str, Any] = {}  # this sample's entry and its line

    async def on_store() -> None:
        await store.append_entries(sid, [now["entry"]])

    async def on_floor() -> None:
        os.write(floor_fd, now["data"])
        os.fdatasync(floor_fd)

    async def on_threaded() -> None:
        await hop(now["data"])

    async def on_hop() -> None:
        await hop(b"")

    ways = ((on_store, store_s), (on_floor, floor_s), (on_threaded, threaded_s),
            (on_hop, hop_s))

    async def run() -> None:
        nonlocal parent
        await hop(b"")
        for k in range(samples):
            entry = msgspec.structs.replace(new[k], parent_id=parent)
            parent = entry.id
            now["entry"], now["data"] = entry, encode_entry(entry) + b"\n"
            # Interleaved so the four see the same disk and machine load, and
            # each first in turn: the hops' worker thread is still settling
            # when the next one starts, and it slowed whichever came next by
            # up to 0.3x the floor.
            for i in range(len(ways)):
                way, times = ways[(k + i) % len(ways)]
                t0 = time.perf_counter()
                await way()
                times.append(time.perf_counter() - t0)

    asyncio.run(run())
    asyncio.run(store.close())
    hop.pool.shutdown()
    os.close(floor_fd)
    os.close(threaded_fd)
    out: dict[str, Any] = {"entries_before": preload, "samples": samples}
    out |= _p50_p99_ms(store=store_s, floor=floor_s, threaded_floor=threaded_s, hop=hop_s)
    out["p50_ratio"] = out["store_p50_ms"] / out["floor_p50_ms"]
    out["p99_ratio"] = out["store_p99_ms"] / out["floor_p99_ms"]
    out["threaded_floor_p50_ratio"] = out["threaded_floor_p50_ms"] / out["floor_p50_ms"]
    out["p50_ratio_to_threaded_floor"] = out["store_p50_ms"] / out["threaded_floor_p50_ms"]
    return out


def _concurrent_once(root: Path, tasks: int, lines: list[bytes], entries: list[MessageEntry],
                     variant: str) -> tuple[float, int]:
    """One run of ``tasks`` tasks appending ``entries`` to a new session: (seconds, fdatasyncs)."""
    store = FileStore(root)
    sid = "concurrent"
    real_sync, real_ring = os.fdatasync, _uring.Ring.fdatasync
    syncs = 0

    def counted(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real_sync(fd)

    def ring_counted(ring: _uring.Ring, fd: int, done: Callable[[int], object]) -> None:
        nonlocal syncs
        syncs += 1
        real_ring(ring, fd, done)

    async def run() -> float:
        await store.create_session(SessionRecord(id=sid))

        async def writer(w: int) -> None:
            for e in entries[w::tasks]:
                await store.append_entries(sid, [e])

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(tasks)))
        elapsed = time.perf_counter() - t0
        await store.close()
        return elapsed

    os.fdatasync = counted
    _uring.Ring.fdatasync = ring_counted  # type: ignore[method-assign]
    if variant == "thread":  # the worker thread's path, where io_uring is missing
        _file.ring_for = lambda _loop: None  # type: ignore[assignment]
    try:
        elapsed = asyncio.run(run())
    finally:
        os.fdatasync, _uring.Ring.fdatasync = real_sync, real_ring  # type: ignore[method-assign]
        _file.ring_for = _uring.ring_for
    assert len(asyncio.run(store.load_entries(sid))) == len(entries)
    return elapsed, syncs


def bench_concurrent(root: Path, tasks: int, per_task: int, rounds: int) -> dict[str, Any]:
    """Group commit, ``rounds`` times, each run next to a serial floor of the same lines.

    Two paths side by side: the store's (its fdatasync through io_uring, where
    the kernel allows it) and its worker thread's.
    """
    entries = realistic_entries(tasks * per_task, seed=5)
    lines = [encode_entry(e) + b"\n" for e in entries]
    n = tasks * per_task
    ratios: dict[str, list[float]] = {"store": [], "thread": []}
    per_sync: dict[str, list[float]] = {"store": [], "thread": []}
    floor_t: list[float] = []
    for k in range(rounds):
        fd = os.open(root / f"floor-concurrent-{k}.jsonl",
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        t0 = time.perf_counter()
        for line in lines:
            os.write(fd, line)
            os.fdatasync(fd)
        floor = time.perf_counter() - t0
        os.close(fd)
        floor_t.append(floor)
        order = ("store", "thread") if k % 2 == 0 else ("thread", "store")
        for variant in order:
            elapsed, syncs = _concurrent_once(root / f"concurrent-{variant}-{k}", tasks, lines,
                                              entries, variant)
            ratios[variant].append(floor / elapsed)
            per_sync[variant].append(n / syncs)
    out: dict[str, Any] = {"tasks": tasks, "appends": n, "rounds": rounds,
                           "floor_per_s": n / statistics.median(floor_t)}
    for variant, r in ratios.items():
        out[variant] = {"ratio_min": min(r), "ratio_median": statistics.median(r),
                        "ratio_max": max(r), "ratios": r,
                        "appends_per_fdatasync": statistics.median(per_sync[variant])}
    out["ratio"] = out["store"]["ratio_median"]
    return out


def bench_open(root: Path, n: int, repeats: int) -> dict[str, Any]:
    store = FileStore(root / "open", durability="flush")
    sid = "open-bench"
    asyncio.run(store.create_session(SessionRecord(id=sid)))
    entries = realistic_entries(n)
    for start in range(0, n, 10_000):
        asyncio.run(store.append_entries(sid, entries[start:start + 10_000]))
    path = store.path_for(sid)
    size = path.stat().st_size
    # The same types, and the batch lines the store writes for calls of many entries.
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_WireEntry | _Batch | _Compact)

    def floor() -> int:
        gc.disable()
        try:
            with open(path, "rb") as f:
                data = f.read()
            body = memoryview(data)[data.index(b"\n") + 1:]
            entries: list[Any] = []
            for item in decoder.decode_lines(body):
                if type(item) is _Batch:
                    entries.extend(item.entries)
                else:
                    entries.append(item)
            return len(entries)
        finally:
            gc.enable()

    async def timed() -> tuple[list[float], list[float]]:
        # One event loop for every run, as in an application: the figure is
        # the load (thread hop included), not loop start-up.
        store_t: list[float] = []
        floor_t: list[float] = []
        for _ in range(repeats):
            gc.collect()
            t0 = time.perf_counter()
            count = floor()
            floor_t.append(time.perf_counter() - t0)
            assert count == n, count
            gc.collect()
            t0 = time.perf_counter()
            count = len(await store.load_entries(sid))
            store_t.append(time.perf_counter() - t0)
            assert count == n, count
        return store_t, floor_t

    store_t, floor_t = asyncio.run(timed())

    gc.collect()
    tracemalloc.start()
    log = asyncio.run(store.load_entries(sid))
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(log) == n
    del log
    return {
        "entries": n,
        "file_mb": size / 1e6,
        "store_ms": min(store_t) * 1e3,
        "store_median_ms": statistics.median(store_t) * 1e3,
        "floor_ms": min(floor_t) * 1e3,
        "floor_median_ms": statistics.median(floor_t) * 1e3,
        "ratio": min(store_t) / min(floor_t),
        "peak_mb": peak / 1e6,
        "retained_mb": retained / 1e6,
        "peak_to_file": peak / size,
        "retained_to_file": retained / size,
    }


def _list_floor(root: Path) -> int:
    found = 0
    with os.scandir(root) as it:
        for item in it:
            if item.name.endswith(".jsonl"):
                fd = os.open(item.path, os.O_RDONLY)
                try:
                    found += os.pread(fd, 4096, 0).find(b"\n") > 0
                finally:
                    os.close(fd)
    return found


def bench_list(root: Path, n: int, repeats: int) -> dict[str, Any]:
    root = root / "listing"
    store = FileStore(root, durability="flush")

    async def fill() -> None:
        for start in range(0, n, 500):
            ids = [f"session-{i:06d}" for i in range(start, min(n, start + 500))]
            await asyncio.gather(*(store.create_session(SessionRecord(id=i)) for i in ids))

    asyncio.run(fill())
    body = export_lines(realistic_entries(2))
    for item in os.scandir(root):
        with open(item.path, "ab") as f:
            f.write(body)
    time.sleep(0.2)  # let the directory's mtime settle (see FileStore's _Catalog)

    async def first_page() -> int:
        return len((await FileStore(root).list_sessions(limit=50)).sessions)

    async def all_pages() -> int:
        fresh, cursor, seen = FileStore(root), None, 0
        while True:
            page = await fresh.list_sessions(limit=50, cursor=cursor)
            seen += len(page.sessions)
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    async def after_create(k: int) -> int:
        reader = FileStore(root)
        await reader.list_sessions(limit=50)
        await store.create_session(SessionRecord(id=f"late-{k}"))
        started = time.perf_counter()
        await reader.list_sessions(limit=50)
        return int((time.perf_counter() - started) * 1e9)

    floor_t: list[float] = []
    first_t: list[float] = []
    full_t: list[float] = []
    rescan_t: list[float] = []
    for k in range(repeats):
        started = time.perf_counter()
        assert _list_floor(root) >= n
        floor_t.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert asyncio.run(first_page()) == 50
        first_t.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert asyncio.run(all_pages()) >= n
        full_t.append(time.perf_counter() - started)
        rescan_t.append(asyncio.run(after_create(k)) / 1e9)
    floor = min(floor_t)
    return {
        "sessions": n,
        "floor_ms": floor * 1e3,
        "first_page_ms": min(first_t) * 1e3,
        "first_page_ratio": min(first_t) / floor,
        "all_pages_ms": min(full_t) * 1e3,
        "all_pages_ratio": min(full_t) / floor,
        "rescan_first_page_ms": min(rescan_t) * 1e3,
        "rescan_first_page_ratio": min(rescan_t) / floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", help="directory for the files (default: a temp dir)")
    args = parser.parse_args()
    samples, big, repeats = (50, 10_000, 2) if args.quick else (300, 100_000, 5)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        appends = [bench_append(root, n, samples) for n in (100, 10_000)]
        concurrent = bench_concurrent(root, 8, 50, 3 if args.quick else 9)
        opened = bench_open(root, big, repeats)
        listed = bench_list(root, 2_000 if args.quick else 10_000, repeats)

    machine = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "msgspec": msgspec.__version__,
        "dir": args.dir or tempfile.gettempdir(),
    }
    print(f"FileStore benchmark  ({machine['platform']}, Python {machine['python']}, "
          f"{machine['cpu_count']} CPUs)\n")
    print(f"{'append (1 entry, fsync)':24} {'store p50/p99 ms':>18} {'floor p50/p99 ms':>18} "
          f"{'ratio p50/p99':>14}")
    for a in appends:
        print(f"{'N=' + format(a['entries_before'], ','):24} "
              f"{a['store_p50_ms']:8.3f}/{a['store_p99_ms']:<9.3f} "
              f"{a['floor_p50_ms']:8.3f}/{a['floor_p99_ms']:<9.3f} "
              f"{a['p50_ratio']:6.2f}/{a['p99_ratio']:<7.2f}")
    print(f"\n{'the same, p50':24} {'floor in a thread ms':>21} {'÷ floor':>8} "
          f"{'store ÷ it':>11} {'bare hop ms':>12}")
    for a in appends:
        print(f"{'N=' + format(a['entries_before'], ','):24} "
              f"{a['threaded_floor_p50_ms']:21.3f} {a['threaded_floor_p50_ratio']:8.2f} "
              f"{a['p50_ratio_to_threaded_floor']:11.2f} {a['hop_p50_ms']:12.3f}")
    c = concurrent
    print(f"\n{c['tasks']} tasks x {c['appends'] // c['tasks']} appends to one session, "
          f"{c['rounds']} runs; rate ÷ the serial floor's (one write + fdatasync each, "
          f"{c['floor_per_s']:,.0f}/s)")
    print(f"{'completion path':24} {'min':>6} {'median':>7} {'max':>6} {'appends/fdatasync':>18}")
    for variant, label in (("store", "io_uring where it can"), ("thread", "worker thread")):
        v = c[variant]
        print(f"{label:24} {v['ratio_min']:6.2f} {v['ratio_median']:7.2f} {v['ratio_max']:6.2f} "
              f"{v['appends_per_fdatasync']:18.1f}")
    o = opened
    print(f"\nopen {o['entries']:,} entries ({o['file_mb']:.1f} MB): store {o['store_ms']:.0f} ms, "
          f"floor {o['floor_ms']:.0f} ms, ratio {o['ratio']:.2f}")
    print(f"memory of the loaded session: peak {o['peak_mb']:.0f} MB "
          f"({o['peak_to_file']:.2f}x file), retained {o['retained_mb']:.0f} MB "
          f"({o['retained_to_file']:.2f}x file)")

    li = listed
    print(f"\nlist {li['sessions']:,} sessions: floor (scandir + first line of each) "
          f"{li['floor_ms']:.0f} ms")
    print(f"  first page (50), fresh store   {li['first_page_ms']:8.1f} ms  "
          f"ratio {li['first_page_ratio']:.2f}  (goal <= 2)")
    print(f"  all {li['sessions'] // 50} pages, fresh store     {li['all_pages_ms']:8.1f} ms  "
          f"ratio {li['all_pages_ratio']:.2f}  (goal <= 3)")
    print(f"  first page after a create      {li['rescan_first_page_ms']:8.1f} ms  "
          f"ratio {li['rescan_first_page_ratio']:.2f}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, "append": appends,
                                   "concurrent": concurrent, "open": opened, "list": listed},
                                  indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
