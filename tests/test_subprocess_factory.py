"""The subprocess factory (S3): an external agent CLI driven over JSON lines.

Every test starts real child processes: ``examples/echo_agent.py`` or a small
script that replays the stdout lines a test gives it (``replay``). Every run's
events go through ``check_grammar`` (the order of ``threadline.agent._events``)
and every child is checked to be gone afterwards, not even a zombie and
nothing left in its process group (``assert_gone``, which reads ``/proc``).
``asyncio.timeout`` only turns a hang into a failure; nothing asserts a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from threadline import durable
from threadline.agent._events import (
    AgentEnd,
    AgentEvent,
    MessageEnd,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.agent._subprocess import PROTOCOL_VERSION, SubprocessLoop
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._model import TextDelta
from threadline.durable import RunStarted, StoredMessageEnd
from threadline.errors import SubprocessError
from threadline.session import MessageEntry
from threadline.stores import FileStore
from threadline.testing import assert_event_order, assert_valid_for_providers

ECHO_AGENT = Path(__file__).resolve().parent.parent / "examples" / "echo_agent.py"
GRACE = 0.3

# --------------------------------------------------------------------------- helpers


def check_grammar(events: Sequence[AgentEvent]) -> AgentEnd:
    return assert_event_order(events, strict=False)


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, process group) of a process, or None once it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def assert_gone(pid: int) -> None:
    """The child is reaped, and nothing is left running in its process group.

    The child itself must be gone at once. What it left in its group was sent
    SIGKILL but belongs to init after the child's exit: it gets a moment to
    die, and may stay a zombie until init reaps it.
    """
    assert _stat(str(pid)) is None, f"process {pid} is still there: {_stat(str(pid))}"
    deadline = time.monotonic() + 5
    while left := [p for p in os.listdir("/proc")
                   if p.isdigit() and (_stat(p) or ("Z", 0)) not in (("Z", pid), ("Z", 0))
                   and (_stat(p) or ("", 0))[1] == pid]:
        assert time.monotonic() < deadline, f"processes left running in group {pid}: {left}"
        time.sleep(0.01)


def pid_of(pidfile: Path) -> int:
    return int(pidfile.read_text())


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def echo(tmp_path: Path, *, delay: float = 0.0, grace: float = GRACE) -> Any:
    pidfile = tmp_path / "echo.pid"
    factory = durable.subprocess(
        [sys.executable, str(ECHO_AGENT)], grace=grace,
        env=env_with(ECHO_AGENT_PIDFILE=str(pidfile), ECHO_AGENT_DELAY=str(delay)),
    )
    return factory, pidfile


# The script behind ``replay``: it writes its pid, reads the run request (or
# not), writes the given stderr, prints the given stdout lines (a dict becomes
# one JSON line, a string is written as is), sleeps, and exits with a status.
REPLAY = r"""
import json, os, signal, sys, time
open(os.environ["ECHO_AGENT_PIDFILE"], "w").write(str(os.getpid()))
spec = json.load(open(sys.argv[1]))
if spec["term_marker"]:
    def noted(*_):
        open(spec["term_marker"], "w").write("SIGTERM")
    signal.signal(signal.SIGTERM, noted)
if spec["close_stdin"]:
    os.close(0)
if spec["stderr"]:
    sys.stderr.write(spec["stderr"]); sys.stderr.flush()
if spec["read_stdin"] == "first":
    open(spec["request_copy"], "w").write(sys.stdin.readline())
for line in spec["lines"]:
    sys.stdout.write(line if isinstance(line, str) else json.dumps(line) + "\n")
    sys.stdout.flush()
if spec["read_stdin"] == "last":
    open(spec["request_copy"], "w").write(sys.stdin.readline())
if spec["spawn"]:
    import subprocess
    subprocess.Popen(spec["spawn"])
