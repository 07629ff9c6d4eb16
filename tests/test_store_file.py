"""FileStore: the conformance suite plus what is particular to files."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
import time
from collections.abc import Awaitable
from pathlib import Path

import msgspec
import pytest

from support.stores import FileHooks, append_raw
from threadline.ai._messages import UserMessage
from threadline.errors import (
    ConfigError,
    CorruptLog,
    DurabilityError,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
)
from threadline.session import MessageEntry, SessionRecord, decode_entry
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry
from threadline.stores import FileStore, Store
from threadline.stores.file._format import encode_init, frame
from threadline.stores.file._store import session_file_name
from threadline.testing import sample_entries
from threadline.testing._conformance import _aclose, assert_same_entries, check_concurrent_log


def encode_entries(entries: list[Entry]) -> bytes:
    """What one append_entries call of ``entries`` adds to a session file."""
    return frame([encode_entry(e) for e in entries])


class TestFileStore(FileHooks):
    async def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "sessions")


class TestFileStoreFlush(FileHooks):
    async def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "sessions", durability="flush")


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _msg(text: str, parent_id: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent_id, message=UserMessage.of(text))


async def test_s8_file_layout_is_init_line_then_one_entry_per_line(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    record = SessionRecord(id="user-42", parent_id="user-41")
    await store.create_session(record)
    path = tmp_path / "user-42.jsonl"
    assert store.path_for("user-42") == path
    assert path.read_bytes() == encode_init(record) + b"\n"
    init = msgspec.json.decode(path.read_bytes())
    assert init["type"] == "session_init"
    assert init["version"] >= 1
    assert (init["id"], init["parent_id"]) == ("user-42", "user-41")
    assert "created_at" in init

    first, second = sample_entries()[:3], sample_entries()[3:]
    await store.append_entries("user-42", first)
    before = path.read_bytes()
    await store.append_entries("user-42", second)
    after = path.read_bytes()
    # Append-only: what was there stays byte for byte; the rest is the codec's lines.
    assert after.startswith(before)
    assert after == encode_init(record) + b"\n" + encode_entries(first) + encode_entries(second)
    assert all(msgspec.json.decode(line)["type"] for line in after.splitlines())
    # Creation leaves no temporary file behind.
    assert _names(tmp_path) == ["user-42.jsonl"]


def test_s8_readable_ids_are_their_own_file_names() -> None:
    for sid in ("a", "user-42", "x_y-z", "0" * 100):
        assert session_file_name(sid) == sid + ".jsonl"
    for sid in ("User-42", "con", "nul", "com1", "lpt9", "0" * 101, "a.b", "a b", "..", "é"):
        name = session_file_name(sid)
        assert name.startswith("="), sid
        assert "/" not in name and "\\" not in name


def test_s8_invalid_session_ids_are_refused() -> None:
    for sid in ("", "\ud800 lone surrogate"):
        with pytest.raises(InvalidSessionId):
            session_file_name(sid)


def test_unknown_durability_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        FileStore(tmp_path, durability="sometimes")  # type: ignore[arg-type]


async def test_s8_session_init_id_is_checked_on_every_open(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="alpha"))
    await store.append_entries("alpha", [_msg("hi")])
    # A file that claims another id (copied by hand, or a bug) is refused.
    shutil.copy(tmp_path / "alpha.jsonl", tmp_path / "beta.jsonl")
    for call in (
        store.load_entries("beta"),
        store.append_entries("beta", [_msg("x")]),
        store.load_session("beta"),
        store.delete_session("beta"),
    ):
        with pytest.raises(CorruptLog) as info:
            await call
        assert info.value.line == 1
        assert info.value.path == str(tmp_path / "beta.jsonl")
    assert (tmp_path / "beta.jsonl").read_bytes() == (tmp_path / "alpha.jsonl").read_bytes()
    page = await store.list_sessions()
    assert [r.id for r in page.sessions] == ["alpha"]
    assert [p.path for p in page.problems] == [str(tmp_path / "beta.jsonl")]


async def test_s44_fsync_failure_cuts_the_append_then_poisons_the_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("kept")])

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(DurabilityError) as info:
        await store.append_entries("s", [_msg("maybe lost")])
    assert info.value.session_id == "s"
    assert "s.jsonl" in str(info.value)
    monkeypatch.undo()
    # Never retried: this handle refuses every later write, even with a healthy disk.
    with pytest.raises(DurabilityError):
        await store.append_entries("s", [_msg("refused")])
    with pytest.raises(DurabilityError):
        await store.create_session(SessionRecord(id="t"))
    with pytest.raises(DurabilityError):
        await store.delete_session("s")
    # Reads still work; the failed append was cut off before the store
    # refused writes, so no handle can find it and take it for stored.
    assert _texts(await store.load_entries("s")) == ["kept"]
    fresh = FileStore(tmp_path)
    await fresh.append_entries("s", [_msg("after reopen")])
    assert _texts(await fresh.load_entries("s")) == ["kept", "after reopen"]


async def test_flush_durability_skips_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))

    def no_sync(fd: int) -> None:
        raise AssertionError("flush durability must not sync")

    monkeypatch.setattr(os, "fdatasync", no_sync)
    monkeypatch.setattr(os, "fsync", no_sync)
    await store.append_entries("s", [_msg("a")])
    await store.create_session(SessionRecord(id="t"))
    assert len(await store.load_entries("s")) == 1


async def test_short_writes_are_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    real_write = os.write
    calls = 0

    def short_write(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        return real_write(fd, bytes(data[:7]))

    entries = sample_entries()
    monkeypatch.setattr(os, "write", short_write)
    await store.append_entries("s", entries)
    monkeypatch.undo()
    assert calls > 100
    assert (tmp_path / "s.jsonl").read_bytes().endswith(encode_entries(entries))


async def test_failed_write_is_undone_and_does_not_poison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("before")])
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
    monkeypatch.undo()
    assert not isinstance(info.value, DurabilityError)
    assert isinstance(info.value.__cause__, OSError)
    assert (tmp_path / "s.jsonl").stat().st_size == size  # all or nothing
    await store.append_entries("s", [_msg("after")])
    assert len(await store.load_entries("s")) == 2


async def test_os_errors_become_store_errors(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    (tmp_path / "root").rmdir()
    (tmp_path / "root").write_bytes(b"")  # the root is now a file: ENOTDIR below it
    with pytest.raises(StoreError) as info:
        await store.load_entries("d")
    assert isinstance(info.value.__cause__, OSError)
    assert "'d'" in str(info.value)


async def test_delete_removes_torn_fragments_too(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    append_raw(tmp_path / "s.jsonl", b'{"type":"message","id":"tor')
    await store.append_entries("s", [_msg("a")])
    assert (tmp_path / "s.jsonl.torn-1").exists()
    await store.delete_session("s")
    assert _names(tmp_path) == []
    with pytest.raises(SessionNotFound):
        await store.load_entries("s")


async def test_list_sessions_ignores_other_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    (tmp_path / "s.jsonl.torn-1").write_bytes(b"junk")
    (tmp_path / ".s.jsonl.123-abc.tmp").write_bytes(b"junk")
    (tmp_path / "notes.txt").write_bytes(b"junk")
    page = await store.list_sessions()
    assert [r.id for r in page.sessions] == ["s"]
    # A deleted and re-created id (which may reuse the inode) is read afresh.
    await store.delete_session("s")
    await store.create_session(SessionRecord(id="s", parent_id="p"))
    assert [r.parent_id for r in (await store.list_sessions()).sessions] == ["p"]


# -- the append path: cached files, group commit --------------------------------


def _open_files_under(root: Path) -> int:
    """How many descriptors of this process point into ``root``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(root) + "/")
    return count


