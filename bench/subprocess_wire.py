"""Subprocess wire decoding: typed agent events against untyped JSON parsing.

The subprocess loop reads every stdout line of an agent CLI with one msgspec
decoder into the agent's own event structs (validated, tagged unions, nested
messages and stream events). Each scenario decodes the same lines, in the
same process and run, three ways:

- typed: ``decode_event``, what the loop does;
- floor: ``msgspec.json.decode`` into plain dicts and lists, no validation;
- stdlib: ``json.loads``, what a hand-written reader would start from.

Ratios are typed / floor and typed / stdlib. Timings are the best of several
repetitions (the machine may be shared; the minimum is the least disturbed).

    .venv/bin/python bench/subprocess_wire.py            # full
    .venv/bin/python bench/subprocess_wire.py --quick    # smaller, for a smoke run

Writes bench/results/subprocess_wire.json.
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

from threadline.agent._subprocess._wire import decode_event

RESULTS = Path(__file__).resolve().parent / "results" / "subprocess_wire.json"


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def streamed_text(deltas: int) -> list[bytes]:
    """One assistant message streamed a token at a time."""
    lines = [_line({"type": "message_start", "message": {"role": "assistant", "model": "m"}}),
             _line({"type": "message_update",
                    "event": {"type": "start", "model": "m", "provider": "p"}}),
             _line({"type": "message_update", "event": {"type": "text_start", "index": 0}})]
    lines += [_line({"type": "message_update",
                     "event": {"type": "text_delta", "index": 0, "delta": f"tok{i} "}})
              for i in range(deltas)]
    text = "".join(f"tok{i} " for i in range(deltas))
    lines.append(_line({"type": "message_end", "message": {
        "role": "assistant", "content": [{"type": "text", "text": text}], "model": "m"}}))
    return lines


def tool_rounds(rounds: int) -> list[bytes]:
    """Rounds of one tool call, its progress and its result."""
    lines = []
    for i in range(rounds):
        call = {"type": "tool_call", "id": f"c{i}", "name": "ls", "arguments": {"path": f"/d{i}"}}
        result = {"role": "tool_result", "tool_call_id": f"c{i}", "tool_name": "ls",
                  "content": [{"type": "text", "text": "a.txt\nb.txt\n" * 20}]}
        lines += [
            _line({"type": "message_end", "message": {
                "role": "assistant", "content": [call], "stop_reason": "tool_use"}}),
            _line({"type": "tool_execution_start", "tool_call_id": f"c{i}",
                   "arguments": call["arguments"]}),
            _line({"type": "tool_execution_update", "tool_call_id": f"c{i}",
                   "update": {"done": 0.5}}),
            _line({"type": "tool_execution_end", "tool_call_id": f"c{i}", "result": result}),
            _line({"type": "message_end", "message": result}),
        ]
    return lines


def best_ns(decode: Callable[[bytes], Any], lines: list[bytes], reps: int) -> int:
    best = None
    for _ in range(reps):
        start = time.perf_counter_ns()
        for line in lines:
            decode(line)
        elapsed = time.perf_counter_ns() - start
        best = elapsed if best is None else min(best, elapsed)
    assert best is not None
    return best


def measure(name: str, lines: list[bytes], reps: int) -> dict[str, Any]:
    typed = best_ns(decode_event, lines, reps)
    floor = best_ns(msgspec.json.decode, lines, reps)
    stdlib = best_ns(json.loads, lines, reps)
    return {
        "scenario": name,
        "lines": len(lines),
        "bytes": sum(map(len, lines)),
        "typed_us_per_line": typed / len(lines) / 1e3,
        "floor_us_per_line": floor / len(lines) / 1e3,
        "stdlib_us_per_line": stdlib / len(lines) / 1e3,
        "typed_over_floor": typed / floor,
        "typed_over_stdlib": typed / stdlib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scale, reps = (1, 3) if args.quick else (10, 15)
    rows = [measure("text stream", streamed_text(1_000 * scale), reps),
            measure("tool rounds", tool_rounds(100 * scale), reps)]
    header = (f"{'scenario':<14}{'lines':>8}{'typed µs':>10}{'floor µs':>10}{'json µs':>10}"
              f"{'typed/floor':>13}{'typed/json':>12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['scenario']:<14}{r['lines']:>8}{r['typed_us_per_line']:>10.2f}"
              f"{r['floor_us_per_line']:>10.2f}{r['stdlib_us_per_line']:>10.2f}"
              f"{r['typed_over_floor']:>13.2f}{r['typed_over_stdlib']:>12.2f}")
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
