"""S44: the file store's fsync'd appends with their fdatasync through io_uring, no worker thread.

Where the kernel lets the process set up a ring, an append writes its lines
from the event loop and submits the fdatasync to the ring, which reports
through the ring's own descriptor. These tests check that path does what the worker does:
the same bytes, one sync per group, the same errors, and that whatever the
loop cannot do without waiting (another process's lock, a torn tail, much
catching up with other writers) goes to the worker. A failed sync is
injected at the ring's boundary (``Ring.fdatasync``); a full disk is real (a
small tmpfs).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require_or_skip
from threadline.ai._messages import UserMessage
from threadline.errors import DurabilityError, StoreError
from threadline.session import FileStore, MessageEntry, SessionRecord, _uring

Done = Callable[[int], object]
Submit = Callable[[Any, int, Done], None]


def _msg(text: str, parent_id: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent_id, message=UserMessage.of(text))


def _texts(entries: Any) -> list[str]:
    return [e.message.text for e in entries]


@pytest.fixture(autouse=True)
def ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests need the ring: skipped where the kernel refuses it, failed under CI."""
    monkeypatch.delenv("THREADLINE_IO_URING", raising=False)

    async def probe() -> str | None:
        return None if _uring.ring_for(asyncio.get_running_loop()) else _uring._shared.unusable

    why = asyncio.run(probe())
    if why is not None:
        require_or_skip(f"no io_uring on this machine: {why}")


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file size at every fdatasync handed to the ring; and os.fdatasync must not run."""
    sizes: list[int] = []
    real: Submit = _uring.Ring.fdatasync

    def counted(self: Any, fd: int, done: Done) -> None:
        sizes.append(os.fstat(fd).st_size)
        real(self, fd, done)

    def no_thread_sync(fd: int) -> None:
        raise AssertionError("an append took the worker's fdatasync")

    monkeypatch.setattr(_uring.Ring, "fdatasync", counted)
    monkeypatch.setattr(os, "fdatasync", no_thread_sync)
    return sizes


async def _started(tmp_path: Path, session_id: str = "s") -> FileStore:
    """A store with the session open for appending."""
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id=session_id))
    await store.append_entries(session_id, [_msg("first")])
    return store


Wait = Callable[[Any, int], "asyncio.Future[int]"]


def _patch_ring(monkeypatch: pytest.MonkeyPatch,
                wrap: Callable[[Wait, Any, int], Awaitable[int]]) -> None:
    """Put ``wrap`` between the store and the ring: it may delay or change a sync's report."""
    submit: Submit = _uring.Ring.fdatasync

    def real(ring: Any, fd: int) -> asyncio.Future[int]:  # Ring.wait would call the patch
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        submit(ring, fd, future.set_result)
        return future

    def patched(self: Any, fd: int, done: Done) -> None:
        report = asyncio.ensure_future(wrap(real, self, fd))
        report.add_done_callback(lambda t: None if t.cancelled() else done(t.result()))

    monkeypatch.setattr(_uring.Ring, "fdatasync", patched)


