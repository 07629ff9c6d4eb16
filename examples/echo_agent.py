#!/usr/bin/env python3
"""A tiny agent CLI that speaks threadline's subprocess protocol.

See docs/subprocess-protocol.md. Run it under a durable agent with::

    factory = durable.subprocess([sys.executable, "examples/echo_agent.py"])
    agent = await durable.open(factory, store=store, session_id="demo")
    async for event in agent.run("sleep 0.5"):
        ...

It answers the last user message of its input:

- ``sleep SECONDS``: one turn that calls its ``sleep`` tool (which reports
  progress every 50 ms), then a second turn saying it is done;
- anything else: ``echo: <text>``, streamed word by word.

On SIGTERM (threadline aborting the run) it reports the message or tool call
it was in the middle of as aborted, then ``agent_end`` with an error, and
exits. Environment: ``ECHO_AGENT_DELAY`` seconds between streamed words
(default 0); ``ECHO_AGENT_PIDFILE`` a file to write its pid to (for tests).
Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

MODEL = {"model": "echo-1", "provider": "echo-agent"}


class Stop(Exception):
    """Raised by the SIGTERM handler."""


def on_sigterm(signum: int, frame: object) -> None:
    raise Stop


def emit(event_type: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"type": event_type, **fields}) + "\n")
    sys.stdout.flush()


def assistant(content: list[dict[str, Any]], stop_reason: str = "stop") -> dict[str, Any]:
    return {"role": "assistant", "content": content, "stop_reason": stop_reason, **MODEL}


def text_result(call_id: str, name: str, text: str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"role": "tool_result", "tool_call_id": call_id, "tool_name": name,
            "content": content, **extra}


class Agent:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.streamed: str | None = None  # text of the message being streamed
        self.open_call: tuple[str, str] | None = None  # (id, name) of a running tool

    def say(self, text: str) -> None:
        emit("message_start", message=assistant([]))
        emit("message_update", event={"type": "start", **MODEL})
        emit("message_update", event={"type": "text_start", "index": 0})
        self.streamed = ""
        for i, word in enumerate(text.split(" ")):
            delta = word if i == 0 else " " + word
            # Noted before it is sent: SIGTERM may land between any two lines.
            self.streamed += delta
            emit("message_update", event={"type": "text_delta", "index": 0, "delta": delta})
            time.sleep(self.delay)
        emit("message_update", event={"type": "text_end", "index": 0, "text": text})
        self.streamed = None
        emit("message_end", message=assistant([{"type": "text", "text": text}]))

    def sleep_tool(self, seconds: float) -> None:
        call = {"type": "tool_call", "id": "call-1", "name": "sleep",
                "arguments": {"seconds": seconds}}
        self.open_call = ("call-1", "sleep")
        emit("message_end", message=assistant([call], stop_reason="tool_use"))
        emit("tool_execution_start", tool_call_id="call-1", tool_name="sleep",
             arguments=call["arguments"])
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
            emit("tool_execution_update", tool_call_id="call-1",
                 update={"left": max(0.0, round(deadline - time.monotonic(), 3))})
        result = text_result("call-1", "sleep", f"slept {seconds} s")
        emit("tool_execution_end", tool_call_id="call-1", result=result)
        self.open_call = None
        emit("message_end", message=result)
        self.say(f"done sleeping {seconds} s")

    def run(self, text: str) -> None:
        words = text.split()
        if len(words) == 2 and words[0] == "sleep":
            self.sleep_tool(float(words[1]))
        else:
            self.say(f"echo: {text}")

    def wind_down(self) -> None:
        """Report what SIGTERM cut short, so the stored transcript says what happened."""
        if self.streamed is not None:
            content = [{"type": "text", "text": self.streamed}] if self.streamed else []
            emit("message_end", message=assistant(content, stop_reason="aborted"))
        if self.open_call is not None:
            call_id, name = self.open_call
            emit("message_end", message=text_result(
                call_id, name, "stopped by SIGTERM", is_error=True, synthesized="aborted"))
        emit("agent_end", error="stopped by SIGTERM")


def main() -> int:
    if pidfile := os.environ.get("ECHO_AGENT_PIDFILE"):
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    request = json.loads(sys.stdin.readline())
    if request.get("type") != "run" or request.get("version") != 1:
        print(f"echo_agent: cannot handle request {request!r:.200}", file=sys.stderr)
        return 2
    users = [m for m in request["input"] if m["role"] == "user"]
    text = "".join(p["text"] for p in users[-1]["content"] if p["type"] == "text") if users else ""
    agent = Agent(float(os.environ.get("ECHO_AGENT_DELAY", "0")))
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        agent.run(text)
        emit("agent_end")
    except Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        agent.wind_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
