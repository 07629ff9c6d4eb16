"""Session-layer edges: the batch format (S14), foreign lines (S15), what may be
stored and what a load does with what may not (S16), and the file store's
flush-mode write path never waiting on a lock in the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest

from support.stores import say_before_big_writes, until
from threadline import durable
from threadline.ai._messages import AssistantMessage, ToolCall, UserMessage
from threadline.durable import SessionForked
from threadline.errors import CorruptLog, SessionExists
from threadline.session import (
    FORMAT_VERSION,
    CustomEntry,
    MessageEntry,
    SessionRecord,
    decode_entry,
    encode_entry,
)
from threadline.session._codec import compact_line
from threadline.session._entries import Entry
from threadline.stores import FileStore, MemoryStore, SQLiteStore, Store, copy_sessions
from threadline.stores.file import decode_lines
from threadline.stores.file._format import encode_init
from threadline.testing import FaultyStore


def _msg(text: str, parent_id: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent_id, message=UserMessage.of(text))


def _chain(n: int, text: str = "entry") -> list[Entry]:
    out: list[Entry] = []
    for k in range(n):
        out.append(_msg(f"{text} {k}", out[-1].id if out else None))
    return out


# -- the batch format (S14) ---------------------------------------------------------


async def test_s14_one_call_of_many_entries_is_one_batch_line(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    single, several = _chain(1), _chain(3)
    await store.append_entries("s", single)
    await store.append_entries("s", several)
    first, one, batch = (tmp_path / "s.jsonl").read_bytes().splitlines()
    assert msgspec.json.decode(first)["version"] == FORMAT_VERSION == 3
    assert one == compact_line(encode_entry(single[0]))  # a single entry pays no framing bytes
    assert batch == (b'{"type":"batch","entries":['
                     + b",".join(compact_line(encode_entry(e)) for e in several) + b"]}")
    assert [encode_entry(e) for e in await store.load_entries("s")] == [
        encode_entry(e) for e in single + several
    ]
    # The public decoder reads the same body.
    assert decode_lines(one + b"\n" + batch) == list(await store.load_entries("s"))


async def test_s14_version_1_file_loads_unchanged_and_gets_one_line_per_entry(
    tmp_path: Path,
) -> None:
    old = [_msg("written by version 1"), _msg("still readable")]
    head = (b'{"type":"session_init","version":1,"id":"old","parent_id":null,'
            b'"created_at":"2024-01-01T00:00:00Z"}\n')
    body = b"".join(encode_entry(e) + b"\n" for e in old)
    path = tmp_path / "old.jsonl"
    path.write_bytes(head + body)
    store = FileStore(tmp_path)
    assert [encode_entry(e) for e in await store.load_entries("old")] == [
        encode_entry(e) for e in old
    ]
    new = _chain(3, "appended later")
    await store.append_entries("old", new)
    # A version 1 reader cannot read batch lines, so its files get plain lines.
    assert path.read_bytes() == head + body + b"".join(encode_entry(e) + b"\n" for e in new)
    assert len(await store.load_entries("old")) == 5


async def test_s14_failed_fork_leaves_an_empty_child_and_retrying_finishes_it() -> None:
    inner = MemoryStore()
    faulty = FaultyStore(inner, fail_append_on=2)
    heard: list[Any] = []
    agent = await durable.open(None, store=faulty, session_id="src", publisher=heard.append)
    await agent.append(*[UserMessage.of(f"m{k}") for k in range(5)])
    heard.clear()
    with pytest.raises(Exception, match="injected fault"):
        await agent.fork("kid")
    assert heard == []
    assert list(await inner.load_entries("kid")) == []
    child = await agent.fork("kid")  # the same id again: finishes the fork
    assert [getattr(e, "origin_id", None) for e in child.entries] == [
        e.id for e in agent.path()
    ]
    assert [type(e) for e in heard] == [SessionForked, durable.SessionCreated]
    assert len(await inner.load_entries("kid")) == 5
    # A complete copy left by a fork that died before it returned is taken as is.
    again = await agent.fork("kid")
    assert [e.id for e in again.entries] == [e.id for e in child.entries]
    assert len(await inner.load_entries("kid")) == 5


async def test_s14_fork_into_a_session_it_did_not_leave_says_what_to_do() -> None:
    store = MemoryStore()
    agent = await durable.open(None, store=store, session_id="src")
    await agent.append(UserMessage.of("hello"))
    await store.create_session(SessionRecord(id="taken"))
    with pytest.raises(SessionExists, match="choose another id, or delete"):
        await agent.fork("taken")
    other = await durable.open(None, store=store, session_id="other")
    await other.append(UserMessage.of("something else"))
    await other.fork("its-child")
    with pytest.raises(SessionExists, match="parent_id is 'other'"):
        await agent.fork("its-child")


def _fork_child(root: str, fd: int) -> None:
    """Fork "big"; say "w" just before the store writes the copy (so the kill lands in it)."""
    say_before_big_writes(fd)

    async def run() -> None:
        agent = await durable.open(None, store=FileStore(root), session_id="big")
        await agent.fork(f"kid-{os.getpid()}")

    asyncio.run(run())


def test_s14_fork_killed_mid_copy_leaves_no_partial_child(tmp_path: Path) -> None:
    async def setup() -> None:
        agent = await durable.open(None, store=FileStore(tmp_path), session_id="big")
        await agent.append(*[UserMessage.of(f"{k} " + "x" * 1_000) for k in range(3_000)])

    asyncio.run(setup())
    kills, partial_on_disk = 0, 0
    for n in range(40):
        if kills >= 10 and partial_on_disk >= 3:
            break
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                _fork_child(str(tmp_path), write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        assert os.read(read_fd, 1) == b"w"
        time.sleep(0.0005 * (n % 3))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(read_fd)
        kills += os.WIFSIGNALED(status)
        kid = f"kid-{pid}"

        async def check(kid: str = kid) -> int:
            store = FileStore(tmp_path)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                count = len(await store.load_entries(kid))
                assert count in (0, 3_000), f"{kid}: a half-copied child with {count} entries"
                source = await durable.open(None, store=store, session_id="big")
                finished = await source.fork(kid)  # retrying with the same id works
            assert len(finished.entries) == 3_000
            return len(caught)

        partial_on_disk += asyncio.run(check()) > 0
    assert kills >= 10
    assert partial_on_disk >= 3  # kills that cut the copy mid-write


# -- foreign lines (S15) -------------------------------------------------------------

FOREIGN = [
    b'{"type":"message","id":"f1","timestamp":"2025-03-01T09:30:01.12Z","message":'
    b'{"role":"user","content":[{"type":"text","text":"hi"}]},"mood":"curious"}',
    b'{"type":"custom","id":"f2","parent_id":"f1","timestamp":"2025-03-01T09:30:02+00:00",'
    b'"kind":"nobody.registered.this","data":{"a":1},"written_by":"another app"}',
    b'{"type":"from.the.future","id":"f3","parent_id":"f2","x":[1.50]}',
]


async def test_s15_copy_sessions_is_byte_identical_for_lines_other_programs_wrote(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "other.jsonl").write_bytes(
        encode_init(SessionRecord(id="other")) + b"\n" + b"\n".join(FOREIGN) + b"\n")
    source = FileStore(tmp_path / "a")
    sqlite = SQLiteStore(tmp_path / "b.db")
    back = FileStore(tmp_path / "c")
    await copy_sessions(source, sqlite)
    await copy_sessions(sqlite, back, batch_size=2)
    for store in (source, sqlite, back):
        assert [encode_entry(e) for e in await store.load_entries("other")] == FOREIGN
    await sqlite.close()


def test_s15_timestamps_come_back_as_written() -> None:
    for stamp in (b"2025-03-01T09:30:01.12Z", b"2025-03-01T09:30:01+00:00",
                  b"2025-03-01T11:30:01.5+02:00"):
        line = (b'{"type":"message","id":"t","timestamp":"' + stamp
                + b'","message":{"role":"user","content":[]}}')
        entry = decode_entry(line)
        assert type(entry) is not MessageEntry and isinstance(entry, MessageEntry)
        assert type(entry).__name__ == "MessageEntry"
        assert encode_entry(entry) == line
        # A copy with a change is written the way this version writes.
        changed = msgspec.structs.replace(entry, parent_id="p")
        assert type(decode_entry(encode_entry(changed))) is MessageEntry


# -- what a load does with lines no store writes (S16) -----------------------------

DEEP = (b'{"type":"custom","id":"deep","timestamp":"2025-01-01T00:00:00Z","kind":"k",'
        b'"data":' + b"[" * 10_000 + b"]" * 10_000 + b"}")
SURROGATE = (b'{"type":"message","id":"s","timestamp":"2025-01-01T00:00:00Z","message":'
             b'{"role":"user","content":[{"type":"text","text":"\\ud800"}]}}')


@pytest.mark.parametrize("line", [DEEP, SURROGATE], ids=["nested 10,000 deep", "surrogate"])
async def test_s16_file_line_no_store_writes_is_corrupt_log_with_file_and_line(
    tmp_path: Path, line: bytes
) -> None:
    good = encode_entry(_msg("fine"))
    path = tmp_path / "bad.jsonl"
    path.write_bytes(encode_init(SessionRecord(id="bad")) + b"\n" + good + b"\n" + line + b"\n")
    with pytest.raises(CorruptLog) as info:
        await FileStore(tmp_path).load_entries("bad")
    assert (info.value.path, info.value.line) == (str(path), 3)
    assert len(str(info.value)) < 400  # a preview, not the line


@pytest.mark.parametrize("line", [DEEP, SURROGATE], ids=["nested 10,000 deep", "surrogate"])
async def test_s16_sqlite_row_no_store_writes_is_corrupt_log_with_row(
    tmp_path: Path, line: bytes
) -> None:
    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    await store.create_session(SessionRecord(id="bad"))
    await store.close()
    with sqlite3.connect(db) as conn:
        # A whole-line row (kind 0) of the one session (key 1).
        conn.execute("INSERT INTO entries (session, kind, id, data) "
                     "VALUES (1, 0, X'0078', ?)", (line,))
    store = SQLiteStore(db)
    with pytest.raises(CorruptLog, match=r"row \(session_id='bad', seq=1\)"):
        await store.load_entries("bad")
    await store.close()


async def test_s16_durable_append_holds_what_was_stored_not_the_callers_objects() -> None:
    store: Store = MemoryStore()
    agent = await durable.open(None, store=store, session_id="s")
    arguments: dict[str, Any] = {"path": "notes.txt", "lines": [1, 2]}
    message = AssistantMessage(content=(ToolCall(id="c", name="read", arguments=arguments),))
    (written,) = await agent.append(message)
    arguments["path"] = "changed by the caller"
    arguments["lines"].append(3)
    reloaded = await durable.open(None, store=store, session_id="s", repair=False)
    for view in (written, agent.entries[-1], reloaded.entries[-1]):
        assert isinstance(view, MessageEntry) and isinstance(view.message, AssistantMessage)
        assert view.message.tool_calls[0].arguments == {"path": "notes.txt", "lines": [1, 2]}
    # What the agent holds is what a reload gives: unregistered custom data as raw JSON.
    (custom,) = await agent.append(CustomEntry(kind="nobody.knows", data={"a": 1}))
    assert isinstance(custom, CustomEntry) and isinstance(custom.data, msgspec.Raw)
    assert encode_entry(custom) == encode_entry((await store.load_entries("s"))[-1])


# -- flush mode never waits on a lock in the event loop ------------------------------

HOLD_LOCK = textwrap.dedent("""
    import fcntl, sys, select
    f = open(sys.argv[1], "rb")
    fcntl.flock(f, fcntl.LOCK_EX)
    print("locked", flush=True)
    select.select([sys.stdin], [], [], 20)  # released when told, or after 20 s
""")


async def test_s8_flush_append_keeps_the_event_loop_running_while_another_process_locks(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", [_msg("first")])  # the descriptor is open and cached
    holder = subprocess.Popen(  # noqa: ASYNC220 (starting it is instant; reads are threaded)
        [sys.executable, "-c", HOLD_LOCK, str(store.path_for("s"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert await asyncio.to_thread(holder.stdout.readline) == b"locked\n"
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        append = asyncio.create_task(store.append_entries("s", [_msg("second")]))
        await until(lambda: ticks > 5)  # the loop ran on while the append waited
        # Had the append waited for the lock on this thread, nothing would
        # have run until the holder gave up after 20 s, and it would be done.
        assert not append.done()
        assert ticks > 5
        holder.stdin.write(b"go\n")
        holder.stdin.flush()
        await append
        ticking.cancel()
    finally:
        holder.kill()
        holder.wait()
    assert [e.message.text for e in await store.load_entries("s")  # type: ignore[union-attr]
            ] == ["first", "second"]
    await store.close()