async def test_s44_appends_are_written_and_synced_through_the_ring(
    tmp_path: Path, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    parent = None
    for n in range(20):
        entry = _msg(f"m{n}", parent)
        await store.append_entries("s", [entry])
        parent = entry.id
    assert len(submitted) == 21  # a new session's first append too
    assert _texts(await store.load_entries("s")) == ["first"] + [f"m{n}" for n in range(20)]
    await store.close()


async def _first_step(call: Coroutine[Any, Any, None]) -> Callable[[], Awaitable[None]]:
    """Run ``call`` up to where it first waits; what finishes it."""
    waiting = call.send(None)  # the future the call awaits
    settled = asyncio.get_running_loop().create_future()
    waiting.add_done_callback(lambda _: settled.set_result(None))

    async def finish() -> None:
        await settled
        with pytest.raises(StopIteration):
            call.send(None)

    return finish


async def test_s44_an_idle_sessions_append_is_written_within_the_call_if_nothing_else_is_due(
    tmp_path: Path, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)  # the session's last group settles: it is idle
    path = store.path_for("s")
    size = path.stat().st_size
    assert _uring.alone(loop)
    finish = await _first_step(store.append_entries("s", [_msg("at once")]))
    # Written and its sync submitted before the call first waited: nothing
    # else was due, so no other task could have joined it a turn later.
    assert path.stat().st_size > size and len(submitted) == 2
    await finish()
    # With something else due, the write waits that turn (S34's groups).
    await asyncio.sleep(0)
    size = path.stat().st_size
    loop.call_soon(lambda: None)
    finish = await _first_step(store.append_entries("s", [_msg("a turn later")]))
    assert path.stat().st_size == size and len(submitted) == 2
    await finish()
    assert _texts(await store.load_entries("s")) == ["first", "at once", "a turn later"]
    await store.close()


async def test_s44_tasks_appending_in_a_loop_share_each_ring_sync(
    tmp_path: Path, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    tasks, rounds = 8, 25
    acknowledged: dict[int, list[str]] = {}

    async def writer(w: int) -> None:
        parent = None
        for n in range(rounds):
            entry = _msg(f"{w}.{n}", parent)
            await store.append_entries("s", [entry])
            acknowledged.setdefault(w, []).append(entry.id)
            parent = entry.id

    await asyncio.gather(*(writer(w) for w in range(tasks)))
    assert len(submitted) == 1 + rounds  # one write + fdatasync per round of the 8 tasks
    texts = _texts(await store.load_entries("s"))
    assert sorted(texts[1:]) == sorted(f"{w}.{n}" for w in range(tasks) for n in range(rounds))
    for w in range(tasks):  # each writer's entries in the order it made them
        mine = [t for t in texts if t.startswith(f"{w}.")]
        assert mine == [f"{w}.{n}" for n in range(rounds)]
    await store.close()


async def test_s44_a_failed_sync_poisons_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)

    async def sync_fails(real: Wait, ring: Any, fd: int) -> int:
        await real(ring, fd)
        return -errno.EIO

    _patch_ring(monkeypatch, sync_fails)
    with pytest.raises(DurabilityError) as info:
        await store.append_entries("s", [_msg("maybe lost")])
    assert info.value.session_id == "s"
    assert "s.jsonl" in str(info.value) and "Input/output error" in str(info.value)
    monkeypatch.undo()
    with pytest.raises(DurabilityError):  # never retried on this handle
        await store.append_entries("s", [_msg("refused")])
    fresh = FileStore(tmp_path)
    await fresh.append_entries("s", [_msg("after reopen")])
    assert _texts(await fresh.load_entries("s")) == ["first", "maybe lost", "after reopen"]


async def test_s44_short_writes_on_the_loop_are_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    real_write = os.write
    calls = 0

    def short_write(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short_write)
    await store.append_entries("s", [_msg("x" * 500), _msg("y" * 500)])
    monkeypatch.setattr(os, "write", real_write)
    assert calls > 100
    assert submitted[-1] == (tmp_path / "s.jsonl").stat().st_size  # synced after the last piece
    assert _texts(await FileStore(tmp_path).load_entries("s")) == ["first", "x" * 500, "y" * 500]


async def test_s44_a_failed_write_is_undone_and_does_not_poison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    size = (tmp_path / "s.jsonl").stat().st_size
    real_write = os.write
    calls = 0

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # half the batch lands, then the disk is full
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(StoreError) as info:
        await store.append_entries("s", [_msg("x" * 1000), _msg("y" * 1000)])
    monkeypatch.setattr(os, "write", real_write)
    assert not isinstance(info.value, DurabilityError)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert (tmp_path / "s.jsonl").stat().st_size == size  # all or nothing
    await store.append_entries("s", [_msg("after")])
    assert _texts(await store.load_entries("s")) == ["first", "after"]
    assert len(submitted) == 2  # nothing synced for the failed one


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs: writes through the ring meet a real ENOSPC."""
    where = tmp_path / "small"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        require_or_skip(f"cannot mount a tmpfs here (needs root): {exc}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_s44_a_full_disk_leaves_the_session_as_it_was(small_disk: Path) -> None:
    store = await _started(small_disk)
    size = (small_disk / "s.jsonl").stat().st_size
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # fill the disk, then leave less room than the append needs
        with pytest.raises(OSError) as full:
            while True:
                os.write(fd, b"\0" * 4096)
        assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, filler.stat().st_size - 6000)
    with pytest.raises(StoreError) as info:
        await store.append_entries("s", [_msg("x" * 5000), _msg("y" * 5000)])
    assert not isinstance(info.value, DurabilityError)
    assert "s.jsonl" in str(info.value)
    assert (small_disk / "s.jsonl").stat().st_size == size  # all or nothing
    filler.unlink()
    await store.append_entries("s", [_msg("after")])
    assert _texts(await FileStore(small_disk).load_entries("s")) == ["first", "after"]
    await store.close()


def _hold_lock(path: Path, held: Any, release: Any) -> None:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held.set()
    release.wait(30)
    os.close(fd)


async def test_s44_another_process_holding_the_lock_never_blocks_the_loop(
    tmp_path: Path
) -> None:
    store = await _started(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path / "s.jsonl", held, release))
    holder.start()
    try:
        await asyncio.to_thread(held.wait, 30)
        append = asyncio.ensure_future(store.append_entries("s", [_msg("behind the lock")]))
        ticks = 0
        for _ in range(20):  # the loop keeps running while a worker waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not append.done()
        release.set()
        await asyncio.wait_for(append, 30)
        assert ticks == 20
    finally:
        release.set()
        holder.join(30)
    await store.append_entries("s", [_msg("after")])  # and back on the ring
    assert _texts(await store.load_entries("s")) == ["first", "behind the lock", "after"]


def _append_elsewhere(root: Path, text: str) -> None:
    """Append one entry from another process, as another program's writer would."""
    code = ("import asyncio, sys\n"
            "from threadline.ai._messages import UserMessage\n"
            "from threadline.session import FileStore, MessageEntry\n"
            "asyncio.run(FileStore(sys.argv[1]).append_entries('s', "
            "[MessageEntry(parent_id=None, message=UserMessage.of(sys.argv[2]))]))\n")
    subprocess.run([sys.executable, "-c", code, str(root), text], check=True, timeout=60)


async def test_s44_lines_of_another_process_are_learned_on_the_loop_or_by_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)
    rings: list[int] = []
    threads: list[int] = []
    real_ring: Submit = _uring.Ring.fdatasync
    real_sync = os.fdatasync

    def ring_counted(self: Any, fd: int, done: Done) -> None:
        rings.append(fd)
        real_ring(self, fd, done)

    def thread_counted(fd: int) -> None:
        threads.append(fd)
        real_sync(fd)

    monkeypatch.setattr(_uring.Ring, "fdatasync", ring_counted)
    monkeypatch.setattr(os, "fdatasync", thread_counted)
    _append_elsewhere(tmp_path, "theirs, short")
    await store.append_entries("s", [_msg("mine")])
    assert (len(rings), len(threads)) == (1, 0)  # a few lines to learn: read on the loop
    _append_elsewhere(tmp_path, "theirs, long " + "x" * 70_000)
    await store.append_entries("s", [_msg("mine again")])
    assert (len(rings), len(threads)) == (1, 1)  # 70 kB to learn: a worker read and wrote
    await store.append_entries("s", [_msg("and again")])
    assert (len(rings), len(threads)) == (2, 1)
    assert [t[:14] for t in _texts(await store.load_entries("s"))] == [
        "first", "theirs, short", "mine", "theirs, long x", "mine again", "and again"]


