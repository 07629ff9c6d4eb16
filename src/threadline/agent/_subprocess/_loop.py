"""A factory that drives an external agent CLI over JSON lines (S3).

For each run the command is started in its own process group; threadline
writes one JSON line to its stdin with the context and the new input, closes
stdin, and reads newline-delimited JSON events from its stdout. The durable
agent stores each ``message_end`` before forwarding it, exactly as for the
built-in loop. The wire protocol is documented in ``docs/subprocess-protocol.md``.

Design choices (the protocol document explains them to CLI authors):

- The child reports only what it produces (assistant and tool-result
  messages). The input messages are reported by this wrapper, as
  ``AgentLoop`` does; a child that echoes them anyway is tolerated.
- Turns belong to the wrapper: a turn opens with each assistant message and
  closes once all of its tool calls are answered. The child's own
  ``turn_start``/``turn_end`` are accepted and ignored, so the order grammar
  of ``threadline.agent._events`` holds whatever the child does.
- Tool results are held until every call of the turn is answered and then
  reported in call order, as ``AgentLoop`` does; that keeps all
  ``tool_execution_*`` events before the result messages.
- Nothing the child does raises out of the loop. Abort, a crash, a non-zero
  exit, a malformed line or a broken protocol all wind the run down the same
  way: the streaming message is ended (``aborted`` or ``error``), every open
  tool call gets a synthesized result (``aborted`` after an abort,
  ``interrupted`` when the child failed, since it may have acted), and
  ``AgentEnd.error`` carries a ``CancelledError`` or a ``SubprocessError``
  quoting the child's stderr tail. The durable agent stores that tail, so the
  session stays valid for every provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from threadline.agent._events import (
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
from threadline.ai._messages import (
    AssistantContent,
    AssistantMessage,
    Message,
    Synthesized,
    TextPart,
    ThinkingPart,
    ToolResultMessage,
    UserMessage,
    synthesized_result,
)
from threadline.ai._model import (
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
DEFAULT_LINE_LIMIT = 64 * 1024 * 1024
_STDERR_LINES = 20  # lines of the child's stderr quoted in errors
_STDERR_KEEP = 8 * 1024  # bytes of stderr kept while the child runs
_CHUNK = 1024 * 1024  # bytes read from the child's stdout at a time



# ----------------------------------------------------------------------------- wire


class _RunRequest(msgspec.Struct, tag_field="type", tag="run"):
    version: int
    context: Sequence[Message]
    input: Sequence[Message]


class _Ev(msgspec.Struct, tag_field="type"):
    pass


class _MessageStart(_Ev, tag="message_start"):
    message: Message


class _MessageUpdate(_Ev, tag="message_update"):
    event: dict[str, Any]


class _MessageEnd(_Ev, tag="message_end"):
    message: Message


class _TurnStart(_Ev, tag="turn_start"):
    pass


class _TurnEnd(_Ev, tag="turn_end"):
    pass


class _ToolStart(_Ev, tag="tool_execution_start"):
    tool_call_id: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class _ToolUpdate(_Ev, tag="tool_execution_update"):
    tool_call_id: str
    update: Any = None


class _ToolEnd(_Ev, tag="tool_execution_end"):
    tool_call_id: str
    result: ToolResultMessage | None = None


class _AgentEnd(_Ev, tag="agent_end"):
    error: str | None = None


_ChildEvent = (
    _MessageStart | _MessageUpdate | _MessageEnd | _TurnStart | _TurnEnd | _ToolStart
    | _ToolUpdate | _ToolEnd | _AgentEnd
)
_decoder = msgspec.json.Decoder(_ChildEvent)
_encoder = msgspec.json.Encoder()

_STREAM_TYPES: dict[str, type[Any]] = {
    "start": StartEvent, "text_start": TextStart, "text_delta": TextDelta,
    "text_end": TextEnd, "thinking_start": ThinkingStart, "thinking_delta": ThinkingDelta,
    "thinking_end": ThinkingEnd, "toolcall_start": ToolCallStart,
    "toolcall_delta": ToolCallDelta, "toolcall_end": ToolCallEnd,
}


# ----------------------------------------------------------------------------- factory


def subprocess(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace: float = 5.0,
    line_limit: int = DEFAULT_LINE_LIMIT,
) -> SubprocessFactory:
    """A factory whose loop runs ``argv`` once per run and speaks JSON lines.

    ``env`` replaces the environment, as with ``subprocess.Popen`` (pass
    ``{**os.environ, ...}`` to extend it). ``grace`` is how long the child may
    take to exit after SIGTERM before it gets SIGKILL, and how long it may
    linger after ``agent_end``. ``line_limit`` bounds one stdout line in bytes.
    """
    return SubprocessFactory(argv, env=env, cwd=cwd, grace=grace, line_limit=line_limit)


class SubprocessFactory:
    """Builds a ``SubprocessLoop`` per run (see ``subprocess``)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        grace: float = 5.0,
        line_limit: int = DEFAULT_LINE_LIMIT,
    ) -> None:
        if isinstance(argv, str) or not argv:
            raise SubprocessError(
                f"the subprocess factory needs a command as a list of arguments, got {argv!r}"
            )
        if grace < 0 or line_limit < 1:
            raise SubprocessError(
                f"grace must be >= 0 and line_limit >= 1, got {grace!r} and {line_limit!r}"
            )
        self.argv = [str(a) for a in argv]
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.grace = grace
        self.line_limit = line_limit

    def __call__(self) -> Loop:
        return SubprocessLoop(self.argv, env=self.env, cwd=self.cwd, grace=self.grace,
                              line_limit=self.line_limit)

    def __repr__(self) -> str:
        return f"durable.subprocess({self.argv!r})"


