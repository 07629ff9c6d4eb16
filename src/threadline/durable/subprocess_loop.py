"""A factory that drives an external agent CLI over JSON lines (S3).

For each run the command is started; threadline writes one JSON line to its
stdin with the context and the new input, and reads newline-delimited JSON
events from its stdout. The durable agent stores each ``message_end`` before
forwarding it, exactly as for the built-in loop. The protocol is documented
in ``docs/subprocess-protocol.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec

from threadline.agent.events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    Loop,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.ai.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolResultMessage,
)
from threadline.ai.model import (
    StartEvent,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from threadline.errors import SubprocessError

__all__ = ["PROTOCOL_VERSION", "SubprocessLoop", "subprocess"]

PROTOCOL_VERSION = 1
_STDERR_TAIL = 40  # lines of the child's stderr quoted in errors
_LINE_LIMIT = 64 * 1024 * 1024


class _RunRequest(msgspec.Struct, tag_field="type", tag="run"):
    version: int
    context: Sequence[Message]
    input: Sequence[Message]


class _Abort(msgspec.Struct, tag_field="type", tag="abort"):
    pass


class _Ev(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class _MessageStart(_Ev, tag="message_start"):
    message: Message


class _MessageEnd(_Ev, tag="message_end"):
    message: Message


class _MessageUpdate(_Ev, tag="message_update"):
    event: Any = None


class _TurnStart(_Ev, tag="turn_start"):
    turn: int = 0


class _TurnEnd(_Ev, tag="turn_end"):
    turn: int = 0


class _ToolStart(_Ev, tag="tool_execution_start"):
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class _ToolUpdate(_Ev, tag="tool_execution_update"):
    tool_call_id: str
    tool_name: str
    update: Any = None


class _ToolEnd(_Ev, tag="tool_execution_end"):
    tool_call_id: str
    tool_name: str
    result: ToolResultMessage


class _AgentEnd(_Ev, tag="agent_end"):
    error: str | None = None


_ChildEvent = (
    _MessageStart | _MessageEnd | _MessageUpdate | _TurnStart | _TurnEnd | _ToolStart
    | _ToolUpdate | _ToolEnd | _AgentEnd
)
_decoder = msgspec.json.Decoder(_ChildEvent)
_encoder = msgspec.json.Encoder()


def subprocess(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace: float = 5.0,
) -> _SubprocessFactory:
    """A factory whose loop runs ``argv`` once per run and speaks JSON lines."""
    if not argv:
        raise SubprocessError("subprocess factory needs a command, got an empty argv")
    return _SubprocessFactory(list(argv), env=env, cwd=cwd, grace=grace)


class _SubprocessFactory:
    def __init__(
        self, argv: list[str], *, env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None, grace: float,
    ) -> None:
        self.argv = argv
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.grace = grace

    def __call__(self) -> Loop:
        return SubprocessLoop(self.argv, env=self.env, cwd=self.cwd, grace=self.grace)


class SubprocessLoop:
    """One run of an external agent process (see the module docstring)."""

    def __init__(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None, grace: float = 5.0,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.grace = grace

    def run(
        self,
        context: Sequence[Message],
        input: Sequence[Message],
        *,
        abort: asyncio.Event | None = None,
    ) -> AsyncIterator[AgentEvent]:
        return self._run(context, input, abort or asyncio.Event())

    def __repr__(self) -> str:
        return f"SubprocessLoop({self.argv!r})"

    async def _run(
        self, context: Sequence[Message], input: Sequence[Message], abort: asyncio.Event
    ) -> AsyncIterator[AgentEvent]:
        produced: list[Message] = []
        yield AgentStart()
        for m in input:
            produced.append(m)
            yield MessageStart(message=m)
            yield MessageEnd(message=m)

        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env, cwd=self.cwd,
                limit=_LINE_LIMIT, start_new_session=True,
            )
        except OSError as exc:
            raise SubprocessError(f"cannot start {self.argv[0]!r}: {exc}") from exc

        stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        stderr_task = asyncio.create_task(_collect(proc.stderr, stderr_tail))
        open_calls: dict[str, str] = {}
        last_assistant = AssistantMessage()
        turn_results: list[ToolResultMessage] = []
        finished = False
        error: BaseException | None = None
        try:
            assert proc.stdin is not None and proc.stdout is not None
            request = _RunRequest(version=PROTOCOL_VERSION, context=list(context),
                                  input=list(input))
            proc.stdin.write(_encoder.encode(request) + b"\n")
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            lineno = 0
            while True:
                line = await _read_or_abort(proc.stdout, abort)
                if line is None:  # aborted
                    await self._stop(proc)
                    error = asyncio.CancelledError("aborted")
                    break
                if not line:
                    break
                lineno += 1
                if not line.strip():
                    continue
                try:
                    ev = _decoder.decode(line)
                except msgspec.DecodeError as exc:
                    await self._stop(proc)
                    raise SubprocessError(
                        f"{self.argv[0]}: stdout line {lineno} is not a protocol event "
                        f"({exc}): {line[:200]!r}{_tail(stderr_tail)}"
                    ) from exc
                if isinstance(ev, _AgentEnd):
                    finished = True
                    if ev.error:
                        error = SubprocessError(f"{self.argv[0]}: {ev.error}")
                    continue
                if isinstance(ev, _TurnEnd):
                    yield TurnEnd(turn=ev.turn, message=last_assistant,
                                  tool_results=tuple(turn_results))
                    turn_results = []
                    continue
                event = _convert(ev)
                if isinstance(event, MessageEnd):
                    produced.append(event.message)
                    if isinstance(event.message, AssistantMessage):
                        last_assistant = event.message
                        for call in event.message.tool_calls:
                            open_calls[call.id] = call.name
                    elif isinstance(event.message, ToolResultMessage):
                        turn_results.append(event.message)
                        open_calls.pop(event.message.tool_call_id, None)
                yield event
            if error is None:
                code = await proc.wait()
                await stderr_task
                if code != 0:
                    raise SubprocessError(
                        f"{self.argv[0]} exited with status {code}{_tail(stderr_tail)}"
                    )
                if not finished:
                    raise SubprocessError(
                        f"{self.argv[0]} ended its output without an agent_end event"
                        f"{_tail(stderr_tail)}"
                    )
        finally:
            if proc.returncode is None:
                await self._stop(proc)
            stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr_task

        # Only an abort lands here with calls still open: answer them.
        for call_id, name in open_calls.items():
            result = ToolResultMessage(
                tool_call_id=call_id, tool_name=name, is_error=True, synthesized="aborted",
                content=(TextPart(text="The run was aborted before this tool returned."),),
            )
            produced.append(result)
            yield MessageStart(message=result)
            yield MessageEnd(message=result)
        yield AgentEnd(messages=tuple(produced), error=error)

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM the child's process group, SIGKILL after the grace period, reap it."""
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _read_or_abort(stream: asyncio.StreamReader, abort: asyncio.Event) -> bytes | None:
    if abort.is_set():
        return None
    read = asyncio.ensure_future(stream.readline())
    stop = asyncio.ensure_future(abort.wait())
    try:
        done, _ = await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if read in done:
        return read.result()
    read.cancel()
    return None


