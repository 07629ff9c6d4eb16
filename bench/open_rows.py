"""The open rows of bench/format.py and bench/store.py alone, for comparing two trees.

    .venv/bin/python bench/open_rows.py --label after
    PYTHONPATH=/path/to/other/src .venv/bin/python /path/to/other/bench/open_rows.py \
        --label before --out bench/results/open_rows.json

Runs ``bench_open`` of both scripts (100,000 entries, 5 repeats each, every
ratio against its floor measured in the same run) for whichever threadline
is imported, prints one line and appends it, labelled, to the results file
(``bench/results/open_rows.json`` by default). Alternate the trees, run after
run: the machine's load moves more than the change does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import format as format_bench
import store as store_bench

RESULTS = Path(__file__).parent / "results" / "open_rows.json"
_FIGURES = ("ratio", "store_ms", "floor_ms", "retained_to_file", "peak_to_file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--dir", help="directory for the files (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        opened = format_bench.bench_open(Path(tmp), 100_000, 5)
        stored = store_bench.bench_open(Path(tmp), 100_000, 5)
    run: dict[str, Any] = {
        "label": args.label, "load_average": os.getloadavg()[0],
        "format_v3": {k: opened["v3"][k] for k in _FIGURES},
        "format_v2": {k: opened["v2"][k] for k in _FIGURES},
        "store": {k: stored[k] for k in _FIGURES},
    }
    print(f"{args.label:8} load {run['load_average']:4.1f}  " + "  ".join(
        f"{name} {run[name]['ratio']:.2f}x (retained {run[name]['retained_to_file']:.2f}x file)"
        for name in ("format_v3", "format_v2", "store")))
    runs = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps([*runs, run], indent=2) + "\n")


if __name__ == "__main__":
    main()