def _texts(entries: list[Entry]) -> list[str]:
    return [e.message.text for e in entries]  # type: ignore[union-attr]


async def test_s8_session_deleted_while_its_file_is_open(tmp_path: Path) -> None:
    store, other = FileStore(tmp_path), FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("one")])  # the store now keeps s open
    await other.delete_session("s")
    with pytest.raises(SessionNotFound):
        await store.append_entries("s", [_msg("into the deleted file")])
    assert _names(tmp_path) == []
    # Re-created under the same id: appends go to the new file, not the old one.
    await other.create_session(SessionRecord(id="s", parent_id="p"))
    await store.append_entries("s", [_msg("two")])
    assert _texts(await other.load_entries("s")) == ["two"]
    assert (await store.load_session("s")).parent_id == "p"
    # Deleting through the same store closes its descriptor first.
    await store.delete_session("s")
    assert _open_files_under(tmp_path) == 0
    with pytest.raises(SessionNotFound):
        await store.append_entries("s", [_msg("three")])


async def test_s8_replaced_file_is_reopened_and_its_id_checked(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for sid in ("s", "t"):
        await store.create_session(SessionRecord(id=sid))
        await store.append_entries(sid, [_msg(sid)])
    path = tmp_path / "s.jsonl"
    # Another session's file moved over s: refused, and left as it is.
    os.replace(tmp_path / "t.jsonl", path)
    moved = path.read_bytes()
    with pytest.raises(CorruptLog) as info:
        await store.append_entries("s", [_msg("x")])
    assert (info.value.path, info.value.line) == (str(path), 1)
    assert path.read_bytes() == moved
    # A valid s file moved into place: appends go to it.
    record = SessionRecord(id="s", parent_id="restored")
    (tmp_path / "new").write_bytes(encode_init(record) + b"\n")
    os.replace(tmp_path / "new", path)
    await store.append_entries("s", [_msg("after restore")])
    assert _texts(await store.load_entries("s")) == ["after restore"]
    # s moved away: the store does not follow it.
    os.rename(path, tmp_path / "elsewhere")
    with pytest.raises(SessionNotFound):
        await store.append_entries("s", [_msg("y")])
    assert (tmp_path / "elsewhere").read_bytes().endswith(b'"after restore"]\n')


async def test_s4_other_writers_between_appends_of_an_open_file(tmp_path: Path) -> None:
    store, other = FileStore(tmp_path), FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("a1")])
    await other.append_entries("s", [_msg("b1")])
    append_raw(tmp_path / "s.jsonl", b'{"type":"message","id":"torn by a')
    await store.append_entries("s", [_msg("a2")])
    await other.append_entries("s", [_msg("b2")])
    await store.append_entries("s", [_msg("a3")])
    log = await other.load_entries("s")
    assert log.diagnostics == []
    assert _texts(log) == ["a1", "b1", "a2", "b2", "a3"]
    assert (tmp_path / "s.jsonl.torn-1").read_bytes() == b'{"type":"message","id":"torn by a'