async def _slow_ring(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold each ring write's report until ``go`` is set; ``inflight`` is set once one is."""
    inflight, go = asyncio.Event(), asyncio.Event()

    async def held(real: Wait, ring: Any, fd: int) -> int:
        result = await real(ring, fd)
        inflight.set()
        await go.wait()
        return result

    _patch_ring(monkeypatch, held)
    return inflight, go


def test_s44_a_loop_shutting_down_mid_write_leaves_the_store_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = asyncio.run(_started(tmp_path))
    outcome: list[BaseException | None] = []

    async def main() -> None:
        inflight, _ = await _slow_ring(monkeypatch)

        async def append() -> None:
            try:
                await store.append_entries("s", [_msg("in flight")])
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
                raise

        asyncio.get_running_loop().create_task(append())
        await inflight.wait()
        # main returns: asyncio.run cancels the append and closes the loop mid-sync

    asyncio.run(main())
    monkeypatch.undo()
    assert len(outcome) == 1 and isinstance(outcome[0], asyncio.CancelledError)

    async def later() -> list[str]:
        await asyncio.wait_for(store.append_entries("s", [_msg("later")]), 10)
        return _texts(await store.load_entries("s"))

    texts = asyncio.run(later())
    # The lines were written before the sync was handed over; the cancelled caller
    # cannot know whether they are stored, and a retry would be stored once (S25).
    assert texts == ["first", "in flight", "later"]


def test_s44_a_loop_closed_mid_write_does_not_strand_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = asyncio.run(_started(tmp_path))
    loop = asyncio.new_event_loop()
    started: list[asyncio.Task[None]] = []

    async def start() -> None:
        inflight, _ = await _slow_ring(monkeypatch)
        started.append(loop.create_task(store.append_entries("s", [_msg("abandoned")])))
        await inflight.wait()

    loop.run_until_complete(start())
    loop.close()  # without running the writer to its end: it never runs again
    monkeypatch.undo()

    async def elsewhere() -> None:  # any append of the store takes the session over
        await store.create_session(SessionRecord(id="t"))
        await store.append_entries("t", [_msg("elsewhere")])

    asyncio.run(elsewhere())
    fd = os.open(tmp_path / "s.jsonl", os.O_RDWR)
    try:  # the abandoned descriptor is closed: another process can lock the file
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)

    async def later() -> list[str]:
        await asyncio.wait_for(store.append_entries("s", [_msg("later")]), 10)
        return _texts(await store.load_entries("s"))

    assert asyncio.run(later()) == ["first", "abandoned", "later"]


