"""A child process for the retention tests: a writer appending, or a pruner pruning.

``writer KIND LOCATION SCHEMA SESSION PARENT N ACKS``: append N entries one at a
time, each chained after the one before (the first after PARENT, "-" for a
root), and write each id to ACKS after its append returned.
``pruner KIND LOCATION SCHEMA POLICY``: prune with POLICY until killed (or
once, with POLICY followed by ``once``).
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from support.stores import StoreSpec, close
from threadline.ai import UserMessage
from threadline.privacy import RetentionPolicy, prune
from threadline.session import MessageEntry


async def writer(spec: StoreSpec, sid: str, parent: str | None, n: int, acks: TextIO) -> None:
    store = spec.open()
    for k in range(n):
        entry = MessageEntry(parent_id=parent, message=UserMessage.of(f"{acks.name}-{k}"))
        await store.append_entries(sid, [entry])
        acks.write(entry.id + "\n")  # only once the append returned
        acks.flush()
        parent = entry.id
    await close(store)


async def pruner(spec: StoreSpec, policy: RetentionPolicy, once: bool) -> None:
    store = spec.open()
    print("pruning", flush=True)
    while True:
        await prune(store, policy, batch=50)
        if once:
            break
    await close(store)


def main(argv: list[str]) -> None:
    role, kind, location, schema = argv[:4]
    spec = StoreSpec(kind, location, schema)
    if role == "writer":
        sid, parent, n, acks = argv[4:8]
        with open(acks, "a", encoding="utf-8") as out:
            asyncio.run(writer(spec, sid, None if parent == "-" else parent, int(n), out))
    else:
        asyncio.run(pruner(spec, RetentionPolicy.parse(argv[4]), argv[5:] == ["once"]))


if __name__ == "__main__":
    main(sys.argv[1:])
