"""Workloads for the power-loss tests, run in a child process that PowerLoss records.

``python powerloss_workload.py SETTING WORKLOAD ROOT`` appends to the store
that SETTING names (``file-fsync``, ``file-flush``, ``sqlite-FULL``,
``sqlite-NORMAL``) under ROOT, notes each call the store acknowledged with
``mark_acknowledged`` (a JSON object: the session, and the ids appended or
``created``), and prints each session's entry ids as loaded at the end.

Entries are built from their names alone (id, parent, timestamp, text), so a
process that retries a batch another one wrote sends the same bytes. An id
``<session>.<batch>.<k>of<n>`` says which call wrote it; the checks use that.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from threadline import durable
from threadline.ai import UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.testing import inject_fault, mark_acknowledged

SETTINGS = ("file-fsync", "file-flush", "sqlite-FULL", "sqlite-NORMAL")
DURABLE = {"file-fsync", "sqlite-FULL"}  # acknowledged means on disk
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def open_store(setting: str, root: Path) -> Any:
    from threadline.stores import FileStore, SQLiteStore  # the one place that names them

    kind, mode = setting.split("-")
    if kind == "file":
        return FileStore(root, durability=mode)  # type: ignore[arg-type]
    return SQLiteStore(root / "sessions.db", synchronous=mode)  # type: ignore[arg-type]


def batch(session: str, name: str, size: int, parent: str | None) -> list[MessageEntry]:
    out: list[MessageEntry] = []
    for k in range(1, size + 1):
        entry_id = f"{session}.{name}.{k}of{size}"
        out.append(MessageEntry(id=entry_id, parent_id=parent,
                                timestamp=T0 + timedelta(microseconds=len(out)),
                                message=UserMessage.of(f"{entry_id} " + "x" * (10 * k))))
        parent = entry_id
    return out


def ack(session: str, ids: Sequence[str] = (), *, created: bool = False) -> None:
    mark_acknowledged(json.dumps({"session": session, "ids": list(ids), "created": created}))


async def append(store: Any, session: str, entries: Sequence[MessageEntry]) -> str:
    await store.append_entries(session, entries)
    ack(session, [e.id for e in entries])
    return entries[-1].id


async def create(store: Any, session: str, parent: str | None = None) -> None:
    await store.create_session(SessionRecord(id=session, parent_id=parent, created_at=T0))
    ack(session, created=True)


async def singles(store: Any) -> None:
    await create(store, "s")
    last = None
    for n in range(60):
        last = await append(store, "s", batch("s", f"b{n}", 1, last))


async def batches(store: Any) -> None:
    await create(store, "s")
    last = None
    for n in range(30):
        last = await append(store, "s", batch("s", f"b{n}", 2 + n % 4, last))


async def concurrent(store: Any) -> None:
    """Four tasks appending to one session at once: group commit (S34, S42)."""
    await create(store, "s")

    async def task(t: int) -> None:
        for n in range(12):
            await append(store, "s", batch("s", f"t{t}n{n}", 1 + (t + n) % 2, None))

    await asyncio.gather(*(task(t) for t in range(4)))


async def sessions(store: Any) -> None:
    """Session creation, the directory sync of the file store included."""
    for n in range(12):
        await create(store, f"c{n}")
        await append(store, f"c{n}", batch(f"c{n}", "b0", 1 + n % 3, None))


async def fork(store: Any) -> None:
    await create(store, "src")
    last = None
    for n in range(4):
        last = await append(store, "src", batch("src", f"b{n}", 2, last))
    agent = await durable.open(None, store=store, session_id="src")
    child = await agent.fork("child")
    ack("child", [e.id for e in child.entries], created=True)
    for n in range(3):
        written = await child.append(UserMessage.of(f"after fork {n}"))
        ack("child", [e.id for e in written])


async def torn(store: Any) -> None:
    """A torn last line (as a crash leaves it) moved aside by the next append."""
    await create(store, "s")
    last = None
    for n in range(2):
        last = await append(store, "s", batch("s", f"b{n}", 2, last))
    fd = os.open(store.path_for("s"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b'["torn-by-an-earlier-crash",null,"2025-01')
        os.fsync(fd)
    finally:
        os.close(fd)
    for n in range(2, 6):
        last = await append(store, "s", batch("s", f"b{n}", 1 + n % 2, last))


RETRIED = batch("s", "b1", 3, "s.b0.1of1")


async def retry_setup(store: Any) -> None:
    await create(store, "s")
    await append(store, "s", batch("s", "b0", 1, None))


async def retry_writer(store: Any) -> None:
    """Writes the batch and dies before its sync: the acknowledgement is lost."""
    await append(store, "s", batch("s", "w0", 1, RETRIED[-1].id))
    inject_fault(kill_before_sync=1)
    await store.append_entries("s", RETRIED)  # killed in here where the store syncs


async def retry_again(store: Any) -> None:
    """Appends the same batch again, as S25 lets a caller do, then one more."""
    await append(store, "s", RETRIED)
    await append(store, "s", batch("s", "b2", 1, RETRIED[-1].id))


async def failed_sync(store: Any) -> None:
    """Appends one batch whose sync fails; prints what the store said."""
    await create(store, "s")
    await append(store, "s", batch("s", "b0", 1, None))
    inject_fault(fail_sync=1)
    try:
        await store.append_entries("s", batch("s", "b1", 2, "s.b0.1of1"))
    except Exception as exc:
        print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
    else:
        print(json.dumps({"raised": None}))


WORKLOADS: dict[str, Callable[[Any], Awaitable[None]]] = {
    "singles": singles, "batches": batches, "concurrent": concurrent, "sessions": sessions,
    "fork": fork, "torn": torn, "retry-setup": retry_setup, "retry-writer": retry_writer,
    "retry-again": retry_again, "failed-sync": failed_sync,
}


async def main(setting: str, workload: str, root: Path) -> None:
    store = open_store(setting, root)
    try:
        await WORKLOADS[workload](store)
        if workload != "failed-sync":
            page = await store.list_sessions(limit=1000)
            logs = {r.id: [e.id for e in await store.load_entries(r.id)] for r in page.sessions}
            print(json.dumps(logs))
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
