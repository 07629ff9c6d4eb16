"""FileStore: the conformance suite plus what is particular to files."""

from __future__ import annotations

import errno
import functools
import os
import shutil
from pathlib import Path

import msgspec
import pytest

from threadline.ai.messages import UserMessage
from threadline.errors import (
    ConfigError,
    CorruptLog,
    DurabilityError,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
)
from threadline.session import FileStore, MessageEntry, SessionRecord, Store
from threadline.session.codec import encode_entries, encode_init
from threadline.session.file import session_file_name
from threadline.testing import StoreConformance, StoreOpener, sample_entries


class TestFileStore(StoreConformance):
    async def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "sessions")

    def store_opener(self, tmp_path: Path) -> StoreOpener | None:
        return functools.partial(FileStore, str(tmp_path / "sessions"))


class TestFileStoreFlush(StoreConformance):
    async def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "sessions", durability="flush")


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _append_raw(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


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
    with pytest.raises(CorruptLog):
        await store.list_sessions()


async def test_fsync_failure_poisons_the_handle(
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
    assert len(await store.load_entries("s")) == 2  # reads still work
    fresh = FileStore(tmp_path)
    await fresh.append_entries("s", [_msg("after reopen")])
    assert [e.message.text for e in await fresh.load_entries("s")  # type: ignore[union-attr]
            ] == ["kept", "maybe lost", "after reopen"]


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
    store = FileStore(tmp_path)
    (tmp_path / "d.jsonl").mkdir()  # where session "d" should be, something unreadable
    with pytest.raises(StoreError) as info:
        await store.load_entries("d")
    assert isinstance(info.value.__cause__, OSError)
    assert "'d'" in str(info.value)


async def test_delete_removes_torn_fragments_too(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    _append_raw(tmp_path / "s.jsonl", b'{"type":"message","id":"tor')
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
