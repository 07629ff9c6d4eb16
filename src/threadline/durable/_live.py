"""Live runs in the log: who owns a session's run, what it streamed, how it ended.

A run that outlives its request (``LiveRuns`` in ``_runs.py``) writes its
bookkeeping as custom entries, so every store keeps them unchanged, forks
skip them (they are never on a message's own path) and the model never sees
them:

- ``threadline.run``: the claim. A session has at most one active run: the
  first claim in log order made while no run was active wins; a claim made
  while one is active is inert (its writer learns it by reading back).
- ``threadline.partial``: what the run's pending assistant message streamed
  since the last one (text, reasoning and tool-input pieces, numbered), so a
  client in any process can catch up. A message's last ``partial`` says so;
  the message's own entry supersedes them. One with no items is a heartbeat.
- ``threadline.stop``: a stop asked for, by anyone, for one run.
- ``threadline.run_end``: how the run ended (``stop_reason``); written by the
  owner, or by whoever found the owner dead (then with the aborted message
  rebuilt from its partials, in the same append).

This module is pure: it reads entries and makes frames. ``RunView`` turns a
run's entries (or, in the owner, its live events) into the one sequence of
frames every follower sees, with stable ids to resume after.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, TypeAlias

import msgspec

from threadline.ai._messages import AssistantMessage, TextPart, ThinkingPart, ToolCall
from threadline.ai._model import (
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
from threadline.session._entries import CustomEntry, Entry, MessageEntry, register_custom

__all__ = [
    "END_KIND",
    "PARTIAL_KIND",
    "RUN_KIND",
    "STOP_KIND",
    "Frame",
    "MessageFrame",
    "PartFrame",
    "Partial",
    "Piece",
    "RunClaim",
    "RunClosed",
    "RunEnd",
    "RunOpened",
    "RunView",
    "SessionRuns",
    "StopReason",
    "StopRequest",
    "piece_of",
    "scan",
    "this_process",
]

RUN_KIND = "threadline.run"
PARTIAL_KIND = "threadline.partial"
STOP_KIND = "threadline.stop"
END_KIND = "threadline.run_end"

StopReason: TypeAlias = Literal["done", "error", "awaiting_approval", "budget", "stopped",
                                "interrupted"]


class RunClaim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The data of a ``threadline.run`` entry: the process that owns the run."""

    owner: str
    """``host:pid``, for people."""
    host: str
    pid: int
    started: str = ""
    """When the owner process started (its kernel start time): a reused pid is another process."""
    lease: float = 30.0
    """Seconds without a sign of life (any entry of the run) after which another
    host takes the owner for dead."""


class Piece(msgspec.Struct, frozen=True, array_like=True):
    """One streamed piece of a pending message.

    ``op``: ``T``/``R``/``C`` a text, reasoning or tool-call block starts (a
    tool call's ``text`` is its id and ``name`` its tool); ``t``/``r``/``c``
    a delta of that block; ``E`` the block ended (a reasoning block's
    ``text`` is then its signature, if any).
    """

    op: str
    block: int
    text: str = ""
    name: str = ""


