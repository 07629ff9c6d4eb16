"""FileStore under crashes, torn writes, corruption, hostile ids and many writers.

Everything here uses real files and real processes: children are killed with
SIGKILL in the middle of appending, and several processes write one session.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import multiprocessing
import os
import random
import select
import signal
import tempfile
import time
import unicodedata
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline.ai._messages import TextPart, ToolResultMessage, UserMessage
from threadline.errors import CorruptLog, InvalidSessionId
from threadline.session import MessageEntry, SessionRecord
from threadline.session._codec import encode_entry
from threadline.session._entries import Entry
from threadline.stores import FileStore, check_session_id
from threadline.stores.file._format import encode_init, frame
from threadline.stores.file._format import export_lines as encode_entries
from threadline.stores.file._store import session_file_name
from threadline.testing._conformance import _process_append, check_concurrent_log

# forkserver: a clean parent forks the workers, so they do not copy this
# process's threads and event loops.
_CTX = multiprocessing.get_context("forkserver")


def _msg(text: str, parent_id: str | None = None) -> MessageEntry:
    return MessageEntry(parent_id=parent_id, message=UserMessage.of(text))


def _load_quietly(store: FileStore, session_id: str) -> list[Entry]:
    async def run() -> list[Entry]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return await store.load_entries(session_id)

    return asyncio.run(run())


# -- kill -9 while appending ------------------------------------------------------


def _append_until_killed(root: str, session_id: str, seed: int, report_fd: int) -> None:
    """Child: continue the chain from the leaf, report each acknowledged batch."""

    async def run() -> None:
        store = FileStore(root)
        log = await store.load_entries(session_id)
        parent = log[-1].id if log else None
        rnd = random.Random(seed)
        while True:
            batch = []
            for _ in range(rnd.randint(1, 3)):
                # Large entries make it likely that a kill lands mid-write.
                size = rnd.choice((40, 400, 4000, 20_000))
                entry = _msg("é" * size, parent)
                parent = entry.id
                batch.append(entry)
            await store.append_entries(session_id, batch)
            # One small write to a pipe is atomic: a report is whole or absent.
            os.write(report_fd, (" ".join(e.id for e in batch) + "\n").encode())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        asyncio.run(run())


def _fork_writer(root: Path, session_id: str, seed: int) -> tuple[int, int]:
    """Fork a child running ``_append_until_killed``; return (pid, read end).

    A plain fork: this test runs no other threads, and it is by far the
    cheapest way to start 200 writers.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.close(read_fd)
            _append_until_killed(str(root), session_id, seed, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    return pid, read_fd


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _kill_loop(root: Path, session_id: str, rounds: int, seed: int,
               at_least: int = 0) -> int:
    """Kill ``rounds`` children, and more (up to 5 times as many) until ``at_least``
    entries were acknowledged: on a loaded machine a child may spend its
    whole life starting up, so those extra children live up to 5 times longer."""
    rnd = random.Random(seed)
    store = FileStore(root)
    acknowledged: set[str] = set()
    n = -1
    while (n := n + 1) < rounds or (len(acknowledged) < at_least and n < 5 * rounds):
        pid, read_fd = _fork_writer(root, session_id, seed * 1000 + n)
        # Kills land during start-up, mid-append and between appends.
        time.sleep(rnd.uniform(0, 0.03 if n < rounds else 0.15))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), f"round {n}: the child exited on its own ({status})"
        acknowledged.update(_read_all(read_fd).decode().split())
        # Every reopen loads, and holds everything that was acknowledged.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            entries = asyncio.run(store.load_entries(session_id))
        assert len(caught) == len(entries.diagnostics)
        ids = [e.id for e in entries]
        assert len(ids) == len(set(ids))
        missing = acknowledged - set(ids)
        assert not missing, f"round {n}: {len(missing)} acknowledged entries lost"
        present = set(ids)
        assert all(e.parent_id is None or e.parent_id in present for e in entries)
    return len(acknowledged)


def test_s8_kill_9_while_appending_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    asyncio.run(FileStore(tmp_path).create_session(SessionRecord(id="crash")))
    acknowledged = _kill_loop(tmp_path, "crash", rounds=200, seed=7, at_least=101)
    assert acknowledged > 100  # the children did get entries acknowledged
    # After the last crash, one more append leaves a clean file.
    store = FileStore(tmp_path)
    before = _load_quietly(store, "crash")
    asyncio.run(store.append_entries("crash", [_msg("after the storm", before[-1].id)]))
    assert (tmp_path / "crash.jsonl").read_bytes().endswith(b"\n")
    after = asyncio.run(store.load_entries("crash"))
    assert not after.diagnostics
    assert [e.id for e in after[:-1]] == [e.id for e in before]


