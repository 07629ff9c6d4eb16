"""The subprocess loop: an external agent CLI as a ``Loop``.

For each run the command is started in its own process group; threadline
writes one JSON line to its stdin with the context and the new input, closes
stdin, and reads newline-delimited JSON events from its stdout. The durable
agent stores each ``message_end`` before forwarding it, exactly as for the
built-in loop. The wire protocol is documented in ``docs/subprocess-protocol.md``;
this package keeps it in ``_wire``, process supervision in ``_process`` and
the turn state machine in ``_turns``.

Design choices (the protocol document explains them to CLI authors):

- The child reports only what it produces (assistant and tool-result
  messages). The input messages are reported by this wrapper, as
  ``AgentLoop`` does; a child that echoes them anyway is tolerated.
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
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from threadline.agent._events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    Loop,
    MessageEnd,
    MessageStart,
)
from threadline.agent._subprocess._process import (
    ABORTED,
    DEFAULT_LINE_LIMIT,
    TIMED_OUT,
    TOO_LONG,
    Child,
    Options,
)
from threadline.agent._subprocess._turns import ProtocolError, Turns
from threadline.agent._subprocess._wire import decode_event, encode_request, quote
from threadline.ai._messages import Message
from threadline.errors import SubprocessError

__all__ = ["SubprocessLoop", "subprocess"]


def subprocess(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    grace: float = 5.0,
    line_limit: int = DEFAULT_LINE_LIMIT,
) -> Callable[[], Loop]:
    """A factory whose loop runs ``argv`` once per run and speaks JSON lines.

    ``env`` replaces the environment, as with ``subprocess.Popen`` (pass
    ``{**os.environ, ...}`` to extend it). ``grace`` is how long the child may
    take to exit after SIGTERM before it gets SIGKILL, and how long it may
    linger after ``agent_end``. ``line_limit`` bounds one stdout line in bytes.
    """
    return _Factory(Options.checked(argv, env, cwd, grace, line_limit))


@dataclass(frozen=True, slots=True)
class _Factory:
    options: Options

    def __call__(self) -> SubprocessLoop:
        return SubprocessLoop(self.options)

    def __repr__(self) -> str:
        return f"durable.subprocess({list(self.options.argv)!r})"


class SubprocessLoop:
    """One run of an external agent process; a ``Loop`` (see the module docstring)."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def run(
        self,
        context: Sequence[Message],
        input: Sequence[Message],
        *,
        abort: asyncio.Event | None = None,
    ) -> AsyncIterator[AgentEvent]:
        return self._run(context, input, abort if abort is not None else asyncio.Event())

    def __repr__(self) -> str:
        return f"SubprocessLoop({list(self.options.argv)!r})"

    async def _run(
        self, context: Sequence[Message], input: Sequence[Message], abort: asyncio.Event
    ) -> AsyncIterator[AgentEvent]:
        turns = Turns(input)
        yield AgentStart()
        for m in input:
            yield MessageStart(message=m)
            yield MessageEnd(message=m)
        if abort.is_set():
            yield AgentEnd(messages=turns.messages(), error=asyncio.CancelledError("run aborted"))
            return
        try:
            child = await Child.start(self.options, encode_request(context, input))
        except OSError as exc:
            failed = SubprocessError(
                f"cannot start agent process {self.options.argv[0]!r}: {exc}")
            failed.__cause__ = exc
            yield AgentEnd(messages=turns.messages(), error=failed)
            return
        try:
            reading = _Reading(child, turns, abort, self.options.line_limit)
            async for event in reading.events():
                yield event
            error = await reading.wind_down()
            for event in turns.close("aborted" if reading.aborted else "interrupted", error):
                yield event
            yield AgentEnd(messages=turns.messages(), error=error)
        finally:
            await child.cleanup()


class _Reading:
    """Reads the child's stdout into agent events until ``agent_end`` or trouble."""

    def __init__(self, child: Child, turns: Turns, abort: asyncio.Event, line_limit: int) -> None:
        self.child = child
        self.turns = turns
        self.abort = abort
        self.line_limit = line_limit
        self.aborted = False
        self.problem: str | None = None  # what the child did wrong, when it did
        self.alive = False  # whether it may still be running after the problem

    async def events(self) -> AsyncIterator[AgentEvent]:
        lineno = 0
        while not self.turns.finished:
            line = await self.child.next_line(watch_abort=not self.aborted, abort=self.abort)
            if line is ABORTED:
                self.aborted = True
                self.child.begin_stop()
                continue  # keep reading: the child may report its own wind-down
            if line is TIMED_OUT:
                self.problem, self.alive = "kept its stdout open after exiting", True
                return
            lineno += 1
            if line is TOO_LONG:
                self.problem = f"wrote stdout line {lineno} longer than {self.line_limit} bytes"
                self.alive = True
                return
            assert isinstance(line, bytes)
            if not line:
                return
            if not line.endswith(b"\n"):
                self.problem = f"stopped in the middle of stdout line {lineno}: {quote(line)}"
                return
            if not line.strip():
                continue
            try:
                events = self.turns.feed(decode_event(line))
            except (msgspec.DecodeError, ProtocolError) as exc:
                self.problem = (
                    f"broke the protocol on stdout line {lineno} ({exc}): {quote(line)}")
                self.alive = True
                return
            for event in events:
                yield event

    async def wind_down(self) -> BaseException | None:
        """Stop or reap the child; the run's error, if it has one."""
        child = self.child
        if self.alive and not self.aborted:
            await child.stop()
        else:
            await child.finish()
        tail = await child.stderr_tail()
        if self.aborted:
            return asyncio.CancelledError("run aborted")
        if self.problem is not None:
            return child.error(f"{self.problem}; it {child.exit_status()}", tail)
        if not self.turns.finished:
            return child.error(f"{child.exit_status()} before reporting agent_end", tail)
        if self.turns.child_error is not None:
            return child.error(f"reported an error: {self.turns.child_error}", tail)
        if child.failed():
            return child.error(f"reported agent_end, then {child.exit_status()}", tail)
        return None