async def test_no_session_file_stays_open_between_calls(tmp_path: Path) -> None:
    # A deleted session's disk space is freed at once, and a forked child
    # inherits no descriptor that shares this store's locks.
    store = FileStore(tmp_path)
    for n in range(8):
        await store.create_session(SessionRecord(id=f"s{n}"))
        await store.append_entries(f"s{n}", [_msg(str(n))])
        await store.load_entries(f"s{n}")
        assert _open_files_under(tmp_path) == 0
    await store.close()
    await store.append_entries("s0", [_msg("after close")])  # still usable
    assert _texts(await store.load_entries("s0")) == ["0", "after close"]
    await store.close()


def _slow_fdatasync(
    monkeypatch: pytest.MonkeyPatch, fail_on: int | None = None
) -> tuple[list[int], threading.Event]:
    """Make fdatasync slow, so appends queue up behind it.

    Returns the file sizes it made durable, and an event set once the first
    fdatasync has started.
    """
    real = os.fdatasync
    synced: list[int] = []
    started = threading.Event()

    def slow(fd: int) -> None:
        started.set()
        time.sleep(0.1)
        if len(synced) + 1 == fail_on:
            synced.append(-1)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)
        synced.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fdatasync", slow)
    return synced, started


async def _first_then_rest(first: Awaitable[None], rest: list[Awaitable[None]],
                           started: threading.Event) -> list[object]:
    """Run ``first`` until its sync has started, then ``rest`` behind it."""
    head = asyncio.ensure_future(first)
    await asyncio.to_thread(started.wait)
    return await asyncio.gather(head, *rest, return_exceptions=True)