class SubprocessLoop:
    """One run of an external agent process; a ``Loop`` (see the module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        grace: float = 5.0,
        line_limit: int = DEFAULT_LINE_LIMIT,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.grace = grace
        self.line_limit = line_limit

    def run(
        self,
        context: Sequence[Message],
        input: Sequence[Message],
        *,
        abort: asyncio.Event | None = None,
    ) -> AsyncIterator[AgentEvent]:
        return self._run(context, input, abort if abort is not None else asyncio.Event())

    def __repr__(self) -> str:
        return f"SubprocessLoop({self.argv!r})"

    async def _run(
        self, context: Sequence[Message], input: Sequence[Message], abort: asyncio.Event
    ) -> AsyncIterator[AgentEvent]:
        turns = _Turns(input)
        yield AgentStart()
        for m in input:
            yield MessageStart(message=m)
            yield MessageEnd(message=m)
        if abort.is_set():
            yield AgentEnd(messages=turns.messages(), error=asyncio.CancelledError("run aborted"))
            return
        request = _encoder.encode(
            _RunRequest(version=PROTOCOL_VERSION, context=list(context), input=list(input))
        ) + b"\n"
        try:
            child = await _Child.start(self, request)
        except OSError as exc:
            failed = SubprocessError(f"cannot start agent process {self.argv[0]!r}: {exc}")
            failed.__cause__ = exc
            yield AgentEnd(messages=turns.messages(), error=failed)
            return

        try:
            aborted = False
            problem: str | None = None  # what the child did wrong, when it did
            alive = False  # whether it may still be running after the problem
            lineno = 0
            while not turns.finished:
                line = await child.next_line(watch_abort=not aborted, abort=abort)
                if line is _ABORTED:
                    aborted = True
                    child.begin_stop()
                    continue  # keep reading: the child may report its own wind-down
                if line is _TIMED_OUT:
                    problem, alive = "kept its stdout open after exiting", True
                    break
                lineno += 1
                if line is _TOO_LONG:
                    problem = f"wrote stdout line {lineno} longer than {self.line_limit} bytes"
                    alive = True
                    break
                assert isinstance(line, bytes)
                if not line:
                    break
                if not line.endswith(b"\n"):
                    problem = f"stopped in the middle of stdout line {lineno}: {_quote(line)}"
                    break
                if not line.strip():
                    continue
                try:
                    events = turns.feed(_decoder.decode(line))
                except (msgspec.DecodeError, _ProtocolError) as exc:
                    problem = f"broke the protocol on stdout line {lineno} ({exc}): {_quote(line)}"
                    alive = True
                    break
                for event in events:
                    yield event

            if alive and not aborted:
                await child.stop()
            else:
                await child.finish()
            tail = await child.stderr_tail()
            error: BaseException | None = None
            if aborted:
                error = asyncio.CancelledError("run aborted")
            elif problem is not None:
                error = child.error(f"{problem}; it {child.exit_status()}", tail)
            elif not turns.finished:
                error = child.error(f"{child.exit_status()} before reporting agent_end", tail)
            elif turns.child_error is not None:
                error = child.error(f"reported an error: {turns.child_error}", tail)
            elif child.failed():
                error = child.error(f"reported agent_end, then {child.exit_status()}", tail)
            for event in turns.close("aborted" if aborted else "interrupted", error):
                yield event
            yield AgentEnd(messages=turns.messages(), error=error)
        finally:
            await child.cleanup()


# ----------------------------------------------------------------------------- the process


_ABORTED = object()  # what next_line returns when the abort event fired
_TIMED_OUT = object()  # ... when stdout stayed open after the child exited
_TOO_LONG = object()  # ... when a line exceeds line_limit


class _Child:
    """One child process: its pipes, its stderr tail, stopping and reaping it."""

    def __init__(self, loop: SubprocessLoop, proc: asyncio.subprocess.Process,
                 request: bytes) -> None:
        self.loop = loop
        self.proc = proc
        self.grace = loop.grace
        self.sent: list[signal.Signals] = []  # signals threadline sent to the child
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdout = proc.stdout
        self._buf = bytearray()
        self._pos = 0  # start of the next line in _buf
        self._scanned = 0  # _buf holds no newline before this
        self._eof = False
        self._stderr = bytearray()
        self._stopper: asyncio.Task[None] | None = None
        self._abort_wait: asyncio.Task[Any] | None = None
        self._exited = asyncio.create_task(self._reap())
        self._writer = asyncio.create_task(_write(proc.stdin, request))
        self._reader = asyncio.create_task(_drain(proc.stderr, self._stderr))

    @classmethod
    async def start(cls, loop: SubprocessLoop, request: bytes) -> _Child:
        proc = await asyncio.create_subprocess_exec(
            *loop.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=loop.env, cwd=loop.cwd,
            limit=_CHUNK, start_new_session=True,
        )
        return cls(loop, proc, request)

    async def _reap(self) -> None:
        # Not proc.wait(): that also waits for the pipes to close, which never
        # happens while something the child started still holds them. The
        # child watcher sets returncode as soon as it has reaped the child.
        delay = 0.001
        while self.proc.returncode is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        # Whatever the child left running in its group would hold our pipes open.
        _signal_group(self.proc.pid, signal.SIGKILL)

    async def next_line(self, *, watch_abort: bool, abort: asyncio.Event) -> object:
        """The next stdout line (``b""`` at EOF) or one of the markers above."""
        # Our own buffer, filled a chunk at a time: waiting for the pipe once
        # per line would cost an event-loop round trip per streamed token.
        buf = self._buf
        while True:
            if watch_abort and abort.is_set():
                return _ABORTED
            end = buf.find(b"\n", max(self._pos, self._scanned))
            if end >= 0:
                if end - self._pos > self.loop.line_limit:
                    return _TOO_LONG
                line = bytes(buf[self._pos : end + 1])
                self._pos = self._scanned = end + 1
                return line
            del buf[: self._pos]
            self._pos, self._scanned = 0, len(buf)
            if len(buf) > self.loop.line_limit:
                return _TOO_LONG
            if self._eof:
                line = bytes(buf)  # b"" or a last line cut short
                buf.clear()
                self._scanned = 0
                return line
            chunk = await self._read_chunk(watch_abort, abort)
            if not isinstance(chunk, bytes):
                return chunk
            if chunk:
                buf += chunk
            else:
                self._eof = True

    async def _read_chunk(self, watch_abort: bool, abort: asyncio.Event) -> object:
        read = asyncio.ensure_future(self.stdout.read(_CHUNK))
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {read}
                if watch_abort:
                    if self._abort_wait is None:
                        self._abort_wait = asyncio.ensure_future(abort.wait())
                    waiting.add(self._abort_wait)
                exited = self._exited.done()
                if not exited:
                    waiting.add(self._exited)
                # Once the child is gone its output is already in the pipe; only a
                # process that escaped its group could keep us waiting for EOF.
                done, _ = await asyncio.wait(
                    waiting, timeout=self.grace if exited else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if read in done:
                    return read.result()
                if watch_abort and abort.is_set():
                    return _ABORTED
                if exited and not done:
                    return _TIMED_OUT
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await read

    def begin_stop(self) -> None:
        if self._stopper is None:
            self._stopper = asyncio.create_task(self._terminate())

    async def stop(self) -> None:
        """SIGTERM the child's group, SIGKILL it after the grace period; return once reaped."""
        self.begin_stop()
        assert self._stopper is not None
        await asyncio.shield(self._stopper)

    async def _terminate(self) -> None:
        if self._exited.done():
            return
        self._send(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), self.grace)
        except TimeoutError:
            self._send(signal.SIGKILL)
            await self._exited

    def _send(self, sig: signal.Signals) -> None:
        self.sent.append(sig)
        _signal_group(self.proc.pid, sig)

    async def finish(self) -> None:
        """Give the child the grace period to exit by itself, then stop it."""
        if self._stopper is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), self.grace)
        await self.stop()

    async def stderr_tail(self) -> str:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), self.grace)
        lines = self._stderr.decode("utf-8", "replace").splitlines()[-_STDERR_LINES:]
        return "\n".join(f"  {line[:500]}" for line in lines)

    def failed(self) -> bool:
        code = self.proc.returncode
        return code is not None and code != 0 and not self.sent

    def exit_status(self) -> str:
        code = self.proc.returncode
        if code is None:
            return "is still running"
        if code >= 0:
            return f"exited with status {code}"
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"was killed by signal {-code}"
        by = ""
        if sig in self.sent:
            by = " (sent by threadline" + (
                " after the grace period)" if sig == signal.SIGKILL else ")")
        return f"was killed by {sig.name}{by}"

    def error(self, what: str, tail: str) -> SubprocessError:
        where = f"agent process {self.loop.argv[0]!r} (pid {self.proc.pid})"
        quoted = f"\nlast lines of its stderr:\n{tail}" if tail else " (its stderr was empty)"
        return SubprocessError(f"{where} {what}{quoted}")

    async def cleanup(self) -> None:
        """Leave nothing running, even when the run is closed or cancelled mid-way."""
        try:
            await self.stop()
        except asyncio.CancelledError:
            # Cancelled again while waiting out the grace period: no more waiting.
            self._send(signal.SIGKILL)
            raise
        finally:
            for task in (self._writer, self._reader, self._abort_wait):
                if task is not None and not task.done():
                    task.cancel()
            pending = [t for t in (self._writer, self._reader, self._abort_wait) if t is not None]
            await asyncio.wait(pending)


