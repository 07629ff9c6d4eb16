"""The file store stays in its root (S17) and lists what it finds there (S18)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import CorruptLog, StoreError
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, copy_sessions
from threadline.stores.file import _catalog as file_module

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from threadline.cli import main; main()"]
SECRET = b"TOP-SECRET-PASSWORD=hunter2\n"


def _append_raw(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False)


def _msg(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage.of(text))


async def _every_verb_fails(store: FileStore, sid: str) -> list[BaseException]:
    """Run every verb on ``sid``; each must raise a ``StoreError`` (returned)."""
    errors: list[BaseException] = []
    calls = (
        lambda: store.load_entries(sid),
        lambda: store.append_entries(sid, [_msg("must not land")]),
        lambda: store.load_session(sid),
        lambda: store.delete_session(sid),
    )
    for call in calls:
        with pytest.raises(StoreError) as info:
            await call()
        errors.append(info.value)
    return errors


# -- S17: only regular files, only inside the root ------------------------------


async def test_s17_symlink_to_a_session_outside_the_root_is_not_followed(
    tmp_path: Path,
) -> None:
    outside, root = FileStore(tmp_path / "outside"), FileStore(tmp_path / "root")
    await outside.create_session(SessionRecord(id="s"))
    await outside.append_entries("s", [_msg("outside")])
    target = outside.path_for("s")
    before = target.read_bytes()
    root.path_for("s").symlink_to(target)
    for error in await _every_verb_fails(root, "s"):
        assert isinstance(error, CorruptLog)
        assert "symbolic link" in str(error) and error.path == str(root.path_for("s"))
    # `threadline copy` into that root: refused too, nothing written through the link.
    src = FileStore(tmp_path / "src")
    await src.create_session(SessionRecord(id="s"))
    await src.append_entries("s", [_msg("copied")])
    with pytest.raises(StoreError):
        await copy_sessions(src, root)
    assert target.read_bytes() == before
    assert root.path_for("s").is_symlink()  # delete did not remove it either
    # The link is reported by listing; it hides nothing else.
    await root.create_session(SessionRecord(id="good"))
    page = await root.list_sessions()
    assert [r.id for r in page.sessions] == ["good"]
    assert [p.path for p in page.problems] == [str(root.path_for("s"))]


async def test_s17_the_root_is_resolved_once(tmp_path: Path) -> None:
    # A root given through a link is followed when the store is made; swapping
    # the link later does not move the store into another directory.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "a")
    store = FileStore(tmp_path / "root")
    await store.create_session(SessionRecord(id="s"))
    other = FileStore(tmp_path / "b")
    await other.create_session(SessionRecord(id="s", parent_id="in b"))
    (tmp_path / "root").unlink()
    (tmp_path / "root").symlink_to(tmp_path / "b")
    await store.append_entries("s", [_msg("stays in a")])
    assert (await store.load_session("s")).parent_id is None
    assert len(await other.load_entries("s")) == 0
    assert store.path_for("s") == (tmp_path / "a" / "s.jsonl").resolve()


async def test_s17_foreign_file_contents_are_never_quoted(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    store.path_for("linked").symlink_to(secret)
    store.path_for("plain").write_bytes(SECRET)  # a regular file that is no session log
    store.path_for("hostile").write_bytes(b'{"hello": "\x1b[31m' + SECRET.strip() + b'"}\n')
    messages = []
    for sid in ("linked", "plain", "hostile"):
        messages += [str(e) for e in await _every_verb_fails(store, sid)]
    page = await store.list_sessions()
    assert len(page.problems) == 3
    messages += [str(p) for p in page.problems]
    for message in messages:
        assert "hunter2" not in message and "SECRET" not in message and "\x1b" not in message
    assert all("not a session log" in m for m in messages)
    assert secret.read_bytes() == SECRET and store.path_for("plain").read_bytes() == SECRET


async def test_s17_a_damaged_session_log_is_quoted_short_and_escaped(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    junk = b'{"type":"session_init",' + b"\x1b[2J\x07" * 5000 + b"\n"
    store.path_for("s").write_bytes(junk)
    with pytest.raises(CorruptLog) as info:
        await store.load_session("s")
    message = str(info.value)
    assert "\x1b" not in message and "\x07" not in message
    assert len(message) < 400 + len(str(store.path_for("s")))


async def test_s17_fifos_devices_and_directories_are_refused_without_blocking(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "root")
    os.mkfifo(store.path_for("fifo"))
    store.path_for("dir").mkdir()
    store.path_for("zero").symlink_to("/dev/zero")
    names = ["fifo", "dir", "zero"]
    try:  # a device node in the root itself (needs CAP_MKNOD)
        os.mknod(store.path_for("null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
        names.append("null")
    except PermissionError:
        pass
    for sid in names:
        for error in await _every_verb_fails(store, sid):
            assert isinstance(error, CorruptLog), error
            assert "not a session log" in str(error)
    page = await store.list_sessions()
    assert page.sessions == []
    assert sorted(Path(p.path or "").name for p in page.problems) == sorted(
        f"{n}.jsonl" for n in names)
    assert stat.S_ISFIFO(os.lstat(store.path_for("fifo")).st_mode)  # left alone


async def test_s17_header_reads_are_bounded(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    # A first line of 8 MB with no newline: refused after one bounded read.
    store.path_for("huge").write_bytes(b'{"type":"session_init","id":"' + b"x" * (8 << 20))
    for call in (store.load_session("huge"), store.load_entries("huge"),
                 store.append_entries("huge", [_msg("x")])):
        with pytest.raises(CorruptLog, match="longer than 65536 bytes"):
            await call
    (problem,) = (await store.list_sessions()).problems
    assert "longer than 65536 bytes" in str(problem)


async def test_s17_failed_torn_tail_repair_leaves_no_torn_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    _append_raw(store.path_for("s"), b'{"type":"message","id":"torn')
    real_write = os.write

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".torn-1"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_full)
    for _ in range(3):
        with pytest.raises(StoreError):
            await store.append_entries("s", [_msg("after the torn line")])
        assert sorted(os.listdir(tmp_path)) == ["s.jsonl"]
    monkeypatch.undo()
    await store.append_entries("s", [_msg("after the torn line")])
    assert sorted(os.listdir(tmp_path)) == ["s.jsonl", "s.jsonl.torn-1"]
    assert (tmp_path / "s.jsonl.torn-1").read_bytes() == b'{"type":"message","id":"torn'
    assert len(await store.load_entries("s")) == 1


async def test_s17_a_hard_link_is_the_same_session_file(tmp_path: Path) -> None:
    # Documented rule: the store works on the file its own name leads to. A
    # hard link elsewhere is that same file, so it sees the appends; deleting
    # the session removes the store's name only.
    store = FileStore(tmp_path / "root")
    await store.create_session(SessionRecord(id="s"))
    elsewhere = tmp_path / "backup.jsonl"
    os.link(store.path_for("s"), elsewhere)
    await store.append_entries("s", [_msg("seen through both names")])
    assert elsewhere.read_bytes() == store.path_for("s").read_bytes()
    # Under another session's name in the root, the first line gives it away.
    os.link(store.path_for("s"), store.path_for("t"))
    with pytest.raises(CorruptLog, match="does not belong in this file"):
        await store.append_entries("t", [_msg("refused")])
    os.unlink(store.path_for("t"))
    await store.delete_session("s")
    assert not store.path_for("s").exists()
    assert b"seen through both names" in elsewhere.read_bytes()


# -- S18: listing reports bad files and never hides good ones, never stale -------


def test_s18_bad_files_are_reported_by_name_and_hide_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    good = [SessionRecord(id=f"good-{n}") for n in range(5)]

    async def fill() -> None:
        for record in good:
            await store.create_session(record)
            await store.append_entries(record.id, [_msg(record.id)])

    asyncio.run(fill())
    (tmp_path / "a-directory.jsonl").mkdir()
    shutil.copy(store.path_for("good-1"), tmp_path / "good-1-backup.jsonl")
    (tmp_path / "hello.jsonl").write_bytes(b'{"hello": 1}\n')
    (tmp_path / "empty.jsonl").write_bytes(b"")
    # What `threadline export good-2 > root/good-2-export.jsonl` leaves behind.
    exported = subprocess.run([*CLI, "--store", str(tmp_path), "export", "good-2"],
                              capture_output=True, check=True).stdout
    (tmp_path / "good-2-export.jsonl").write_bytes(exported)
    expected_bad = sorted(["a-directory.jsonl", "good-1-backup.jsonl", "hello.jsonl",
                           "empty.jsonl", "good-2-export.jsonl"])

    async def page_through(limit: int) -> tuple[list[str], list[str]]:
        seen: list[str] = []
        problems: list[str] = []
        cursor = None
        while True:
            page = await store.list_sessions(limit=limit, cursor=cursor)
            seen += [r.id for r in page.sessions]
            problems += [Path(p.path or "").name for p in page.problems]
            if page.next_cursor is None:
                return seen, problems
            cursor = page.next_cursor

    for limit in (1, 2, 100):
        seen, problems = asyncio.run(page_through(limit))
        assert sorted(seen) == sorted(r.id for r in good)
        assert sorted(problems) == expected_bad  # on the first page, once
    # The CLI lists and checks the good ones and names the bad ones.
    listed = _cli("--store", str(tmp_path), "list")
    assert listed.returncode == 0, listed.stderr
    assert all(r.id in listed.stdout for r in good)
    # Rows go to stdout; a file that is not a session is a notice, on stderr.
    assert "hello.jsonl" in listed.stderr.replace("\n", "")
    assert "hello.jsonl" not in listed.stdout
    checked = _cli("--store", str(tmp_path), "check")
    assert checked.returncode == 1  # the bad files are problems
    assert all(f"{r.id}: 1 entry" in checked.stdout for r in good)
    assert "empty.jsonl" in checked.stdout.replace("\n", "")


async def test_s18_listing_is_never_stale_across_handles(tmp_path: Path) -> None:
    reader, writer = FileStore(tmp_path), FileStore(tmp_path)
    ids = lambda page: [r.id for r in page.sessions]  # noqa: E731
    await writer.create_session(SessionRecord(id="a"))
    assert ids(await reader.list_sessions()) == ["a"]
    for _ in range(3):
        # Created, deleted and re-created by another handle right after a
        # listing: within one timestamp tick of it, the hard case for a cache.
        await writer.create_session(SessionRecord(id="b", parent_id="first"))
        assert sorted(ids(await reader.list_sessions())) == ["a", "b"]
        await writer.delete_session("b")
        assert ids(await reader.list_sessions()) == ["a"]
        await writer.create_session(SessionRecord(id="b", parent_id="second"))
        page = await reader.list_sessions()
        assert {r.id: r.parent_id for r in page.sessions} == {"a": None, "b": "second"}
        await writer.delete_session("b")
    # A settled directory is served from the cache and still sees changes.
    await asyncio.sleep(0.1)
    await reader.list_sessions()
    assert reader._catalog is not None and reader._catalog.reusable
    cached = reader._catalog
    assert ids(await reader.list_sessions()) == ["a"] and reader._catalog is cached
    await writer.create_session(SessionRecord(id="c"))
    assert sorted(ids(await reader.list_sessions())) == ["a", "c"]
    await writer.delete_session("a")
    assert ids(await reader.list_sessions()) == ["c"]


@pytest.mark.parametrize("clock", ["fine", "whole-seconds"])
async def test_s18_a_change_within_one_timestamp_tick_is_not_missed(
    tmp_path: Path, clock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file system stamps changes from a clock that ticks in steps (or keeps
    # whole seconds): a session created just after a listing can leave the
    # directory's mtime exactly as the listing saw it. utime plays that clock;
    # a tick of 10 s keeps the test's own pauses well inside one.
    monkeypatch.setattr(file_module, "_RACY_NS", 10**10)
    monkeypatch.setattr(file_module, "_RACY_COARSE_NS", 10**10)
    reader, writer = FileStore(tmp_path), FileStore(tmp_path)
    await writer.create_session(SessionRecord(id="a"))
    stamp = os.stat(tmp_path).st_mtime_ns
    if clock == "whole-seconds":
        stamp -= stamp % 1_000_000_000
    os.utime(tmp_path, ns=(stamp, stamp))
    assert [r.id for r in (await reader.list_sessions()).sessions] == ["a"]
    await writer.create_session(SessionRecord(id="b"))
    os.utime(tmp_path, ns=(stamp, stamp))
    assert sorted(r.id for r in (await reader.list_sessions()).sessions) == ["a", "b"]
    await writer.delete_session("a")
    os.utime(tmp_path, ns=(stamp, stamp))
    assert [r.id for r in (await reader.list_sessions()).sessions] == ["b"]


def _create_in_child(root: str, sid: str) -> None:
    async def run() -> None:
        await FileStore(root).create_session(SessionRecord(id=sid))

    asyncio.run(run())


async def test_s18_a_session_another_process_just_created_is_listed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="mine"))
    for n in range(5):
        await store.list_sessions()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c",
            "import sys; from tests.test_store_file_root import _create_in_child as c; "
            "c(sys.argv[1], sys.argv[2])", str(tmp_path), f"theirs-{n}",
            cwd=REPO)
        assert await child.wait() == 0
        listed = [r.id for r in (await store.list_sessions()).sessions]
        assert f"theirs-{n}" in listed and "mine" in listed