class Partial(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The data of a ``threadline.partial`` entry."""

    run: str
    message: int = -1
    """The pending message: the run's assistant messages counted from 0. -1: a heartbeat."""
    start: int = 0
    """The offset of ``pieces[0]`` among the message's pieces."""
    pieces: list[Piece] = msgspec.field(default_factory=list)
    last: bool = False
    """No piece of this message follows."""


class StopRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    run: str
    reason: str = ""
    by: str = ""


class RunEnd(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    run: str
    stop_reason: StopReason
    error: str | None = None
    recovered: bool = False
    """Written by another process that found the owner gone."""


register_custom(RUN_KIND, RunClaim)
register_custom(PARTIAL_KIND, Partial)
register_custom(STOP_KIND, StopRequest)
register_custom(END_KIND, RunEnd)


# -- frames ---------------------------------------------------------------------


class _Frame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    id: str
    """Stable across processes: resume after it (``follow(after=...)``). It starts
    with the run's id and a dot."""
    run_id: str


class RunOpened(_Frame, frozen=True, tag="run_opened"):
    type: ClassVar[Literal["run_opened"]] = "run_opened"
    session_id: str


class PartFrame(_Frame, frozen=True, tag="part"):
    """A piece of the run's assistant message ``message`` (counted from 0), at ``offset``."""

    type: ClassVar[Literal["part"]] = "part"
    message: int
    offset: int
    piece: Piece


class MessageFrame(_Frame, frozen=True, tag="message"):
    """A stored message of the run: its input, an assistant message (``index`` set), a
    tool result."""

    type: ClassVar[Literal["message"]] = "message"
    entry: MessageEntry
    index: int | None = None


class RunClosed(_Frame, frozen=True, tag="run_closed"):
    type: ClassVar[Literal["run_closed"]] = "run_closed"
    stop_reason: StopReason
    error: str | None = None


Frame: TypeAlias = RunOpened | PartFrame | MessageFrame | RunClosed


def piece_of(event: StreamEvent) -> Piece | None:
    """The piece a model stream event adds to the pending message, if any."""
    if isinstance(event, TextDelta):
        return Piece("t", event.index, event.delta)
    if isinstance(event, ThinkingDelta):
        return Piece("r", event.index, event.delta)
    if isinstance(event, ToolCallDelta):
        return Piece("c", event.index, event.delta)
    if isinstance(event, TextStart):
        return Piece("T", event.index)
    if isinstance(event, ThinkingStart):
        return Piece("R", event.index)
    if isinstance(event, ToolCallStart):
        return Piece("C", event.index, event.id, event.name)
    if isinstance(event, ThinkingEnd):
        return Piece("E", event.index, event.signature or "")
    if isinstance(event, TextEnd | ToolCallEnd):
        return Piece("E", event.index)
    return None


@dataclass
class _Block:
    kind: str  # T, R or C
    id: str = ""
    name: str = ""
    ended: bool = False
    signature: str = ""
    texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.texts)


@dataclass
class _Pending:
    prefix: str = ""
    """Of its part frames' ids."""
    blocks: dict[int, _Block] = field(default_factory=dict)
    count: int = 0
    last: bool = False

    def add(self, piece: Piece) -> None:
        self.count += 1
        op = piece.op
        block = self.blocks.get(piece.block)
        if op in "trc":
            if block is not None:
                block.texts.append(piece.text)
        elif op == "E":
            if block is not None:
                block.ended = True
                block.signature = piece.text
        else:
            self.blocks[piece.block] = _Block(op, id=piece.text, name=piece.name)

    def message(self) -> AssistantMessage:
        """What streamed, as an aborted message: text and reasoning as they stood,
        tool calls only if their arguments finished (a half call is never kept)."""
        content: list[TextPart | ThinkingPart | ToolCall] = []
        for _, block in sorted(self.blocks.items()):
            if block.kind == "T" and block.text:
                content.append(TextPart(text=block.text))
            elif block.kind == "R" and block.text:
                content.append(ThinkingPart(thinking=block.text, signature=block.signature or None))
            elif block.kind == "C" and block.ended:
                try:
                    arguments = json.loads(block.text) if block.text else {}
                except ValueError:
                    continue
                if isinstance(arguments, dict):
                    content.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
        return AssistantMessage(content=tuple(content), stop_reason="aborted",
                                error_message="the run ended before this message finished")


class RunView:
    """The frames of one run, made the same way from live events and from the log.

    The owner calls ``part``, ``message`` and ``close`` as its run reports;
    a follower in any process calls ``feed`` with the run's entries in log
    order. Both get the same frames with the same ids. From the log, an
    assistant message's entry can come before its last ``partial`` (they
    are written by two tasks): the frames after it wait for that one, or for
    the run's end.
    """

    def __init__(self, session_id: str, run_id: str) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self.pending: dict[int, _Pending] = {}
        self.assistant = 0
        """Assistant messages stored so far."""
        self.closed: RunClosed | None = None
        self.stopping = False
        """A stop was asked for."""
        self._held: list[MessageEntry] = []

    def opened(self) -> RunOpened:
        return RunOpened(id=self.run_id, run_id=self.run_id, session_id=self.session_id)

    def part(self, message: int, piece: Piece) -> PartFrame:
        pending = self.pending.get(message)
        if pending is None:
            pending = self.pending[message] = _Pending(prefix=f"{self.run_id}.{message}.")
        count = pending.count
        frame = PartFrame(id=pending.prefix + str(count), run_id=self.run_id,
                          message=message, offset=count, piece=piece)
        pending.add(piece)
        return frame

    def message(self, entry: MessageEntry) -> list[Frame]:
        """The frames for a stored message of the run: for an assistant message, the
        pieces its stream did not show (a model that does not stream), then itself."""
        m = entry.message
        if not isinstance(m, AssistantMessage):
            return [self.stored(entry)]
        index = self.assistant
        self.assistant += 1
        frames: list[Frame] = [self.part(index, p) for p in _missing(self.pending.get(index), m)]
        self.pending.pop(index, None)
        frames.append(self.stored(entry, index))
        return frames

    def stored(self, entry: MessageEntry, index: int | None = None) -> MessageFrame:
        return MessageFrame(id=f"{self.run_id}.{entry.id}", run_id=self.run_id, entry=entry,
                            index=index)

    def close(self, stop_reason: StopReason, error: str | None = None) -> RunClosed:
        self.closed = RunClosed(id=f"{self.run_id}.end", run_id=self.run_id,
                                stop_reason=stop_reason, error=error)
        return self.closed

    def pending_message(self) -> tuple[int, AssistantMessage] | None:
        """The assistant message streaming now, as far as it got (None once it is stored,
        even while its frames wait for its last partial)."""
        if not self.pending or any(isinstance(e.message, AssistantMessage) for e in self._held):
            return None
        index = max(self.pending)
        return index, self.pending[index].message()

    def feed(self, entry: Entry) -> list[Frame]:
        """The frames ``entry`` (the run's next entry in log order) adds."""
        if isinstance(entry, CustomEntry) and isinstance(entry.data, Partial):
            return self._partial(entry.data)
        if self.closed is not None:
            return []
        if isinstance(entry, CustomEntry) and isinstance(entry.data, RunEnd):
            frames = self._release(ending=True)
            end = entry.data
            frames.append(self.close(end.stop_reason, end.error))
            return frames
        if isinstance(entry, CustomEntry) and isinstance(entry.data, StopRequest):
            self.stopping = True
            return []
        if not isinstance(entry, MessageEntry):
            return []
        if self._held:
            self._held.append(entry)
            return []
        if isinstance(entry.message, AssistantMessage):
            pending = self.pending.get(self.assistant)
            if pending is not None and not pending.last:
                self._held.append(entry)
                return []
        return self.message(entry)

    def _partial(self, data: Partial) -> list[Frame]:
        if data.message < self.assistant or data.message < 0 or self.closed is not None:
            return []  # a heartbeat, or a message already stored
        pending = self.pending.get(data.message)
        if pending is None:
            pending = self.pending[data.message] = _Pending(
                prefix=f"{self.run_id}.{data.message}.")
        frames: list[Frame] = []
        for k, piece in enumerate(data.pieces):
            if data.start + k == pending.count:  # each offset once, in order
                frames.append(self.part(data.message, piece))
        pending.last = pending.last or data.last
        if self._held and pending.last and data.message == self.assistant:
            frames += self._release()
        return frames

    def _release(self, *, ending: bool = False) -> list[Frame]:
        """The held entries' frames, up to the next assistant message whose last
        ``partial`` has not come (all of them when the run ends)."""
        held, self._held = self._held, []
        frames: list[Frame] = []
        for k, entry in enumerate(held):
            assert isinstance(entry, MessageEntry)
            if k and not ending and isinstance(entry.message, AssistantMessage):
                pending = self.pending.get(self.assistant)
                if pending is not None and not pending.last:
                    self._held = held[k:]
                    break
            frames += self.message(entry)
        return frames


def _missing(pending: _Pending | None, final: AssistantMessage) -> list[Piece]:
    """The pieces that bring what streamed up to ``final``: blocks never started,
    text never sent, ends never seen. Nothing for a block whose text went
    another way than the final message's."""
    blocks = pending.blocks if pending is not None else {}
    pieces: list[Piece] = []
    for i, part in enumerate(final.content):
        block = blocks.get(i)
        if isinstance(part, ToolCall):
            kind, text = "C", None
        elif isinstance(part, ThinkingPart):
            kind, text = "R", part.thinking
        else:
            kind, text = "T", part.text
        if block is None:
            block = _Block(kind)
            pieces.append(Piece(kind, i, part.id, part.name) if isinstance(part, ToolCall)
                          else Piece(kind, i))
            if isinstance(part, ToolCall):
                arguments = json.dumps(part.arguments, ensure_ascii=False)
                pieces.append(Piece("c", i, arguments))
        if block.kind != kind:
            continue
        if text is not None and len(text) > len(block.text) and text.startswith(block.text):
            pieces.append(Piece(kind.lower(), i, text[len(block.text):]))
        if not block.ended:
            signature = part.signature if isinstance(part, ThinkingPart) else None
            pieces.append(Piece("E", i, signature or ""))
    return pieces


# -- who runs the session ------------------------------------------------------------


@dataclass
class ActiveRun:
    """The session's active run as the log shows it."""

    entry: CustomEntry[Any]
    claim: RunClaim
    seen: datetime
    """The time of its latest entry: the last sign of life."""
    stop: StopRequest | None = None

    @property
    def id(self) -> str:
        return self.entry.id


@dataclass
class SessionRuns:
    """What a session's log says about its runs (``scan``)."""

    active: ActiveRun | None = None
    last_run: str | None = None
    """The id of the latest run that ended."""
    ended: dict[str, RunEnd] = field(default_factory=dict)


def scan(entries: Iterable[Entry], state: SessionRuns | None = None) -> SessionRuns:
    """Read runs from ``entries`` in log order, continuing ``state`` if given.

    A claim counts only when no run is active at its place in the log.
    """
    state = state if state is not None else SessionRuns()
    for entry in entries:
        if not isinstance(entry, CustomEntry):
            if state.active is not None and entry.timestamp is not None:
                state.active.seen = max(state.active.seen, entry.timestamp)
            continue
        data = entry.data
        active = state.active
        if isinstance(data, RunClaim):
            if active is None:
                state.active = ActiveRun(entry, data, entry.timestamp)
        elif isinstance(data, RunEnd):
            state.ended.setdefault(data.run, data)
            if active is not None and data.run == active.id:
                state.active = None
                state.last_run = data.run
        elif active is not None and isinstance(data, StopRequest | Partial) \
                and data.run == active.id:
            active.seen = max(active.seen, entry.timestamp)
            if isinstance(data, StopRequest) and active.stop is None:
                active.stop = data
    return state


def run_entries(entries: Sequence[Entry], run_id: str) -> list[Entry] | None:
    """The entries of run ``run_id`` from its claim on (None if it is not in ``entries``)."""
    for i, entry in enumerate(entries):
        if entry.id == run_id:
            return list(entries[i + 1:])
    return None


# -- this process -------------------------------------------------------------------


def _start_time(pid: int) -> str:
    """The kernel's start time of process ``pid`` (Linux), or "" where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else ""


def this_process(lease: float) -> RunClaim:
    host, pid = socket.gethostname(), os.getpid()
    return RunClaim(owner=f"{host}:{pid}", host=host, pid=pid, started=_start_time(pid),
                    lease=lease)


def owner_alive(run: ActiveRun, now: datetime) -> bool:
    """Whether the process that owns ``run`` may still be running.

    On this host: its pid runs and started when the claim says. Elsewhere:
    some entry of the run is younger than its lease.
    """
    claim = run.claim
    if claim.host == socket.gethostname():
        try:
            os.kill(claim.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return not claim.started or _start_time(claim.pid) in ("", claim.started)
    return now - run.seen < timedelta(seconds=claim.lease)