async def _write(stdin: asyncio.StreamWriter, request: bytes) -> None:
    # A separate task, so a child that writes before reading cannot deadlock
    # us; a child that closes stdin early (or never reads it) is its business.
    with contextlib.suppress(ConnectionError):
        stdin.write(request)
        await stdin.drain()
    stdin.close()
    with contextlib.suppress(ConnectionError):
        await stdin.wait_closed()


async def _drain(stream: asyncio.StreamReader, keep: bytearray) -> None:
    # Chunks, not lines: a huge stderr line must neither stall the child nor us.
    while chunk := await stream.read(64 * 1024):
        keep += chunk
        if len(keep) > 2 * _STDERR_KEEP:
            del keep[:-_STDERR_KEEP]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _quote(line: bytes) -> str:
    text = repr(line[:200])
    return text + f" ... ({len(line)} bytes)" if len(line) > 200 else text


# ----------------------------------------------------------------------------- turns


class _ProtocolError(Exception):
    pass


class _Turns:
    """Turns the child's events into agent events that keep the run grammar.

    Pure: child events in, agent events out; raises ``_ProtocolError`` for an
    event that does not fit. ``close`` winds down whatever is still open.
    """

    def __init__(self, input: Sequence[Message]) -> None:
        self._produced: list[Message] = list(input)
        self._echoes = [m for m in input if isinstance(m, UserMessage)]
        self.turn = 0
        self.finished = False
        self.child_error: str | None = None
        self._streaming: AssistantMessage | None = None
        self._partial: dict[int, _Partial] = {}
        self._assistant: AssistantMessage | None = None  # ended, its turn still open
        self._pending: dict[str, str] = {}  # call id -> tool name, not answered yet
        self._results: dict[str, ToolResultMessage] = {}
        self._running: dict[str, str] = {}  # executions started and not ended
        self._started: set[str] = set()

    def messages(self) -> tuple[Message, ...]:
        return tuple(self._produced)

    def feed(self, ev: _Ev) -> list[AgentEvent]:
        if isinstance(ev, _MessageStart | _MessageEnd):
            return self._message(ev)
        if isinstance(ev, _MessageUpdate):
            if self._streaming is None:
                raise _ProtocolError("message_update outside an assistant message")
            event = _stream_event(ev.event)
            self._track(event)
            return [MessageUpdate(event=event)]
        if isinstance(ev, _ToolStart):
            if ev.tool_call_id not in self._pending or ev.tool_call_id in self._started:
                raise _ProtocolError(f"tool_execution_start for call {ev.tool_call_id!r}, "
                                     "which is not an open call of the current turn")
            name = self._pending[ev.tool_call_id]
            self._running[ev.tool_call_id] = name
            self._started.add(ev.tool_call_id)
            return [ToolExecutionStart(tool_call_id=ev.tool_call_id, tool_name=name,
                                       arguments=ev.arguments)]
        if isinstance(ev, _ToolUpdate | _ToolEnd):
            tool = self._running.get(ev.tool_call_id)
            if tool is None:
                raise _ProtocolError(f"{ev.__struct_config__.tag} for call "
                                     f"{ev.tool_call_id!r}, whose execution is not running")
            if isinstance(ev, _ToolUpdate):
                return [ToolExecutionUpdate(tool_call_id=ev.tool_call_id, tool_name=tool,
                                            update=ev.update)]
            if ev.result is None:
                return []  # ended when its result message arrives
            del self._running[ev.tool_call_id]
            return [ToolExecutionEnd(tool_call_id=ev.tool_call_id, tool_name=tool,
                                     result=ev.result)]
        if isinstance(ev, _AgentEnd):
            if ev.error is None and (self._streaming is not None or self._pending):
                open_calls = sorted(self._pending)
                raise _ProtocolError("agent_end while " + (
                    "an assistant message is streaming" if self._streaming is not None
                    else f"tool calls {open_calls} have no result"))
            self.finished = True
            self.child_error = ev.error
            return []
        return []  # turn_start / turn_end: turns are derived from the messages

    def _message(self, ev: _MessageStart | _MessageEnd) -> list[AgentEvent]:
        m = ev.message
        if isinstance(m, UserMessage):
            if self.turn == 0 and m in self._echoes:
                if isinstance(ev, _MessageEnd):
                    self._echoes.remove(m)
                return []  # an echo of the input, which the wrapper already reported
            raise _ProtocolError("a user message from the agent; it reports only assistant "
                                 "and tool_result messages")
        if isinstance(m, ToolResultMessage):
            if isinstance(ev, _MessageStart):
                return []  # reported with its end, in call order
            if m.tool_call_id not in self._pending:
                raise _ProtocolError(f"tool result for call {m.tool_call_id!r} answers no "
                                     "open call of the current turn")
            del self._pending[m.tool_call_id]
            self._results[m.tool_call_id] = m
            return [] if self._pending else self._flush()
        out: list[AgentEvent] = []
        if isinstance(ev, _MessageStart) or self._streaming is None:
            if self._streaming is not None:
                raise _ProtocolError("message_start while another assistant message streams")
            if self._pending:
                raise _ProtocolError(f"a new assistant message while tool calls "
                                     f"{sorted(self._pending)} have no result")
            self.turn += 1
            self._streaming = AssistantMessage(model=m.model, provider=m.provider, api=m.api)
            self._partial = {}
            out += [TurnStart(turn=self.turn), MessageStart(message=self._streaming)]
        if isinstance(ev, _MessageEnd):
            out += self._end_assistant(m)
        return out

    def _end_assistant(self, m: AssistantMessage) -> list[AgentEvent]:
        self._streaming = None
        self._assistant = m
        self._produced.append(m)
        self._pending = {c.id: c.name for c in m.tool_calls}
        out: list[AgentEvent] = [MessageEnd(message=m)]
        if not self._pending:
            out += self._flush()
        return out

    def _flush(self) -> list[AgentEvent]:
        """All calls answered: end executions, report results in call order, end the turn."""
        assert self._assistant is not None
        out: list[AgentEvent] = [
            ToolExecutionEnd(tool_call_id=i, tool_name=name, result=self._results[i])
            for i, name in self._running.items()
        ]
        call_ids = dict.fromkeys(c.id for c in self._assistant.tool_calls)
        results = [self._results[i] for i in call_ids]
        for r in results:
            self._produced.append(r)
            out += [MessageStart(message=r), MessageEnd(message=r)]
        out.append(TurnEnd(turn=self.turn, message=self._assistant, tool_results=tuple(results)))
        self._assistant = None
        self._running, self._results, self._started = {}, {}, set()
        return out

    def close(self, kind: Synthesized, error: BaseException | None) -> list[AgentEvent]:
        """End what the child left open: the streaming message, then unanswered calls."""
        out: list[AgentEvent] = []
        if self._streaming is not None:
            reason: Literal["aborted", "error"] = "aborted" if kind == "aborted" else "error"
            content = tuple(self._partial[i].part() for i in sorted(self._partial))
            out += self._end_assistant(msgspec.structs.replace(
                self._streaming, content=content, stop_reason=reason,
                error_message=str(error) if error is not None else None,
            ))
        if self._assistant is not None:
            for call_id, name in self._pending.items():
                self._results[call_id] = synthesized_result(call_id, name, kind)
            self._pending = {}
            out += self._flush()
        return out

    def _track(self, event: StreamEvent) -> None:
        # Kept so that a message cut short still stores what was streamed.
        p = self._partial
        if isinstance(event, TextStart | ThinkingStart):
            p[event.index] = _Partial(isinstance(event, ThinkingStart))
        elif isinstance(event, TextDelta | ThinkingDelta):
            p.setdefault(event.index, _Partial(isinstance(event, ThinkingDelta))).chunks.append(
                event.delta)
        elif isinstance(event, TextEnd):
            p[event.index] = _Partial(False, [event.text])
        elif isinstance(event, ThinkingEnd):
            p[event.index] = _Partial(True, [event.thinking], event.signature)


@dataclass(slots=True)
class _Partial:
    thinking: bool
    chunks: list[str] = field(default_factory=list)
    signature: str | None = None

    def part(self) -> AssistantContent:
        text = "".join(self.chunks)
        if self.thinking:
            return ThinkingPart(thinking=text, signature=self.signature)
        return TextPart(text=text)


def _stream_event(obj: dict[str, Any]) -> StreamEvent:
    kind = obj.get("type")
    cls = _STREAM_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise _ProtocolError(f"message_update carries an unknown stream event type {kind!r}")
    try:
        return msgspec.convert(obj, cls)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise _ProtocolError(f"message_update event {kind!r} is malformed: {exc}") from exc