# -- torn last line ---------------------------------------------------------------


def _torn_fixture() -> tuple[bytes, list[Entry], bytes]:
    record = SessionRecord(id="torn")
    good: list[Entry] = [_msg("first ☃"), _msg("second 😀")]
    last = MessageEntry(
        parent_id=good[-1].id,
        message=ToolResultMessage(tool_call_id="c1", tool_name="t",
                                  content=(TextPart(text="ünïcödé 漢字 😀 end"),)),
    )
    prefix = encode_init(record) + b"\n" + encode_entries(good)
    return prefix, good, encode_entry(last) + b"\n"


@pytest.mark.parametrize("durability", ["flush", "fsync"])
async def test_s8_torn_last_line_at_every_byte_offset(tmp_path: Path, durability: str) -> None:
    prefix, good, line = _torn_fixture()
    path = tmp_path / "torn.jsonl"
    store = FileStore(tmp_path, durability=durability)  # type: ignore[arg-type]
    offsets = range(len(line)) if durability == "flush" else (0, 1, len(line) // 2, len(line) - 1)
    for cut in offsets:
        fragment = line[:cut]
        _reset(tmp_path, path, prefix + fragment)
        if cut:
            with pytest.warns(RuntimeWarning, match="torn last line"):
                log = await store.load_entries("torn")
            assert len(log.diagnostics) == 1
            assert str(path) in log.diagnostics[0]
            assert "line 4" in log.diagnostics[0]
        else:
            log = await store.load_entries("torn")
            assert log.diagnostics == []
        assert [encode_entry(e) for e in log] == [encode_entry(e) for e in good]

        new = _msg("next", good[-1].id)
        await store.append_entries("torn", [new])
        assert path.read_bytes() == prefix + frame([encode_entry(new)])
        aside = tmp_path / "torn.jsonl.torn-1"
        if cut:
            assert aside.read_bytes() == fragment  # nothing is thrown away
        else:
            assert not aside.exists()
        reloaded = await store.load_entries("torn")
        assert reloaded.diagnostics == []
        assert [e.id for e in reloaded] == [*(e.id for e in good), new.id]


def _reset(root: Path, path: Path, content: bytes) -> None:
    for p in root.glob("torn.jsonl.torn-*"):
        p.unlink()
    path.write_bytes(content)


async def test_s8_fragments_moved_aside_get_distinct_names(tmp_path: Path) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    for n in (1, 2, 3):
        _append_bytes(tmp_path / "s.jsonl", f'{{"frag":{n}'.encode())
        await store.append_entries("s", [_msg(str(n))])
        assert (tmp_path / f"s.jsonl.torn-{n}").read_bytes() == f'{{"frag":{n}'.encode()
    assert len(await store.load_entries("s")) == 3


def _append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# -- corruption before the last line ------------------------------------------


DAMAGE = {
    "garbage": b"this is not json",
    "cut_json": b'{"type":"message","id":"01","message":{"role":"us',
    "wrong_field_type": b'{"type":"message","id":"01","message":5}',
    "zeroed": b"\x00" * 32,
    "blank": b"",
    "bad_utf8": (b'{"type":"message","id":"01","message":{"role":"user",'
                 b'"content":[{"type":"text","text":"\xff\xfe"}]}}'),
    # Valid JSON missing a header field: the store must not invent one.
    "no_id": (b'{"type":"message","timestamp":"2024-01-01T00:00:00Z","message":'
              b'{"role":"user","content":[{"type":"text","text":"x"}]}}'),
    "no_timestamp": (b'{"type":"message","id":"01","message":'
                     b'{"role":"user","content":[{"type":"text","text":"x"}]}}'),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("lineno", [2, 4, 6])
async def test_s8_bad_line_before_the_end_names_file_and_line(
    tmp_path: Path, damage: str, lineno: int
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="bad"))
    entries = [_msg(f"entry {n}") for n in range(5)]
    for entry in entries:  # one line each
        await store.append_entries("bad", [entry])
    path = tmp_path / "bad.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = DAMAGE[damage]  # line 6 is the last line, newline intact
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLog) as info:
        await store.load_entries("bad")
    assert info.value.path == str(path)
    assert info.value.line == lineno
    assert f"{path} line {lineno}:" in str(info.value)
    assert info.value.session_id == "bad"


async def test_s8_bad_session_init_line_names_line_1(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="bad"))
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"type":"session_init","id":"bad"}\n')  # no created_at
    for call in (store.load_entries("bad"), store.load_session("bad")):
        with pytest.raises(CorruptLog) as info:
            await call
        assert (info.value.path, info.value.line) == (str(path), 1)


# -- session id fuzzing -----------------------------------------------------------