async def test_s8_group_commit_keeps_each_call_whole_in_order_and_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    record = SessionRecord(id="s")
    await store.create_session(record)
    synced, started = _slow_fdatasync(monkeypatch)
    batches = [[_msg(f"{n}.{k}") for k in range(1 + n % 3)] for n in range(20)]
    durable_at_return: dict[int, int] = {}

    async def append(n: int) -> None:
        await store.append_entries("s", batches[n])
        durable_at_return[n] = max(synced)

    # Tasks start in list order, so this is the order the calls are made in.
    results = await _first_then_rest(append(0), [append(n) for n in range(1, 20)], started)
    assert results == [None] * 20
    # The 19 calls made during the first one's sync went out in one write.
    assert len(synced) == 2, synced
    content = (tmp_path / "s.jsonl").read_bytes()
    head = encode_init(record) + b"\n"
    assert content == head + b"".join(encode_entries(b) for b in batches)
    end = len(head)
    for n, batch in enumerate(batches):
        end += len(encode_entries(batch))
        assert durable_at_return[n] >= end, f"call {n} returned before its lines were synced"


@pytest.mark.parametrize("failure", ["write", "fdatasync"])
async def test_s8_group_commit_failure_reaches_every_call_in_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    path = tmp_path / "s.jsonl"
    synced, started = _slow_fdatasync(monkeypatch, fail_on=2 if failure == "fdatasync" else None)
    real_write = os.write
    sizes: list[int] = []

    def write_fails_second_time(fd: int, data: bytes | memoryview) -> int:
        sizes.append(os.fstat(fd).st_size)
        if len(sizes) == 2:
            real_write(fd, bytes(data[:10]))  # part of the group lands, then ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    if failure == "write":
        monkeypatch.setattr(os, "write", write_fails_second_time)
    results = await _first_then_rest(
        store.append_entries("s", [_msg("0")]),
        [store.append_entries("s", [_msg(str(n))]) for n in range(1, 6)],
        started,
    )
    monkeypatch.undo()
    assert results[0] is None  # the first call went alone, before the failure
    expected = DurabilityError if failure == "fdatasync" else StoreError
    assert all(type(r) is expected for r in results[1:]), results
    # The failed write or sync is cut off and the cut synced, so that a power
    # loss cannot bring back whole lines of calls that were told they failed.
    assert synced[-1] == synced[0] and len(synced) == (3 if failure == "fdatasync" else 2)
    if failure == "write":
        # All or nothing for the whole group; the handle is not poisoned.
        assert path.stat().st_size == sizes[1]
        await store.append_entries("s", [_msg("after")])
        assert _texts(await store.load_entries("s")) == ["0", "after"]
    else:
        with pytest.raises(DurabilityError):  # never retried
            await store.append_entries("s", [_msg("refused")])


async def test_s8_a_cancelled_call_does_not_disturb_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    _, started = _slow_fdatasync(monkeypatch)
    tasks = [asyncio.create_task(store.append_entries("s", [_msg(str(n))])) for n in range(4)]
    await asyncio.to_thread(started.wait)  # all four have handed over their lines
    tasks[2].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in done] == [type(None)] * 2 + [asyncio.CancelledError, type(None)]
    # Handed over before the cancel, so written (as with any write a caller
    # stops waiting for); the file stays whole and the store keeps working.
    await store.append_entries("s", [_msg("4")])
    assert _texts(await store.load_entries("s")) == ["0", "1", "2", "3", "4"]


