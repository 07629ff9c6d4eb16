"""Importers: reading a pi or Claude Code transcript into threadline entries.

Each scenario reads the same synthetic transcript (turns of a user prompt,
a tool call with its usage and cost, the tool result and a text reply), in
the same process and run, two ways:

- import: ``import_pi`` / ``import_claude_code``, which parse every line,
  check the tree, map it to threadline entries and keep the rest raw;
- floor: ``msgspec.json.decode`` of every line into plain dicts, which is
  the least any reader of the file must do.

The ratio is import / floor, with and without encoding the entries one line
each (``export_lines``, as an export writes them). Timings are the best of several
repetitions (the machine may be shared; the minimum is the least disturbed).

    .venv/bin/python bench/importers.py            # full
    .venv/bin/python bench/importers.py --quick    # smaller, for a smoke run

Writes bench/results/importers.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from threadline.integrations.importers import import_claude_code, import_pi
from threadline.session._codec import export_lines

RESULTS = Path(__file__).resolve().parent / "results" / "importers.json"
T0 = 1_764_000_000_000


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def pi_session(turns: int) -> bytes:
    lines: list[dict[str, Any]] = [{"type": "session", "version": 3, "id": "bench",
                                    "timestamp": _iso(T0), "cwd": "/w"}]
    usage = {"input": 900, "output": 40, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 940,
             "cost": {"input": 0.001, "output": 0.002, "cacheRead": 0, "cacheWrite": 0,
                      "total": 0.003}}
    for t in range(turns):
        call = f"call_{t}"
        for message in (
            {"role": "user", "content": [{"type": "text", "text": f"Read file {t}"}]},
            {"role": "assistant", "content": [{"type": "toolCall", "id": call, "name": "read",
                                               "arguments": {"path": f"src/f{t}.py"}}],
             "api": "anthropic-messages", "provider": "anthropic", "model": "m",
             "usage": usage, "stopReason": "toolUse"},
            {"role": "toolResult", "toolCallId": call, "toolName": "read",
             "content": [{"type": "text", "text": "x = 1\n" * 40}], "isError": False},
            {"role": "assistant", "content": [{"type": "text", "text": "It sets x. " * 10}],
             "api": "anthropic-messages", "provider": "anthropic", "model": "m",
             "usage": usage, "stopReason": "stop"},
        ):
            n = len(lines)
            ms = T0 + n * 1000
            lines.append({"type": "message", "id": f"{n:08x}",
                          "parentId": f"{n - 1:08x}" if n > 1 else None,
                          "timestamp": _iso(ms), "message": {**message, "timestamp": ms}})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def claude_session(turns: int) -> bytes:
    env = {"sessionId": "bench", "cwd": "/w", "version": "2.1.0", "gitBranch": "main",
           "userType": "external", "isSidechain": False}
    lines: list[dict[str, Any]] = []
    usage = {"input_tokens": 900, "output_tokens": 40, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 0}
    for t in range(turns):
        call = f"toolu_{t}"
        for kind, message in (
            ("user", {"role": "user", "content": f"Read file {t}"}),
            ("assistant", {"id": f"msg_{t}", "type": "message", "role": "assistant",
                           "model": "m", "stop_reason": "tool_use", "usage": usage,
                           "content": [{"type": "tool_use", "id": call, "name": "Read",
                                        "input": {"file_path": f"src/f{t}.py"}}]}),
            ("user", {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call,
                                                   "content": "x = 1\n" * 40}]}),
            ("assistant", {"id": f"msg_{t}b", "type": "message", "role": "assistant",
                           "model": "m", "stop_reason": "end_turn", "usage": usage,
                           "content": [{"type": "text", "text": "It sets x. " * 10}]}),
        ):
            n = len(lines)
            lines.append({**env, "type": kind, "uuid": f"u{n}",
                          "parentUuid": f"u{n - 1}" if n else None,
                          "timestamp": _iso(T0 + n * 1000), "message": message})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def best_ns(work: Callable[[], Any], reps: int) -> int:
    best = None
    for _ in range(reps):
        start = time.perf_counter_ns()
        work()
        elapsed = time.perf_counter_ns() - start
        best = elapsed if best is None else min(best, elapsed)
    assert best is not None
    return best


def measure(name: str, data: bytes, importer: Callable[[bytes, str], Any],
            reps: int) -> dict[str, Any]:
    lines = data.split(b"\n")[:-1]
    floor = best_ns(lambda: [msgspec.json.decode(line) for line in lines], reps)
    imported = best_ns(lambda: importer(data, "bench.jsonl"), reps)
    encoded = best_ns(lambda: [export_lines(s.entries) for s in importer(data, "b")], reps)
    return {
        "scenario": name,
        "lines": len(lines),
        "bytes": len(data),
        "floor_us_per_line": floor / len(lines) / 1e3,
        "import_us_per_line": imported / len(lines) / 1e3,
        "import_over_floor": imported / floor,
        "import_and_encode_over_floor": encoded / floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    turns, reps = (200, 3) if args.quick else (2_500, 9)
    rows = [measure("pi", pi_session(turns), import_pi, reps),
            measure("claude code", claude_session(turns), import_claude_code, reps)]
    header = (f"{'scenario':<13}{'lines':>8}{'floor µs':>10}{'import µs':>11}"
              f"{'import/floor':>14}{'+encode/floor':>15}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['scenario']:<13}{r['lines']:>8}{r['floor_us_per_line']:>10.2f}"
              f"{r['import_us_per_line']:>11.2f}{r['import_over_floor']:>14.2f}"
              f"{r['import_and_encode_over_floor']:>15.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "quick": args.quick,
        "repetitions": reps,
        "rows": rows,
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
