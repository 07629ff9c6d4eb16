"""Store promises that interoperability tests found broken: each test failed before its fix."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from threadline.ai import UserMessage
from threadline.session import Entry, MessageEntry, SessionRecord
from threadline.stores import FileStore


def _bytes_read() -> int:
    """What this process has read through read(2) and pread(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
async def test_s32_load_entries_after_the_last_message_reads_only_the_tail(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path, durability="flush")
    await store.create_session(SessionRecord(id="s"))
    entries: list[Entry] = []
    for n in range(20_000):
        entries.append(MessageEntry(parent_id=entries[-1].id if entries else None,
                                    message=UserMessage.of(f"message {n} " * 5)))
    for start in range(0, len(entries) - 2, 1000):
        await store.append_entries("s", entries[start:min(start + 1000, len(entries) - 2)])
    for entry in entries[-2:]:  # appended one by one, as a chat does
        await store.append_entries("s", [entry])
    size = store.path_for("s").stat().st_size
    before = _bytes_read()
    after = await store.load_entries_after("s", entries[-2].id)
    read = _bytes_read() - before
    await store.close()
    assert [e.id for e in after] == [entries[-1].id]
    assert read < size / 20, f"read {read:,} bytes of a {size:,}-byte file for one entry"


_POISON = """
import asyncio, resource, signal, sys
from threadline.ai._messages import UserMessage
from threadline.errors import DurabilityError
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import SQLiteStore

async def main():
    store = SQLiteStore(sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        for _ in range(100):
            await store.append_entries("s", [MessageEntry(message=UserMessage.of("x" * 20000))])
    except DurabilityError:
        pass
    for call in (store.create_session(SessionRecord(id="new-session-7")),
                 store.delete_session("s")):
        try:
            await call
        except DurabilityError as exc:
            print(exc.session_id, "|", exc, flush=True)

asyncio.run(main())
"""


async def test_s17_a_poisoned_sqlite_store_names_the_session_it_refuses(tmp_path: Path) -> None:
    from threadline.stores import SQLiteStore

    path = tmp_path / "full.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="s"))
    await store.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _POISON, str(path), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    refusals = out.decode().splitlines()
    assert [line.split(" | ")[0] for line in refusals] == ["new-session-7", "s"]
    for line in refusals:
        sid, message = line.split(" | ", 1)
        assert repr(sid) in message, message