async def test_s34_tasks_appending_in_a_loop_share_each_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    real = os.fdatasync
    synced: list[int] = []

    def counted(fd: int) -> None:
        real(fd)
        synced.append(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
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
    monkeypatch.undo()
    # The callers of a group wake together and call again together, so every
    # round of the 8 tasks is one write and one fdatasync, never split.
    assert len(synced) == rounds
    check_concurrent_log(await store.load_entries("s"), list(acknowledged.values()))
    await store.close()


def test_s34_a_group_wakes_its_callers_on_every_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    real = os.fdatasync
    gate = threading.Event()
    synced: list[int] = []

    def held(fd: int) -> None:
        gate.wait(30)  # the first sync waits until the others have queued
        real(fd)
        synced.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fdatasync", held)

    def run(texts: list[str]) -> None:
        async def go() -> None:
            await asyncio.gather(*(store.append_entries("s", [_msg(t)]) for t in texts))
        asyncio.run(go())

    threads = [threading.Thread(target=run, args=(["first"],))]
    threads[0].start()
    while not synced and store._group._queues.get("s") != []:  # the first write is syncing
        time.sleep(0.001)
    threads += [threading.Thread(target=run, args=([f"{w}.{n}" for n in range(3)],))
                for w in range(3)]
    for t in threads[1:]:
        t.start()
    while len(store._group._queues.get("s") or ()) < 9:  # all nine calls queued behind it
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a caller was never woken"
    monkeypatch.undo()
    # The nine calls of three event loops were one group: one write, one sync.
    assert len(synced) == 2
    assert sorted(_texts(asyncio.run(store.load_entries("s")))) == sorted(
        ["first"] + [f"{w}.{n}" for w in range(3) for n in range(3)])


def test_s34_a_loop_closed_before_it_started_the_worker_blocks_no_one(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    loop = asyncio.new_event_loop()
    task = loop.create_task(store.append_entries("s", [_msg("orphan")]))
    loop.call_soon(loop.stop)  # stops after the call queued, before the worker is started
    loop.run_forever()
    assert not task.done()
    loop.close()
    done = threading.Event()

    def later() -> None:
        asyncio.run(store.append_entries("s", [_msg("later")]))
        done.set()

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    assert done.wait(30), "an append waited for a worker a closed loop was to start"
    # The orphaned call was handed over, so it is written, like any call a
    # caller stops waiting for.
    assert _texts(asyncio.run(store.load_entries("s"))) == ["orphan", "later"]


def test_s4_one_store_shared_by_threads_with_their_own_event_loops(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    acknowledged: dict[int, list[str]] = {}

    def writer(w: int) -> None:
        async def run() -> None:
            parent = None
            for n in range(25):
                entry = _msg(f"{w}.{n}", parent)
                await store.append_entries("s", [entry])
                acknowledged.setdefault(w, []).append(entry.id)
                parent = entry.id

        asyncio.run(run())

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_concurrent_log(asyncio.run(store.load_entries("s")), list(acknowledged.values()))


async def test_s8_a_refused_call_in_a_group_commit_fails_alone(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    first = _msg("first")
    await store.append_entries("s", [first])
    good = [[_msg(f"good {n}")] for n in range(6)]
    repeat = msgspec.structs.replace(first, message=UserMessage.of("again"))
    results = await asyncio.gather(
        *(store.append_entries("s", batch) for batch in good[:3]),
        store.append_entries("s", [_msg("with it"), repeat]),
        *(store.append_entries("s", batch) for batch in good[3:]),
        return_exceptions=True)
    assert [type(r) for r in results] == [type(None)] * 3 + [StoreError] + [type(None)] * 3
    loaded = [e.id for e in await store.load_entries("s")]
    assert loaded[0] == first.id and sorted(loaded[1:]) == sorted(b[0].id for b in good)
    # Another handle (another process, in effect) learns the ids from the file:
    # the same entry again is a retry and stores nothing; other bytes under
    # its id are refused.
    other = FileStore(tmp_path)
    await other.append_entries("s", [good[4][0]])
    changed = msgspec.structs.replace(good[4][0], message=UserMessage.of("changed"))
    with pytest.raises(StoreError, match="repeats an entry id"):
        await other.append_entries("s", [changed])
    assert [e.id for e in await other.load_entries("s")] == loaded


async def test_s25_the_ids_a_load_kept_judge_the_next_append(tmp_path: Path) -> None:
    writer = FileStore(tmp_path)
    await writer.create_session(SessionRecord(id="s"))
    stored = [_msg(f"{n}") for n in range(5)]
    await writer.append_entries("s", stored)
    path = tmp_path / "s.jsonl"
    reader = FileStore(tmp_path)
    await reader.load_entries("s")  # its first append uses the ids of this load
    size = path.stat().st_size
    changed = msgspec.structs.replace(stored[2], message=UserMessage.of("changed"))
    with pytest.raises(StoreError, match="repeats an entry id"):
        await reader.append_entries("s", [_msg("new"), changed])
    await reader.append_entries("s", stored[3:])  # a retry of a stored run: nothing written
    assert path.stat().st_size == size
    await reader.append_entries("s", [_msg("after")])
    assert _texts(await writer.load_entries("s")) == ["0", "1", "2", "3", "4", "after"]


async def test_s8_a_retry_in_the_same_group_commit_as_its_original_succeeds(
    tmp_path: Path,
) -> None:
    # The retry's original is not on disk yet when the group is admitted: it
    # is compared with the lines about to be written, not with the file.
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("first")])
    batch = [_msg("a"), _msg("b")]
    changed = [batch[0], msgspec.structs.replace(batch[1], message=UserMessage.of("c"))]
    results = await asyncio.gather(
        store.append_entries("s", [_msg("x")]), store.append_entries("s", batch),
        store.append_entries("s", batch), store.append_entries("s", batch[1:]),
        store.append_entries("s", changed), return_exceptions=True)
    assert [type(r) for r in results] == [type(None)] * 4 + [StoreError]
    loaded = await FileStore(tmp_path).load_entries("s")
    assert [e.id for e in loaded[2:]] == [e.id for e in batch]
    assert_same_entries(loaded[2:], batch)


async def test_s8_ids_in_batch_lines_count_beside_lines_that_do_not_decode(
    tmp_path: Path,
) -> None:
    # The id index reads lines it cannot decode one by one; the ids inside a
    # batch line still count then, and a field named "entries" on an entry
    # of an unknown type does not hide that entry's id.
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    pair = [_msg("one")]
    pair.append(_msg("two", pair[0].id))
    await store.append_entries("s", pair)
    path = store.path_for("s")
    assert path.read_bytes().splitlines()[1].startswith(b'{"type":"batch","entries":[')
    append_raw(path, b'{"type":"message","id":"cut short\n'
                     b'{"type":"from.the.future","id":"future-1","entries":5}\n')
    repeats = [msgspec.structs.replace(e, message=UserMessage.of("changed")) for e in pair]
    repeats.append(decode_entry(b'{"type":"from.the.future","id":"future-1","v":2}'))
    for handle in (store, FileStore(tmp_path)):  # lines read since, and a whole file
        for repeat in repeats:
            with pytest.raises(StoreError, match="repeats an entry id"):
                await handle.append_entries("s", [_msg("new"), repeat])
    assert path.read_bytes().count(b"\n") == 4  # nothing was appended


async def test_s17_a_store_opened_without_create_reads_and_writes_the_root(
    tmp_path: Path,
) -> None:
    # create=False only refuses a missing folder; an existing one is served
    # from the root resolved once, like any other store.
    await FileStore(tmp_path).create_session(SessionRecord(id="s"))
    reader = FileStore(tmp_path, create=False)
    assert list(await reader.load_entries("s")) == []
    await reader.append_entries("s", [_msg("hello")])
    assert [r.id for r in (await reader.list_sessions()).sessions] == ["s"]
    assert len(await FileStore(tmp_path).load_entries("s")) == 1
    with pytest.raises(StoreError, match="does not exist"):
        FileStore(tmp_path / "nowhere", create=False)
    assert not (tmp_path / "nowhere").exists()


def _as_version(path: Path, version: int) -> None:
    """Mark a fresh session file as written by an older format version."""
    data = path.read_bytes()
    assert b'"version":3' in data.split(b"\n", 1)[0]
    path.write_bytes(data.replace(b'"version":3', b'"version":%d' % version, 1))


async def test_s25_a_retry_is_checked_against_the_batch_line_and_v1_lines(
    tmp_path: Path,
) -> None:
    # A call of several entries is one batch line (format 2), or one line per
    # entry (a version 1 file): either way the retry, or the retry of a run of
    # it, is the same bytes in the file's order and stores nothing, while a
    # changed entry, a skip or another order is refused.
    for version in (3, 2, 1):
        store = FileStore(tmp_path / f"v{version}")
        await store.create_session(SessionRecord(id="s"))
        if version < 3:
            _as_version(store.path_for("s"), version)
        batch = [_msg("a")]
        batch += [_msg("b", batch[0].id), _msg("c")]
        await store.append_entries("s", [_msg("before")])
        await store.append_entries("s", batch)
        path = store.path_for("s")
        size = path.stat().st_size
        assert (path.read_bytes().count(b"\n") == 3) is (version >= 2)
        assert (b'\n["' in path.read_bytes()) is (version == 3)  # compact message lines
        for handle in (store, FileStore(tmp_path / f"v{version}")):  # offsets known, or not
            for retry in (batch, batch[1:], batch[:2], [batch[1]]):
                await handle.append_entries("s", retry)
            changed = msgspec.structs.replace(batch[2], message=UserMessage.of("changed"))
            for conflict in ([batch[0], batch[2]], [batch[1], batch[0]], [*batch[:2], changed]):
                with pytest.raises(StoreError, match="not a retry"):
                    await handle.append_entries("s", conflict)
        assert path.stat().st_size == size
        assert_same_entries((await FileStore(tmp_path / f"v{version}").load_entries("s"))[1:],
                            batch)


async def test_s26_file_watch_resumes_inside_a_batch_line_and_waits_for_a_torn_line(
    tmp_path: Path,
) -> None:
    # One line may hold a whole call's entries: a watcher yields them one by
    # one, resumes after any of them, and reads a line only once it is whole.
    store = FileStore(tmp_path)
    store.watch_interval = 0.01
    await store.create_session(SessionRecord(id="s"))
    batch = [_msg(str(n)) for n in range(5)]
    await store.append_entries("s", batch)
    for entry in list(batch):
        watch = store.watch("s", after=entry.id)
        later = [_msg(f"after {entry.id}")]
        await store.append_entries("s", later)
        rest = batch[batch.index(entry) + 1:] + later
        got = [await anext(watch) for _ in rest]
        await _aclose(watch)
        assert [e.id for e in got] == [e.id for e in rest]
        batch += later
    path = store.path_for("s")
    watch = store.watch("s", after=batch[-1].id)
    pending = asyncio.ensure_future(anext(watch))
    append_raw(path, b'{"type":"batch","entries":[{"type":"message","id":"to')
    await asyncio.sleep(0.1)
    assert not pending.done()  # a line still being written is not read
    pair = [_msg("x"), _msg("y")]
    await store.append_entries("s", pair)  # cuts the torn tail off first
    assert (await pending).id == pair[0].id
    assert (await anext(watch)).id == pair[1].id
    await _aclose(watch)
