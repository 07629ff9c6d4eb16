"""Importing a pi or Claude Code transcript, against parsing its lines.

The same synthetic transcript (turns of a user prompt, a tool call with its
usage and cost, the tool result and a text reply), read in turns two ways:
``import_pi`` / ``import_claude_code`` (parse every line, check the tree, map
it to threadline entries, keep the rest raw), and the floor, ``msgspec``
parsing every line untyped, the least any reader of the file must do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from bench._floors import decode_each
from bench._harness import Run, alternate_sync
from bench._targets import import_claude_code, import_pi

NEEDS = ()
MINUTES = 0.5
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


def measure(run: Run, name: str, data: bytes, importer: Callable[[bytes, str], Any],
            turns: int) -> None:
    lines = data.split(b"\n")[:-1]
    got = alternate_sync({"import": lambda: importer(data, "bench.jsonl"),
                          "floor": lambda: decode_each(lines)}, turns, collect=True)
    run.row(f"import of a {len(lines):,}-line {name} transcript, per line",
            got.median("import") / len(lines) * 1e6, "µs",
            versus="msgspec parsing each line, untyped",
            versus_value=got.median("floor") / len(lines) * 1e6,
            ratio=got.paired("import", "floor"), detail=f"median of {turns} paired turns")


def main(run: Run) -> None:
    turns, reps = run.pick((2_500, 9), (100, 2))
    measure(run, "pi", pi_session(turns), import_pi, reps)
    measure(run, "Claude Code", claude_session(turns), import_claude_code, reps)
