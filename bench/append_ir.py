"""Instructions per fsync'd file-store append on io_uring, against the bare ring's.

    .venv/bin/python bench/append_ir.py            # runs callgrind itself, prints a table

The latency figures of ``bench/uring_hop.py`` move with whatever else the
machine does; instruction counts do not. Each variant runs a short and a long
loop of appends under ``valgrind --tool=callgrind``; the difference of the two
totals divided by the difference of the counts is the instructions one append
costs, interpreter start-up and imports cancelled out:

- bare: ``os.write`` of a line, its fdatasync submitted to the store's ring
  and awaited, then one turn of the loop (the least an append on the loop
  costs, ``bench/uring_hop.py``'s io_uring column);
- store: ``FileStore.append_entries`` of one ~600-byte message with fsync
  durability, then one turn of the loop.

The instructions are user space only: the kernel's share of the write and the
sync is left out of both. Writes ``bench/results/append_ir.json``.

    .venv/bin/python bench/append_ir.py --one store 300   # one loop, for callgrind
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from threadline.ai._messages import UserMessage
from threadline.session import FileStore, MessageEntry, SessionRecord, _uring, new_id

RESULTS = Path(__file__).parent / "results" / "append_ir.json"
_LINE = b'{"x":"' + b"a" * 580 + b'"}\n'
_WARM = 20


async def _loop(variant: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    ring = _uring.ring_for(loop)
    if ring is None:
        raise SystemExit(f"no io_uring here: {_uring._shared.unusable}")
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(tmp)
        await store.create_session(SessionRecord(id="s"))
        # Entries are made before either loop, so both variants make the same number.
        entries, parent = [], None
        for _ in range(_WARM + n):
            entries.append(MessageEntry(id=new_id(), parent_id=parent,
                                        message=UserMessage.of("a" * 400)))
            parent = entries[-1].id
        fd = os.open(Path(tmp) / "bare", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for k, entry in enumerate(entries):
                if k in (0, _WARM):
                    os.write(fd, _LINE)  # both paths warm in both variants
                    await ring.wait(fd)
                    await store.append_entries("s", [entry])
                    continue
                if variant == "store":
                    await store.append_entries("s", [entry])
                else:
                    os.write(fd, _LINE)
                    await ring.wait(fd)
                await asyncio.sleep(0)
        finally:
            os.close(fd)
            await store.close()


def _collected(variant: str, n: int) -> int:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--one", variant, str(n)],
        capture_output=True, text=True, env=env, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"callgrind printed no total:\n{out}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "N"))
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=300)
    args = parser.parse_args()
    if args.one:
        asyncio.run(_loop(args.one[0], int(args.one[1])))
        return
    per: dict[str, float] = {}
    for variant in ("bare", "store"):
        short, long = _collected(variant, args.short), _collected(variant, args.long)
        per[variant] = (long - short) / (args.long - args.short)
    ratio = per["store"] / per["bare"]
    print(f"{'variant':8} {'instructions per append':>24}")
    for variant, count in per.items():
        print(f"{variant:8} {count:24,.0f}")
    print(f"store ÷ bare: {ratio:.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "appends": [args.short, args.long], "instructions_per_append": per,
        "ratio": ratio}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