time.sleep(spec["sleep"])
sys.exit(spec["exit"])
"""


def replay(
    tmp_path: Path,
    lines: Sequence[Any],
    *,
    exit: int = 0,
    sleep: float = 0.0,
    stderr: str = "",
    read_stdin: str = "first",
    close_stdin: bool = False,
    term_marker: Path | None = None,
    spawn: Sequence[str] = (),
    grace: float = GRACE,
    line_limit: int | None = None,
) -> tuple[Any, Path]:
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "lines": list(lines), "exit": exit, "sleep": sleep, "stderr": stderr,
        "read_stdin": read_stdin, "close_stdin": close_stdin, "spawn": list(spawn),
        "term_marker": str(term_marker) if term_marker else "",
        "request_copy": str(tmp_path / "request.json"),
    }))
    pidfile = tmp_path / "replay.pid"
    options: dict[str, Any] = {"line_limit": line_limit} if line_limit else {}
    factory = durable.subprocess(
        [sys.executable, str(script), str(spec)], grace=grace,
        env=env_with(ECHO_AGENT_PIDFILE=str(pidfile)), **options,
    )
    return factory, pidfile


def assistant(*content: Any, stop_reason: str = "stop") -> dict[str, Any]:
    return {"role": "assistant", "content": list(content), "stop_reason": stop_reason}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def call(call_id: str, name: str = "ls") -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": {"path": "."}}


def result(call_id: str, t: str = "ok", name: str = "ls") -> dict[str, Any]:
    return {"role": "tool_result", "tool_call_id": call_id, "tool_name": name,
            "content": [text(t)]}


def ev(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


STREAM_START = [
    ev("message_start", message=assistant()),
    ev("message_update", event={"type": "start", "model": "m", "provider": "p"}),
    ev("message_update", event={"type": "text_start", "index": 0}),
    ev("message_update", event={"type": "text_delta", "index": 0, "delta": "partial"}),
]


async def run_loop(
    factory: Any, input: str = "hi", *, context: Sequence[Message] = (),
    abort: asyncio.Event | None = None,
) -> tuple[list[AgentEvent], AgentEnd]:
    async with asyncio.timeout(20):
        events = [e async for e in factory().run(context, [UserMessage.of(input)], abort=abort)]
    return events, check_grammar(events)


def turns_of(events: Sequence[Any]) -> list[AssistantMessage]:
    return [e.message for e in events if isinstance(e, TurnEnd)]


def error_of(end: AgentEnd) -> str:
    assert isinstance(end.error, SubprocessError), f"expected a SubprocessError, got {end.error!r}"
    return str(end.error)


# --------------------------------------------------------------------------- normal runs


async def test_s3_durable_run_with_a_tool_call_stores_every_message_as_a_receipt(
    tmp_path: Path,
) -> None:
    factory, pidfile = echo(tmp_path)
    store = FileStore(tmp_path / "store")
    agent = await durable.open(factory, store=store, session_id="tool-run")
    async with asyncio.timeout(20):
        events = await agent.run("sleep 0.12").collect()
    assert isinstance(events[0], RunStarted)
    end = check_grammar(events[1:])  # type: ignore[arg-type]
    assert end.error is None
    assert_gone(pid_of(pidfile))

    first, second = turns_of(events)
    assert first.tool_calls == (ToolCall(id="call-1", name="sleep", arguments={"seconds": 0.12}),)
    assert second.text == "done sleeping 0.12 s"
    assert [e.update for e in events if isinstance(e, ToolExecutionUpdate)], "no progress"
    # Each message end is a receipt: the entry it carries is the one stored, in order.
    receipts = [e for e in events if isinstance(e, MessageEnd)]
    assert all(isinstance(e, StoredMessageEnd) for e in receipts)
    stored = await store.load_entries("tool-run")
    assert [e.entries for e in receipts] == [(s,) for s in stored]  # type: ignore[attr-defined]
    assert [s.message for s in stored if isinstance(s, MessageEntry)] == list(end.messages)
    tool_result = end.messages[2]
    assert isinstance(tool_result, ToolResultMessage) and tool_result.text == "slept 0.12 s"

    # The next run sends the whole conversation as context.
    reopened = await durable.open(factory, store=FileStore(tmp_path / "store"),
                                  session_id="tool-run")
    assert reopened.repaired == ()
    assert_valid_for_providers(reopened.messages())
    events = await reopened.run("again").collect()
    assert turns_of(events)[0].text == "echo: again"
    assert_gone(pid_of(pidfile))


async def test_the_child_gets_one_request_line_with_context_and_input(tmp_path: Path) -> None:
    factory, _ = replay(tmp_path, [ev("message_end", message=assistant(text("yes"))),
                                   ev("agent_end")])
    context: list[Message] = [
        UserMessage.of("before"), AssistantMessage(content=(TextPart(text="earlier"),))]
    _, end = await run_loop(factory, "now", context=context)
    assert end.error is None
    request = json.loads((tmp_path / "request.json").read_text())
    assert request == {
        "type": "run", "version": PROTOCOL_VERSION,
        "context": [{"role": "user", "content": [text("before")]},
                    {"role": "assistant", "content": [text("earlier")]}],
        "input": [{"role": "user", "content": [text("now")]}],
    }


async def test_echo_agent_streams_text_and_keeps_the_grammar(tmp_path: Path) -> None:
    factory, pidfile = echo(tmp_path)
    events, end = await run_loop(factory, "hello there world")
    assert end.error is None
    deltas = [e.event.delta for e in events
              if isinstance(e, MessageUpdate) and isinstance(e.event, TextDelta)]
    assert deltas == ["echo:", " hello", " there", " world"]
    assert turns_of(events)[0].text == "echo: hello there world"
    assert_gone(pid_of(pidfile))


@pytest.mark.parametrize("style", ["minimal", "with_turns_and_echo", "execution_without_result"])
async def test_turn_events_and_echoes_are_optional_and_the_wrapper_owns_turns(
    tmp_path: Path, style: str
) -> None:
    lines: list[Any] = [
        ev("message_end", message=assistant(call("a"), call("b"), stop_reason="tool_use")),
        ev("message_end", message=result("b", "B")),
        ev("message_end", message=result("a", "A")),
        ev("message_end", message=assistant(text("done"))),
        ev("agent_end"),
    ]
    if style == "with_turns_and_echo":
        echo_line = {"role": "user", "content": [text("hi")]}
        lines = [ev("message_start", message=echo_line), ev("message_end", message=echo_line),
                 ev("turn_start", turn=7), lines[0], lines[1], lines[2], ev("turn_end"),
                 ev("turn_start"), ev("message_start", message=assistant()), lines[3],
                 ev("turn_end"), lines[4]]
    elif style == "execution_without_result":
        lines[1:1] = [ev("tool_execution_start", tool_call_id="a", arguments={"path": "."}),
                      ev("tool_execution_update", tool_call_id="a", update=1),
                      ev("tool_execution_end", tool_call_id="a")]
    factory, pidfile = replay(tmp_path, lines)
    events, end = await run_loop(factory)
    assert end.error is None
    assert len(turns_of(events)) == 2
    assert [t.turn for t in events if isinstance(t, TurnStart)] == [1, 2]
    # Results come in call order, whatever order the child answered in.
    turn_end = next(e for e in events if isinstance(e, TurnEnd))
    assert [r.text for r in turn_end.tool_results] == ["A", "B"]
    if style == "execution_without_result":
        (exec_end,) = [e for e in events if isinstance(e, ToolExecutionEnd)]
        assert exec_end.result.text == "A"
    assert_gone(pid_of(pidfile))


async def test_the_minimal_agent_of_the_protocol_document_works(tmp_path: Path) -> None:
    doc = (ECHO_AGENT.parent.parent / "docs" / "subprocess-protocol.md").read_text()
    section = doc[doc.index("## A minimal agent"):]
    start = section.index("```python\n") + 10
    code = section[start : section.index("\n```", start)]
    script = tmp_path / "minimal.py"
    script.write_text(code)
    factory = durable.subprocess([sys.executable, str(script)], grace=GRACE)
    events, end = await run_loop(factory, "stressed")
    assert end.error is None and turns_of(events)[0].text == "desserts"


async def test_huge_lines_pass_and_an_overlong_line_is_a_clear_error(tmp_path: Path) -> None:
    big = "x" * 5_000_000
    factory, pidfile = replay(tmp_path, [ev("message_end", message=assistant(text(big))),
                                         ev("agent_end")])
    events, end = await run_loop(factory)
    assert end.error is None and turns_of(events)[0].text == big

    factory, pidfile = replay(tmp_path, [ev("message_end", message=assistant(text(big)))],
                              sleep=30, line_limit=1_000_000)
    _, end = await run_loop(factory)
    assert "stdout line 1 longer than 1000000 bytes" in error_of(end)
    assert_gone(pid_of(pidfile))

    # The same for a whole line that arrives at once, newline included.
    factory, pidfile = replay(tmp_path, [ev("message_end", message=assistant(text("z" * 2000))),
                                         ev("agent_end")], line_limit=1000)
    _, end = await run_loop(factory)
    assert "stdout line 1 longer than 1000 bytes" in error_of(end)
    assert_gone(pid_of(pidfile))


async def test_heavy_stderr_a_large_context_and_output_before_reading_do_not_deadlock(
    tmp_path: Path,
) -> None:
    # 4 MB on stderr in one line, 2 MB of output written before the child even
    # reads its (2 MB) request: each pipe is far beyond its 64 KB buffer.
    deltas = [ev("message_update", event={"type": "text_delta", "index": 0, "delta": "y" * 1000})
              for _ in range(2000)]
    lines = [ev("message_start", message=assistant()),
             ev("message_update", event={"type": "text_start", "index": 0}),
             *deltas, ev("message_end", message=assistant(text("ok"))), ev("agent_end")]
    factory, pidfile = replay(tmp_path, lines, stderr="e" * 4_000_000 + "\nlast words\n",
                              read_stdin="last")
    context = [UserMessage.of("c" * 2_000_000)]
    events, end = await run_loop(factory, context=context)
    assert end.error is None and turns_of(events)[0].text == "ok"
    request = json.loads((tmp_path / "request.json").read_text())
    assert request["context"][0]["content"][0]["text"] == "c" * 2_000_000
    assert_gone(pid_of(pidfile))


async def test_a_child_that_closes_stdin_without_reading_is_fine(tmp_path: Path) -> None:
    factory, pidfile = replay(
        tmp_path, [ev("message_end", message=assistant(text("ignored you"))), ev("agent_end")],
        read_stdin="never", close_stdin=True,
    )
    events, end = await run_loop(factory, context=[UserMessage.of("c" * 1_000_000)])
    assert end.error is None and turns_of(events)[0].text == "ignored you"
    assert_gone(pid_of(pidfile))


async def test_what_the_child_leaves_in_its_process_group_is_killed(tmp_path: Path) -> None:
    factory, pidfile = replay(tmp_path, [ev("message_end", message=assistant(text("bye"))),
                                         ev("agent_end")], spawn=["sleep", "60"])
    _, end = await run_loop(factory)
    assert end.error is None
    assert_gone(pid_of(pidfile))  # the sleep was in its group

    # The sleep holds the child's stdout, yet its exit is noticed and reported.
    factory, pidfile = replay(tmp_path, STREAM_START, spawn=["sleep", "60"], exit=1)
    _, end = await run_loop(factory)
    assert "exited with status 1 before reporting agent_end" in error_of(end)
    assert_gone(pid_of(pidfile))


# --------------------------------------------------------------------------- failures


async def test_garbage_output_is_an_error_naming_the_line(tmp_path: Path) -> None:
    factory, pidfile = replay(tmp_path, [*STREAM_START, "this is not json\n"], sleep=30)
    events, end = await run_loop(factory)
    message = error_of(end)
    assert "stdout line 5" in message and "this is not json" in message
    assert "killed by SIGTERM (sent by threadline)" in message
    # The message it was streaming is ended as failed, keeping the partial text.
    (failed,) = turns_of(events)
    assert (failed.stop_reason, failed.text) == ("error", "partial")
    assert_gone(pid_of(pidfile))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (ev("message_end"), "Object missing required field `message`"),
        (ev("message_ended", message=assistant()), "message_ended"),
        (["a", "list"], "Expected `object`"),
        (ev("message_end", message=result("nope")), "answers no open call"),
        (ev("message_end", message={"role": "user", "content": [text("not the input")]}),
         "a user message from the agent"),
        (ev("message_update", event={"type": "text_delta", "index": 0, "delta": "x"}),
         "outside an assistant"),
        (ev("message_update", event={"type": "text_delta", "index": 0}),
         "missing required field `delta`"),
        (ev("message_update", event={"type": "text_wobble", "index": 0}), "text_wobble"),
        (ev("agent_end", error=3), "expected an error message"),
        (ev("tool_execution_start", tool_call_id="zz"), "not an open call"),
        (ev("agent_end"), None),  # fine on its own; the reference case
    ],
)
async def test_protocol_violations_are_errors_naming_line_and_cause(
    tmp_path: Path, line: Any, expected: str | None
) -> None:
    factory, pidfile = replay(tmp_path, [line, ev("agent_end")], )
    _, end = await run_loop(factory)
    if expected is None:
        assert end.error is None
    else:
        message = error_of(end)
        assert "stdout line 1" in message and expected in message, message
    assert_gone(pid_of(pidfile))


async def test_nonzero_exit_quotes_the_tail_of_stderr(tmp_path: Path) -> None:
    stderr = "".join(f"log line {i}\n" for i in range(50)) + "Traceback: it broke\n"
    factory, pidfile = replay(tmp_path, STREAM_START, stderr=stderr, exit=3)
    events, end = await run_loop(factory)
    message = error_of(end)
    assert "exited with status 3 before reporting agent_end" in message
    assert "Traceback: it broke" in message and "log line 49" in message
    assert "log line 10\n" not in message  # only the tail
    assert turns_of(events)[0].stop_reason == "error"
    assert_gone(pid_of(pidfile))

    # A run that completed but then exits non-zero still reports it.
    factory, pidfile = replay(
        tmp_path, [ev("message_end", message=assistant(text("fine"))), ev("agent_end")], exit=4
    )
    events, end = await run_loop(factory)
    assert "reported agent_end, then exited with status 4" in error_of(end)
    assert turns_of(events)[0].text == "fine"  # still reported, so still stored


async def test_premature_eof_and_reported_errors(tmp_path: Path) -> None:
    factory, pidfile = replay(tmp_path, STREAM_START)
    events, end = await run_loop(factory)
    assert "exited with status 0 before reporting agent_end" in error_of(end)
    assert "its stderr was empty" in error_of(end)
    (cut,) = turns_of(events)
    assert (cut.stop_reason, cut.text) == ("error", "partial")
    assert_gone(pid_of(pidfile))

    # A last line cut in the middle is reported as such, not as garbage.
    factory, pidfile = replay(tmp_path, ['{"type": "message_st'], exit=1)
    _, end = await run_loop(factory)
    assert "stopped in the middle of stdout line 1" in error_of(end)
    assert "exited with status 1" in error_of(end)

    # The child's own failure report becomes the error.
    factory, pidfile = replay(tmp_path, [
        ev("message_end", message=assistant(call("c1"), stop_reason="tool_use")),
        ev("agent_end", error="model quota exhausted"),
    ])
    events, end = await run_loop(factory)
    assert "reported an error: model quota exhausted" in error_of(end)
    (synth,) = [m for m in end.messages if isinstance(m, ToolResultMessage)]
    assert synth.synthesized == "interrupted" and synth.is_error


async def test_a_command_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    factory = durable.subprocess([str(tmp_path / "no-such-agent")])
    _, end = await run_loop(factory)
    assert "cannot start agent process" in error_of(end)
    with pytest.raises(SubprocessError):
        durable.subprocess([])
    with pytest.raises(SubprocessError):
        durable.subprocess("echo hi")


async def test_child_killed_externally_mid_message_names_the_signal(tmp_path: Path) -> None:
    factory, pidfile = echo(tmp_path, delay=0.05)
    store = FileStore(tmp_path / "store")
    agent = await durable.open(factory, store=store, session_id="killed")
    events: list[Any] = []
    killed = False  # kill once: a reaped child's pid may be reused
    async with asyncio.timeout(20):
        async for event in agent.run(" ".join(["word"] * 200)):
            events.append(event)
            update = event.event if isinstance(event, MessageUpdate) else None
            if isinstance(update, TextDelta) and update.delta == " word" and not killed:
                os.kill(pid_of(pidfile), signal.SIGKILL)
                killed = True
    end = check_grammar(events[1:])
    message = error_of(end)
    assert "was killed by SIGKILL before reporting agent_end" in message
    assert "sent by threadline" not in message
    (cut,) = turns_of(events)
    assert cut.stop_reason == "error" and cut.text.startswith("echo: word")
    assert_gone(pid_of(pidfile))
    stored = await FileStore(tmp_path / "store").load_entries("killed")
    assert [s.message for s in stored if isinstance(s, MessageEntry)] == list(end.messages)


# --------------------------------------------------------------------------- stopping


async def test_abort_mid_message_sends_sigterm_and_stores_the_childs_wind_down(
    tmp_path: Path,
) -> None:
    factory, pidfile = echo(tmp_path, delay=0.05)
    store = FileStore(tmp_path / "store")
    agent = await durable.open(factory, store=store, session_id="abort")
    seen: list[Any] = []
    async with asyncio.timeout(20):
        async with agent.run(" ".join(["word"] * 200)) as run:
            async for event in run:
                seen.append(event)
                if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                    break  # the consumer goes away: the durable agent aborts the loop
    assert_gone(pid_of(pidfile))
    # The echo agent handled SIGTERM itself: the aborted message is its own report
    # (the wrapper's would carry an error_message).
    messages = agent.messages()
    assert isinstance(messages[-1], AssistantMessage)
    assert messages[-1].stop_reason == "aborted" and messages[-1].error_message is None
    assert messages[-1].text.startswith("echo:")
    stored = await FileStore(tmp_path / "store").load_entries("abort")
    assert len(stored) == 2


async def test_a_child_ignoring_sigterm_gets_sigkill_after_the_grace_period(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "got-term"
    factory, pidfile = replay(tmp_path, STREAM_START, sleep=60, term_marker=marker, grace=0.5)
    abort = asyncio.Event()
    events: list[AgentEvent] = []
    async with asyncio.timeout(20):
        async for event in factory().run([], [UserMessage.of("hi")], abort=abort):
            events.append(event)
            if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                abort.set()
    end = check_grammar(events)
    assert isinstance(end.error, asyncio.CancelledError)
    assert marker.read_text() == "SIGTERM"  # it was asked first ...
    assert_gone(pid_of(pidfile))  # ... and killed when it did not go
    (cut,) = turns_of(events)
    assert (cut.stop_reason, cut.text) == ("aborted", "partial")


async def test_abort_mid_tool_answers_the_open_call_and_before_start_spawns_nothing(
    tmp_path: Path,
) -> None:
    factory, pidfile = replay(tmp_path, [
        ev("message_end", message=assistant(call("c1"), call("c2"), stop_reason="tool_use")),
        ev("tool_execution_start", tool_call_id="c1"),
    ], sleep=60)
    abort = asyncio.Event()
    events: list[AgentEvent] = []
    async with asyncio.timeout(20):
        async for event in factory().run([], [UserMessage.of("hi")], abort=abort):
            events.append(event)
            if isinstance(event, ToolExecutionStart):
                abort.set()
    end = check_grammar(events)
    assert isinstance(end.error, asyncio.CancelledError)
    results = [m for m in end.messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.synthesized) for r in results] == [("c1", "aborted"),
                                                                  ("c2", "aborted")]
    assert_gone(pid_of(pidfile))

    pidfile.unlink()
    abort = asyncio.Event()
    abort.set()
    _, end = await run_loop(factory, abort=abort)
    assert isinstance(end.error, asyncio.CancelledError)
    assert not pidfile.exists()


async def test_cancelling_the_consuming_task_stops_the_child_and_keeps_the_tail(
    tmp_path: Path,
) -> None:
    factory, pidfile = echo(tmp_path, delay=0.05)
    store = FileStore(tmp_path / "store")
    agent = await durable.open(factory, store=store, session_id="cancelled")
    streaming = asyncio.Event()

    async def consume() -> None:
        async for event in agent.run(" ".join(["word"] * 200)):
            if isinstance(event, MessageUpdate) and isinstance(event.event, TextDelta):
                streaming.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(20):
        await streaming.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert_gone(pid_of(pidfile))
    reopened = await durable.open(None, store=FileStore(tmp_path / "store"),
                                  session_id="cancelled")
    last = reopened.path()[-1]
    assert isinstance(last, MessageEntry) and isinstance(last.message, AssistantMessage)
    assert last.message.stop_reason == "aborted" and last.message.text.startswith("echo:")
    assert_valid_for_providers(reopened.messages())


async def test_closing_the_loop_iterator_leaves_no_process(tmp_path: Path) -> None:
    factory, pidfile = replay(tmp_path, STREAM_START, sleep=60, term_marker=tmp_path / "t",
                              grace=0.1)
    events = factory().run([], [UserMessage.of("hi")])
    async with asyncio.timeout(20):
        async for event in events:
            if isinstance(event, MessageUpdate):
                break
        await events.aclose()
    assert_gone(pid_of(pidfile))


async def test_direct_task_cancellation_of_the_loop_leaves_no_process(tmp_path: Path) -> None:
    factory, pidfile = echo(tmp_path, delay=0.05)
    loop = factory()
    assert isinstance(loop, SubprocessLoop)
    started = asyncio.Event()

    async def consume() -> None:
        async for event in loop.run([], [UserMessage.of(" ".join(["w"] * 200))]):
            if isinstance(event, MessageUpdate):
                started.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(20):
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert_gone(pid_of(pidfile))


# --------------------------------------------------------------------------- crashes (S12)


async def test_s12_kill_9_of_the_child_mid_tool_leaves_an_interrupted_result(
    tmp_path: Path,
) -> None:
    factory, pidfile = echo(tmp_path)
    agent = await durable.open(factory, store=FileStore(tmp_path / "store"), session_id="t")
    events: list[Any] = []
    killed = False
    async with asyncio.timeout(20):
        async for event in agent.run("sleep 30"):
            events.append(event)
            if isinstance(event, ToolExecutionUpdate) and not killed:
                os.kill(pid_of(pidfile), signal.SIGKILL)
                killed = True
    end = check_grammar(events[1:])
    assert "killed by SIGKILL" in error_of(end)
    assert_gone(pid_of(pidfile))

    reopened = await durable.open(factory, store=FileStore(tmp_path / "store"), session_id="t")
    assert reopened.repaired == ()  # the run itself answered the call
    messages = reopened.messages()
    assert_valid_for_providers(messages)
    interrupted = messages[-1]
    assert isinstance(interrupted, ToolResultMessage)
    assert (interrupted.tool_call_id, interrupted.synthesized) == ("call-1", "interrupted")


HOST = r"""
import asyncio, sys
from threadline import durable
from threadline.stores import FileStore

