"""The subprocess loop: an agent CLI's stdout read into typed agent events, against parsing it.

A child process (``cat`` of a prepared file, so the child costs next to
nothing) prints a run's events as JSON lines: one assistant message
streamed a token at a time, or rounds of a tool call, its progress and its
result; then ``agent_end``. In turns:

- ``durable.subprocess([...])``'s loop run to its end: the lines read,
  checked against the protocol and decoded into the agent's event types;
- the floor: the same child started with asyncio, its stdout read line by
  line and each line parsed with msgspec, untyped.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bench._floors import decode_each
from bench._harness import Run, alternate
from bench._targets import UserMessage, durable

NEEDS = ()
MINUTES = 0.5


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def streamed_text(deltas: int) -> list[bytes]:
    lines = [_line({"type": "message_start", "message": {"role": "assistant", "model": "m"}}),
             _line({"type": "message_update",
                    "event": {"type": "start", "model": "m", "provider": "p"}}),
             _line({"type": "message_update", "event": {"type": "text_start", "index": 0}})]
    lines += [_line({"type": "message_update",
                     "event": {"type": "text_delta", "index": 0, "delta": f"tok{i} "}})
              for i in range(deltas)]
    text = "".join(f"tok{i} " for i in range(deltas))
    lines.append(_line({"type": "message_update",
                        "event": {"type": "text_end", "index": 0, "text": text}}))
    lines.append(_line({"type": "message_end", "message": {
        "role": "assistant", "content": [{"type": "text", "text": text}], "model": "m"}}))
    return [*lines, _line({"type": "agent_end"})]


def tool_rounds(rounds: int) -> list[bytes]:
    lines = []
    for i in range(rounds):
        call = {"type": "tool_call", "id": f"c{i}", "name": "ls", "arguments": {"path": f"/d{i}"}}
        result = {"role": "tool_result", "tool_call_id": f"c{i}", "tool_name": "ls",
                  "content": [{"type": "text", "text": "a.txt\nb.txt\n" * 20}]}
        lines += [
            _line({"type": "message_end", "message": {
                "role": "assistant", "content": [call], "stop_reason": "tool_use"}}),
            _line({"type": "tool_execution_start", "tool_call_id": f"c{i}", "tool_name": "ls",
                   "arguments": call["arguments"]}),
            _line({"type": "tool_execution_update", "tool_call_id": f"c{i}", "tool_name": "ls",
                   "update": {"done": 0.5}}),
            _line({"type": "tool_execution_end", "tool_call_id": f"c{i}", "result": result}),
            _line({"type": "message_end", "message": result}),
        ]
    lines.append(_line({"type": "message_end", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "done"}]}}))
    return [*lines, _line({"type": "agent_end"})]


async def measure(run: Run, name: str, lines: list[bytes], turns: int) -> None:
    path = run.tmp / f"{name.replace(' ', '-')}.jsonl"
    path.write_bytes(b"".join(lines))
    argv = ["cat", str(path)]
    factory = durable.subprocess(argv)
    go = [UserMessage.of("go")]

    async def typed() -> None:
        async for event in factory().run([], go):
            if event.type == "agent_end" and event.error is not None:
                raise RuntimeError(f"{name}: the run failed: {event.error}")

    async def floor() -> None:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            limit=1 << 24)  # lines of the long script pass asyncio's 64 KiB default
        assert proc.stdout is not None
        got = []
        async for line in proc.stdout:
            got.append(line)
        decode_each(got)
        await proc.wait()

    got = await alternate({"typed": typed, "floor": floor}, turns)
    run.row(f"subprocess loop, {name} ({len(lines):,} lines), per line",
            got.median("typed") / len(lines) * 1e6, "µs",
            versus="the same child's stdout read with asyncio, each line parsed untyped",
            versus_value=got.median("floor") / len(lines) * 1e6,
            ratio=got.paired("typed", "floor"), detail=f"median of {turns} paired turns")


def main(run: Run) -> None:
    scale, turns = run.pick((10, 15), (1, 2))
    asyncio.run(measure(run, "a streamed text", streamed_text(1_000 * scale), turns))
    asyncio.run(measure(run, "tool rounds", tool_rounds(100 * scale), turns))