def test_s44_calls_from_several_loops_are_all_written(tmp_path: Path) -> None:
    store = asyncio.run(_started(tmp_path))
    acknowledged: dict[int, list[str]] = {}

    def writer(w: int) -> None:
        async def run() -> None:
            parent = None
            for n in range(30):
                entry = _msg(f"{w}.{n}", parent)
                await store.append_entries("s", [entry])
                acknowledged.setdefault(w, []).append(entry.id)
                parent = entry.id

        asyncio.run(run())

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    log = asyncio.run(store.load_entries("s"))
    assert sum(len(v) for v in acknowledged.values()) == 120
    assert len(log) == 121


def _append_in_child(store: FileStore, conn: Any) -> None:
    try:
        async def run() -> None:
            await store.append_entries("child", [_msg("from the child")])
        asyncio.run(run())
        conn.send("ok")
    except BaseException as exc:
        conn.send(repr(exc))


async def test_s44_a_forked_child_sets_up_its_own_ring(
    tmp_path: Path, submitted: list[int]
) -> None:
    store = await _started(tmp_path)
    await store.create_session(SessionRecord(id="child"))
    await store.append_entries("child", [_msg("parent first")])
    await store.append_entries("s", [_msg("parent")])
    assert submitted
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_append_in_child, args=(store, child_end))
    start = time.monotonic()
    child.start()
    assert await asyncio.to_thread(parent_end.recv) == "ok"
    child.join(30)
    assert time.monotonic() - start < 30
    await store.append_entries("s", [_msg("parent again")])  # the parent's ring still works
    assert _texts(await store.load_entries("s")) == ["first", "parent", "parent again"]
    assert _texts(await store.load_entries("child")) == ["parent first", "from the child"]


async def test_s44_a_ring_whose_descriptor_never_reports_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop waits for every sync by polling the ring's descriptor. A
    # kernel whose ring never polled readable would leave each append
    # waiting for ever: a new ring's no-op must be reported, or the ring is
    # refused and the stores keep their worker thread.
    monkeypatch.setattr(_uring, "_shared", _uring._Shared())
    waited: list[float] = []

    def never(read: list[int], write: list[int], error: list[int],
              timeout: float) -> tuple[list[int], list[int], list[int]]:
        waited.append(timeout)
        return [], [], []

    monkeypatch.setattr(_uring, "select", types.SimpleNamespace(select=never))
    open_fds = len(os.listdir("/proc/self/fd"))
    assert _uring.ring_for(asyncio.get_running_loop()) is None
    assert waited == [_uring._PROBE_WAIT]
    assert "did not report a completed no-op" in (_uring._shared.unusable or "")
    assert len(os.listdir("/proc/self/fd")) == open_fds  # the refused ring is closed
    synced: list[int] = []
    real_sync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_sync(fd)))
    store = await _started(tmp_path)
    await store.append_entries("s", [_msg("through the worker")])
    assert len(synced) >= 2  # each append's sync, by the worker
    assert _texts(await store.load_entries("s")) == ["first", "through the worker"]
    await store.close()


async def test_s44_turned_off_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THREADLINE_IO_URING", "0")
    synced: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    def no_ring(*args: Any) -> Any:
        raise AssertionError("the ring was used with THREADLINE_IO_URING=0")

    monkeypatch.setattr(os, "fdatasync", counted)
    monkeypatch.setattr(_uring.Ring, "fdatasync", no_ring)
    store = await _started(tmp_path)
    await store.append_entries("s", [_msg("second")])
    assert len(synced) == 2


