"""What a loaded session keeps, object by object, against its file size.

    .venv/bin/python bench/retained.py            # 100,000 entries per file
    .venv/bin/python bench/retained.py --quick    # 10,000

Prints a table and writes bench/results/retained.json. Two files, each
loaded with ``FileStore.load_entries``:

- store: bench/store.py's session (user / assistant with thinking, text and
  a tool call / tool result, appended 10,000 entries a call, so batch lines);
- format: bench/format.py's (user and assistant messages of one 400-character
  text each, appended one entry a call).

For each: tracemalloc's retained size of the load over the file size, and
``sys.getsizeof`` of every object the entries reach, counted once, grouped by
what holds it (a string by its field), per entry. A string reached again
(a parent id that is the previous entry's id) counts as shared, not again;
``None``, booleans, small ints and the UTC singleton are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from format import workload
from store import realistic_entries

from threadline.session import FileStore, MessageEntry, SessionRecord
from threadline.session._codec import encode_init, export_lines

RESULTS = Path(__file__).parent / "results" / "retained.json"


def _by_holder(entries: list[Any]) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Per holder: bytes (``sys.getsizeof``, each object once), objects, references again."""
    seen = {id("")}
    size: Counter[str] = Counter()
    count: Counter[str] = Counter()
    shared: Counter[str] = Counter()
    stack: list[tuple[Any, str]] = [(e, type(e).__name__) for e in reversed(entries)]
    while stack:
        obj, label = stack.pop()
        if (obj is None or isinstance(obj, bool) or obj is datetime.UTC
                or (type(obj) is int and -5 <= obj <= 256)):
            continue
        if id(obj) in seen:
            shared[label] += 1
            continue
        seen.add(id(obj))
        size[label] += sys.getsizeof(obj)
        count[label] += 1
        if isinstance(obj, msgspec.Struct):
            for field in reversed(obj.__struct_fields__):
                value = getattr(obj, field)
                held = type(value).__name__
                stack.append((value, f"{type(obj).__name__}.{field}" if held == "str" else held))
        elif isinstance(obj, tuple | list):
            stack.extend((v, type(v).__name__) for v in reversed(obj))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((k, "dict key"))
                stack.append((v, "dict value " + type(v).__name__))
    return size, count, shared


def measure(root: Path, name: str, entries: list[MessageEntry], batch: int) -> dict[str, Any]:
    store = FileStore(root / name, durability="flush")
    if batch > 1:
        asyncio.run(store.create_session(SessionRecord(id=name)))
        for start in range(0, len(entries), batch):
            asyncio.run(store.append_entries(name, entries[start:start + batch]))
    else:  # one line per entry, as single appends write them, without 100,000 calls
        path = store.path_for(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_init(SessionRecord(id=name)) + b"\n" + export_lines(entries))
    file_size = store.path_for(name).stat().st_size
    fresh = FileStore(root / name)
    gc.collect()
    tracemalloc.start()
    loaded = asyncio.run(fresh.load_entries(name))
    retained, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(loaded)
    size, count, shared = _by_holder(loaded)
    rows = [{"holder": k, "bytes_per_entry": v / n, "objects": count[k]}
            for k, v in size.most_common()]
    return {
        "entries": n,
        "file_bytes": file_size,
        "line_bytes": file_size / n,
        "retained_per_entry": retained / n,
        "retained_to_file": retained / file_size,
        "getsizeof_per_entry": sum(size.values()) / n,
        "rows": rows,
        "shared_references": dict(shared),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 10_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "store": measure(Path(tmp), "store", realistic_entries(n), 10_000),
            "format": measure(Path(tmp), "format", workload(n), 1),
        }
    for name, r in results.items():
        print(f"\n{name}: {r['entries']:,} entries, {r['line_bytes']:.0f} B a line; retained "
              f"{r['retained_per_entry']:.0f} B an entry = {r['retained_to_file']:.2f}x the file "
              f"(getsizeof {r['getsizeof_per_entry']:.0f} B)")
        print(f"  {'held by':34} {'B/entry':>8} {'objects':>8}")
        for row in r["rows"]:
            print(f"  {row['holder']:34} {row['bytes_per_entry']:8.1f} {row['objects']:8,}")
        reached = ", ".join(f"{k} {v:,}" for k, v in r["shared_references"].items())
        print(f"  reached again, not counted: {reached}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"python": sys.version.split()[0], "msgspec": msgspec.__version__,
                                   **results}, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
