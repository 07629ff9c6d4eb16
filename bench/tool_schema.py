"""Should a JSON-schema library check hand-written tool schemas instead of ours?

Tools given a hand-written schema have their arguments checked by
``threadline.ai._tools._check`` (a subset of JSON Schema, about 90 lines).
This compares it with the two usual libraries, in the same run:

- import cost: in a fresh interpreter that imports ``threadline.ai`` (which
  holds our checker) and then the library, the library's cumulative import
  time (``-X importtime``, so modules threadline already loaded are not
  counted), as a ratio to ``threadline.ai``'s own; best of the repetitions;
- weight: the distributions each one installs, and their size on disk;
- checking: one call on valid arguments for a typical tool schema (nested
  object, array of objects, enum, optional field, local ``$ref``), against
  ours.

The peers live in bench/.venv, never in threadline's dependencies:

    python3 -m venv bench/.venv
    bench/.venv/bin/pip install -e '.[postgres]' -r bench/requirements-peers.txt
    bench/.venv/bin/python bench/tool_schema.py [--quick]

Writes bench/results/tool_schema.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from threadline.ai._tools import _check

RESULTS = Path(__file__).resolve().parent / "results" / "tool_schema.json"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}},
    "properties": {
        "name": {"type": "string"},
        "mode": {"enum": ["fast", "exact"]},
        "limit": {"type": ["integer", "null"]},
        "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "points"],
    "additionalProperties": False,
}
ARGS = {"name": "route", "mode": "fast", "limit": None, "tags": ["a", "b", "c"],
        "points": [{"x": i, "y": i / 2} for i in range(10)]}

OURS = "threadline (ours)"
PEERS = ("jsonschema", "fastjsonschema")  # module name = distribution name


def import_ms(reps: int) -> dict[str, float]:
    """Best cumulative import time of threadline.ai and of each peer imported after it."""
    best: dict[str, float] = {}
    for _ in range(reps):
        for peer in PEERS:
            err = subprocess.run(
                [sys.executable, "-X", "importtime", "-c", f"import threadline.ai, {peer}"],
                check=True, capture_output=True, text=True).stderr
            for line in err.splitlines():
                # "import time:  self [us] | cumulative | imported package"
                parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
                if len(parts) == 3 and parts[2] in ("threadline.ai", peer):
                    ms = int(parts[1]) / 1000
                    best[parts[2]] = min(best.get(parts[2], ms), ms)
    return best


def dependency_tree(dist: str) -> tuple[list[str], int]:
    """The distributions ``dist`` installs (itself included) and their bytes on disk."""
    seen: dict[str, int] = {}
    todo = [dist]
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower()
        if name in seen:
            continue
        try:
            d = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional extra's requirement that is not installed
        seen[name] = sum(f.locate().stat().st_size for f in d.files or ()
                         if f.locate().exists())
        todo += [r for r in d.requires or () if "extra ==" not in r]
    return sorted(seen), sum(seen.values())


def per_call(fn: Callable[[], Any], reps: int) -> float:
    n = 2000
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def checkers() -> dict[str, Callable[[], Any]]:
    import fastjsonschema
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    compiled = fastjsonschema.compile(SCHEMA)
    return {
        OURS: lambda: _check(ARGS, SCHEMA, SCHEMA, "$"),
        "jsonschema": lambda: validator.validate(ARGS),
        "fastjsonschema": lambda: compiled(ARGS),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    reps = 3 if parser.parse_args().quick else 9
    imports = import_ms(reps)
    base = imports["threadline.ai"]
    calls = checkers()
    ours_call = per_call(calls[OURS], reps)
    rows: list[dict[str, Any]] = [{
        "candidate": OURS, "import_ms": base, "import_vs_ours": 1.0,
        "extra_dists": [], "extra_bytes": 0, "check_us": ours_call * 1e6, "check_vs_ours": 1.0,
    }]
    for peer in PEERS:
        dists, size = dependency_tree(peer)
        call = per_call(calls[peer], reps)
        rows.append({"candidate": peer, "import_ms": imports[peer],
                     "import_vs_ours": imports[peer] / base, "extra_dists": dists,
                     "extra_bytes": size, "check_us": call * 1e6,
                     "check_vs_ours": call / ours_call})
    print("import ms: threadline.ai as a whole (ours), or what the peer adds after it")
    print(f"{'candidate':20} {'import ms':>9} {'x ours':>7} {'dists':>5} {'MB':>6} "
          f"{'check µs':>9} {'x ours':>7}")
    for r in rows:
        print(f"{r['candidate']:20} {r['import_ms']:9.1f} {r['import_vs_ours']:7.2f} "
              f"{len(r['extra_dists']):5} {r['extra_bytes'] / 1e6:6.2f} {r['check_us']:9.1f} "
              f"{r['check_vs_ours']:7.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "python": platform.python_version(), "machine": platform.machine(),
        "rows": rows,
        "versions": {d: importlib.metadata.version(d) for d in ("jsonschema", "fastjsonschema")},
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