async def test_s44_a_big_batch_and_a_torn_tail_are_a_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _started(tmp_path)
    rings: list[int] = []
    threads: list[int] = []
    real_ring: Submit = _uring.Ring.fdatasync
    real_sync = os.fdatasync

    def ring_counted(self: Any, fd: int, done: Done) -> None:
        rings.append(fd)
        real_ring(self, fd, done)

    def thread_counted(fd: int) -> None:
        threads.append(fd)
        real_sync(fd)

    monkeypatch.setattr(_uring.Ring, "fdatasync", ring_counted)
    monkeypatch.setattr(os, "fdatasync", thread_counted)
    await store.append_entries("s", [_msg("z" * 300_000), _msg("w" * 300_000)])
    assert (len(rings), len(threads)) == (0, 1)  # 600 kB: not copied on the loop
    fd = os.open(tmp_path / "s.jsonl", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'{"type":"message","id":"torn')  # a crashed writer's torn line
    os.close(fd)
    await store.append_entries("s", [_msg("after the tear")])
    assert (len(rings), len(threads)) == (0, 2)  # set aside and fsync'd by a worker
    assert [n for n in os.listdir(tmp_path) if n.startswith("s.jsonl.torn-")]
    await store.append_entries("s", [_msg("and on")])
    assert (len(rings), len(threads)) == (1, 2)
    assert [t[:6] for t in _texts(await store.load_entries("s"))] == [
        "first", "z" * 6, "w" * 6, "after ", "and on"]


async def test_s44_more_syncs_in_flight_than_the_ring_has_room_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ring of 8 completion slots, made for this test's loop: 60 sessions'
    # syncs at once overflow it, and the kernel holds the rest until reaped.
    monkeypatch.setattr(_uring, "_ENTRIES", 4)
    monkeypatch.setattr(_uring, "_CQ_ENTRIES", 8)
    store = FileStore(tmp_path)
    sids = [f"s{n}" for n in range(60)]
    for sid in sids:
        await store.create_session(SessionRecord(id=sid))
    for _ in range(3):
        await asyncio.wait_for(asyncio.gather(*(
            store.append_entries(sid, [_msg(sid)]) for sid in sids)), 30)
    ring = _uring.ring_for(asyncio.get_running_loop())
    assert ring is not None and not ring._pending
    for sid in sids:
        assert _texts(await store.load_entries(sid)) == [sid] * 3
    await store.close()


def test_s44_a_failing_report_does_not_keep_the_others_from_theirs(tmp_path: Path) -> None:
    # Completions are reported by callbacks straight from the ring's reader:
    # one that raises must not strand the completions reaped after it. The
    # kernel's workers finish syncs in any order, so the failing one is made
    # to complete first, and all three wait in the ring for one reap (the
    # loop never runs here, so nothing else reaps them).
    loop = asyncio.new_event_loop()
    ring = _uring.ring_for(loop)
    assert ring is not None
    handled: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: handled.append(context["exception"]))
    fds = [os.open(tmp_path / f"f{n}", os.O_WRONLY | os.O_CREAT, 0o644) for n in range(3)]
    reported: list[int] = []

    def broken(result: int) -> None:
        raise RuntimeError("a report that fails")

    def wait_completed(n: int) -> None:
        deadline = time.monotonic() + 30
        while (_uring._U32.unpack_from(ring._rings, ring._cq_tail)[0]
               - _uring._U32.unpack_from(ring._rings, ring._cq_head)[0]) & 0xFFFFFFFF < n:
            assert time.monotonic() < deadline, f"fewer than {n} syncs completed"
            time.sleep(0.001)

    try:
        ring.fdatasync(fds[0], broken)
        wait_completed(1)
        ring.fdatasync(fds[1], reported.append)
        ring.fdatasync(fds[2], reported.append)
        wait_completed(3)
        ring._reap()
        assert reported == [0, 0]
        assert [str(e) for e in handled] == ["a report that fails"]
    finally:
        for fd in fds:
            os.close(fd)
        # As ring_for retires a ring: out of the registry first, or a later
        # fork's child would close its file numbers again, reused by then.
        _uring._shared.rings.pop(loop).close()
        loop.close()