async def _collect(stream: asyncio.StreamReader | None, tail: deque[str]) -> None:
    if stream is None:
        return
    async for raw in stream:
        tail.append(raw.decode("utf-8", "replace").rstrip("\n"))


def _tail(lines: deque[str]) -> str:
    if not lines:
        return ""
    return "\nlast lines of its stderr:\n  " + "\n  ".join(lines)


def _convert(ev: Any) -> AgentEvent:
    if isinstance(ev, _MessageStart):
        return MessageStart(message=ev.message)
    if isinstance(ev, _MessageEnd):
        return MessageEnd(message=ev.message)
    if isinstance(ev, _TurnStart):
        return TurnStart(turn=ev.turn)
    if isinstance(ev, _ToolStart):
        return ToolExecutionStart(tool_call_id=ev.tool_call_id, tool_name=ev.tool_name,
                                  arguments=ev.arguments)
    if isinstance(ev, _ToolUpdate):
        return ToolExecutionUpdate(tool_call_id=ev.tool_call_id, tool_name=ev.tool_name,
                                   update=ev.update)
    if isinstance(ev, _ToolEnd):
        return ToolExecutionEnd(tool_call_id=ev.tool_call_id, tool_name=ev.tool_name,
                                result=ev.result)
    assert isinstance(ev, _MessageUpdate)
    return MessageUpdate(event=_stream_event(ev.event))


_STREAM_TYPES: dict[str, type[Any]] = {
    "start": StartEvent, "text_start": TextStart, "text_delta": TextDelta,
    "text_end": TextEnd, "thinking_start": ThinkingStart, "thinking_delta": ThinkingDelta,
    "thinking_end": ThinkingEnd, "toolcall_start": ToolCallStart,
    "toolcall_delta": ToolCallDelta, "toolcall_end": ToolCallEnd,
}


def _stream_event(obj: Any) -> StreamEvent:
    kind = obj.get("type") if isinstance(obj, dict) else None
    cls = _STREAM_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SubprocessError(f"message_update carries an unknown stream event: {obj!r:.200}")
    try:
        return msgspec.convert(obj, cls)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise SubprocessError(f"message_update event {kind!r} is malformed: {exc}") from exc