_TRICKY = st.sampled_from([
    "a", "A", "con", "CON", "Con.txt", "nul", "com1", "lpt9", ".", "..", "../x", "a/b", "a\\b",
    " ", "x ", "x.", "=", "==", "=mfrgg", "é", "e\u0301", "ﬁ", "ß", "SS",
    "ǅ", "İ", "ı", "K", "K", "Å", "Å", "x" * 100, "x" * 101, "é" * 60, "é" * 61, "😀" * 70,
])
def _valid(session_id: str) -> bool:
    try:
        check_session_id(session_id)
    except InvalidSessionId:
        return False
    return True


_IDS = st.one_of(
    _TRICKY,
    st.text(min_size=1, max_size=40),
    st.text(min_size=100, max_size=300),
    st.from_regex(r"[a-z0-9_-]{95,105}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_.=-]{1,12}", fullmatch=True),
).filter(_valid)


def _variants(session_id: str) -> set[str]:
    out = {session_id, session_id.upper(), session_id.lower(), session_id.casefold(),
           session_id.swapcase()}
    out |= {unicodedata.normalize(form, v) for v in list(out)
            for form in ("NFC", "NFD", "NFKC", "NFKD")}
    return {v for v in out if _valid(v)}


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_IDS, min_size=1, max_size=4))
def test_s1_session_id_fuzz_no_escape_no_collision_round_trip(ids: list[str]) -> None:
    variants = set().union(*(_variants(i) for i in ids))
    owner: dict[str, str] = {}
    for sid in variants:
        name = session_file_name(sid)
        assert "/" not in name and "\\" not in name and "\x00" not in name
        assert name not in (".", "..") and not name.startswith(".")
        assert len(name.encode()) <= 200
        # A case-insensitive, normalising file system sees this key.
        key = unicodedata.normalize("NFC", name).casefold()
        assert owner.setdefault(key, sid) == sid, (owner[key], sid)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        store = FileStore(root, durability="flush")

        async def run() -> None:
            for sid in variants:
                await store.create_session(SessionRecord(id=sid))
                await store.append_entries(sid, [_msg(sid)])
            for sid in variants:
                assert (await store.load_session(sid)).id == sid
                (entry,) = await store.load_entries(sid)
                assert isinstance(entry, MessageEntry)
                assert isinstance(entry.message, UserMessage)
                assert entry.message.text == sid
            listed = (await store.list_sessions(limit=1000)).sessions
            assert sorted(r.id for r in listed) == sorted(variants)

        asyncio.run(run())
        files = list(root.iterdir())
        assert len(files) == len(variants)
        assert all(f.resolve().parent == root.resolve() for f in files)
        assert not any(p for p in Path(tmp).iterdir() if p.name != "root")


# -- many processes, one session --------------------------------------------------


async def test_s4_eight_processes_append_500_each_to_one_session(tmp_path: Path) -> None:
    # flush durability: this proves locking and ordering; 4,000 fsyncs in a row
    # would only measure the disk. The fsync path runs multi-process in the
    # conformance suite and under kill -9 above.
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="busy"))
    opener = functools.partial(FileStore, str(tmp_path), "flush")
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max_workers=8, mp_context=_CTX) as pool:
        chains = await asyncio.gather(*(
            loop.run_in_executor(pool, _process_append, opener, "busy", w, 500)
            for w in range(8)
        ))
    log = await store.load_entries("busy")
    assert log.diagnostics == []
    assert len(log) == 4000
    check_concurrent_log(log, chains)


# -- fork with open files -------------------------------------------------------


def test_s4_forked_child_appends_on_its_own_and_waits_for_the_parents_lock(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    asyncio.run(store.create_session(SessionRecord(id="s")))
    asyncio.run(store.append_entries("s", [_msg("parent 1")]))  # its worker threads started
    # The lock as the parent's writer holds it mid-append. The child must wait
    # for it, and must not wait for worker threads that exist in the parent only.
    held = os.open(store.path_for("s"), os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.close(read_fd)
            os.close(held)  # the parent's lock, not the child's
            signal.alarm(20)  # a hang fails the test instead of stalling it
            asyncio.run(store.append_entries("s", [_msg("child")]))
            os.write(write_fd, b"appended")
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        early, _, _ = select.select([read_fd], [], [], 0.3)
        assert not early, "the child appended while the parent held the lock"
    finally:
        os.close(held)
        output = _read_all(read_fd)
        os.waitpid(pid, 0)
    assert output == b"appended"
    asyncio.run(store.append_entries("s", [_msg("parent 2")]))
    log = asyncio.run(store.load_entries("s"))
    assert [e.message.text for e in log] == ["parent 1", "child", "parent 2"]  # type: ignore[union-attr]