async def main():
    factory = durable.subprocess([sys.executable, sys.argv[2]], grace=0.2)
    agent = await durable.open(factory, store=FileStore(sys.argv[1]), session_id="host")
    async for event in agent.run("sleep 30"):
        if event.type == "tool_execution_update":
            print("tool running", flush=True)

asyncio.run(main())
"""


async def test_s12_reopen_after_kill_9_of_the_host_mid_tool_repairs_the_call(
    tmp_path: Path,
) -> None:
    """The durable agent's own process dies while the child runs a tool."""
    host = tmp_path / "host.py"
    host.write_text(HOST)
    pidfile = tmp_path / "echo.pid"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(host), str(tmp_path / "store"), str(ECHO_AGENT),
        stdout=asyncio.subprocess.PIPE, env=env_with(ECHO_AGENT_PIDFILE=str(pidfile)),
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            assert await proc.stdout.readline() == b"tool running\n"
    finally:
        proc.kill()  # SIGKILL: the host gets no chance to clean up
        await proc.wait()
    # The orphaned agent dies of SIGPIPE at its next progress write.
    child = str(pid_of(pidfile))
    deadline = time.monotonic() + 10
    while (state := _stat(child)) is not None and state[0] != "Z":
        assert time.monotonic() < deadline, f"orphaned agent {child} still runs: {state}"
        await asyncio.sleep(0.02)

    reopened = await durable.open(None, store=FileStore(tmp_path / "store"), session_id="host")
    (repaired,) = reopened.repaired
    assert isinstance(repaired, MessageEntry)
    assert isinstance(repaired.message, ToolResultMessage)
    assert (repaired.message.tool_call_id, repaired.message.synthesized) == (
        "call-1", "interrupted")
    assert_valid_for_providers(reopened.messages())


async def test_a_final_stream_event_inside_message_update_is_a_protocol_error(
    tmp_path: Path,
) -> None:
    done = ev("message_update", event={"type": "done", "message": assistant(text("x"))})
    factory, _ = replay(tmp_path, [*STREAM_START, done, ev("agent_end")])
    _, end = await run_loop(factory)
    assert "carries a 'done' event; a message ends with message_end" in error_of(end)


async def test_the_wire_speaks_the_agent_event_types_in_both_directions() -> None:
    # One schema: every event AgentLoop yields, encoded as JSON, decodes on the
    # subprocess wire to an equal event (the error of AgentEnd travels as text).
    from threadline.agent import AgentLoop
    from threadline.agent._subprocess._wire import decode_event
    from threadline.testing import Call, ScriptedModel, Text, Turn

    def ls(path: str) -> str:
        """List a folder."""
        return f"listing of {path}"

    model = ScriptedModel([Turn(Call("ls", {"path": "."}, id="c1")), Turn(Text("done"))])
    events = [e async for e in AgentLoop(model, [ls]).run([], [UserMessage.of("go")])]
    for event in events:
        line = msgspec.json.encode(event, enc_hook=str)
        assert decode_event(line) == event, line
