"""``ScriptedModel``: a deterministic LanguageModel for tests, demos and benchmarks.

It replays a script of assistant turns, one per ``stream`` call, through the
same protocol and stream events as a real provider, so code under test cannot
tell it apart from one (except that it is offline and exact)::

    from threadline.testing import Call, ScriptedModel, Text, Thinking, Turn

    model = ScriptedModel([
        Turn.tool_call("ls", {"path": "."}),            # turn 1 asks for a tool
        Turn(Thinking("looked"), Text("Two ", "files.")),  # turn 2 answers
    ])
    ... run an agent with it ...
    assert model.requests[1].messages[-1].tool_name == "ls"

A ``Turn`` is a sequence of blocks, streamed in order:

- ``Text(*chunks)``: a text block, one ``TextDelta`` per chunk.
- ``Thinking(*chunks, signature=None)``: a reasoning block.
- ``Call(name, arguments, id=None, fragments=3)``: a tool call whose
  arguments' JSON text streams in ``fragments`` ``ToolCallDelta`` pieces and is
  parsed at ``ToolCallEnd``. ``id`` defaults to ``call_<turn>_<n>``.
- ``Delay(seconds)``: a pause (wakes early when ``abort`` is set).
- ``Gate(event)``: waits until an ``asyncio.Event`` is set, so a test can hold
  the stream at an exact point.
- ``Fail(message, error=None)``: ends the stream with an ``ErrorEvent`` (stop
  reason ``error``) carrying ``error`` (a ``ModelError``; one is made from the
  message when omitted), after whatever blocks came before it.

Turn options: ``usage`` (reported on the final message) and ``stop_reason``
(defaults to ``tool_use`` when the turn has calls, else ``stop``). A script
entry may also be a function ``Request -> Turn`` for replies that depend on
what the model was sent.

Behaviour shared with real providers: ``abort`` is checked before every event
and during pauses; once set, the stream ends with an ``ErrorEvent`` whose
message has stop reason ``aborted`` and keeps the text streamed so far (a tool
call whose arguments had not finished is dropped). Closing the iterator stops
it at once. A provider failure never raises out of ``stream``; an exhausted
script is reported the same way, as an ``ErrorEvent``.

Every request is recorded in ``requests`` (and its options in ``options``),
so tests can assert what context the model saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import msgspec

from threadline.ai._messages import (
    AssistantContent,
    AssistantMessage,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCall,
    Usage,
)
from threadline.ai._model import (
    DoneEvent,
    ErrorEvent,
    ModelInfo,
    Request,
    StartEvent,
    StreamEvent,
    StreamOptions,
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
from threadline.errors import ModelError

__all__ = [
    "Block",
    "Call",
    "Delay",
    "Fail",
    "Gate",
    "ScriptItem",
    "ScriptedModel",
    "Text",
    "Thinking",
    "Turn",
]


@dataclass(frozen=True, slots=True, init=False)
class Text:
    chunks: tuple[str, ...]

    def __init__(self, *chunks: str) -> None:
        object.__setattr__(self, "chunks", chunks)


@dataclass(frozen=True, slots=True, init=False)
class Thinking:
    chunks: tuple[str, ...]
    signature: str | None

    def __init__(self, *chunks: str, signature: str | None = None) -> None:
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "signature", signature)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None
    fragments: int = 3


@dataclass(frozen=True, slots=True)
class Delay:
    seconds: float


@dataclass(frozen=True, slots=True)
class Gate:
    event: asyncio.Event


@dataclass(frozen=True, slots=True)
class Fail:
    message: str = "scripted model error"
    error: ModelError | None = None


Block: TypeAlias = Text | Thinking | Call | Delay | Gate | Fail


@dataclass(frozen=True, slots=True, init=False)
class Turn:
    """One scripted assistant message: blocks streamed in order."""

    blocks: tuple[Block, ...]
    usage: Usage
    stop_reason: StopReason | None

    def __init__(
        self, *blocks: Block, usage: Usage | None = None, stop_reason: StopReason | None = None
    ) -> None:
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "usage", usage or Usage())
        object.__setattr__(self, "stop_reason", stop_reason)

    @classmethod
    def text(cls, *chunks: str, usage: Usage | None = None) -> Turn:
        """A plain answer; each chunk becomes one text delta."""
        return cls(Text(*chunks), usage=usage)

    @classmethod
    def tool_call(
        cls,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        id: str | None = None,
        usage: Usage | None = None,
    ) -> Turn:
        return cls(Call(name, arguments or {}, id=id), usage=usage)

    @classmethod
    def tool_calls(
        cls, *calls: Call | tuple[str, Mapping[str, Any]], usage: Usage | None = None
    ) -> Turn:
        """Several calls in one message: ``Turn.tool_calls(("a", {}), ("b", {"x": 1}))``."""
        blocks = [c if isinstance(c, Call) else Call(c[0], c[1]) for c in calls]
        return cls(*blocks, usage=usage)

    @classmethod
    def error(cls, message: str = "scripted model error", error: ModelError | None = None) -> Turn:
        return cls(Fail(message, error))


ScriptItem: TypeAlias = Turn | Callable[[Request], Turn]


class _Aborted(Exception):
    pass


class ScriptedModel:
    """A LanguageModel that replays ``script``, one turn per ``stream`` call."""

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        info: ModelInfo | None = None,
    ) -> None:
        self._script: list[ScriptItem] = list(script)
        self._info = info or ModelInfo(provider="scripted", id="scripted-model")
        self.requests: list[Request] = []
        self.options: list[StreamOptions | None] = []

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def remaining(self) -> int:
        """Turns not replayed yet."""
        return len(self._script) - len(self.requests)

    def extend(self, items: Iterable[ScriptItem]) -> None:
        """Append turns to the script (for scripts written as a test goes)."""
        self._script.extend(items)

    async def stream(
        self, request: Request, options: StreamOptions | None = None
    ) -> AsyncIterator[StreamEvent]:
        turn_no = len(self.requests)
        self.requests.append(request)
        self.options.append(options)
        abort = options.abort if options is not None else None
        replay = _Replay(self._info, turn_no, abort)
        if turn_no >= len(self._script):
            msg = f"ScriptedModel: script exhausted after {len(self._script)} turn(s)"
            yield StartEvent(model=self._info.id, provider=self._info.provider)
            yield ErrorEvent(replay.final("error", error=msg), replay.error(msg))
            return
        item = self._script[turn_no]
        turn = item if isinstance(item, Turn) else item(request)
        yield StartEvent(model=self._info.id, provider=self._info.provider)
        try:
            for block in turn.blocks:
                replay.check()
                if isinstance(block, Delay | Gate):
                    if await _wait(block, abort):
                        raise _Aborted
                elif isinstance(block, Fail):
                    error = block.error or replay.error(block.message)
                    yield ErrorEvent(replay.final("error", turn.usage, block.message), error)
                    return
                else:
                    for event in replay.block(block):
                        yield event
            replay.check()
            stop = turn.stop_reason or ("tool_use" if replay.calls else "stop")
            yield DoneEvent(replay.final(stop, turn.usage))
        except _Aborted:
            yield ErrorEvent(replay.aborted(turn.usage))


class _Replay:
    """One ``stream`` call under way: the content streamed so far and the abort checks.

    The block streams check ``abort`` before each of their events but the
    first, raising ``_Aborted``; what they finished is in ``content``.
    """

    def __init__(self, info: ModelInfo, turn_no: int, abort: asyncio.Event | None) -> None:
        self.info = info
        self.turn_no = turn_no
        self.abort = abort
        self.content: list[AssistantContent] = []
        self.pending = ""  # text of the block being streamed, kept if aborted mid-block
        self.calls = 0

    def check(self) -> None:
        if self.abort is not None and self.abort.is_set():
            raise _Aborted

    def final(
        self, stop: StopReason, usage: Usage | None = None, error: str | None = None
    ) -> AssistantMessage:
        return AssistantMessage(
            content=tuple(self.content), model=self.info.id, provider=self.info.provider,
            api="scripted", usage=usage or Usage(), stop_reason=stop, error_message=error,
        )

    def aborted(self, usage: Usage) -> AssistantMessage:
        """The final message of an aborted stream: the text streamed so far is kept."""
        if self.pending:
            self.content.append(TextPart(text=self.pending))
        return self.final("aborted", usage, "aborted")

    def error(self, message: str) -> ModelError:
        return ModelError(message, provider=self.info.provider, model=self.info.id)

    def block(self, block: Text | Thinking | Call) -> Iterator[StreamEvent]:
        if isinstance(block, Text):
            return self._text(block)
        if isinstance(block, Thinking):
            return self._thinking(block)
        return self._call(block)

    def _text(self, block: Text) -> Iterator[StreamEvent]:
        index = len(self.content)
        yield TextStart(index)
        for chunk in block.chunks:
            self.check()
            self.pending += chunk
            yield TextDelta(index, chunk)
        self.check()
        part = TextPart(text=self.pending)
        self.content.append(part)
        self.pending = ""
        yield TextEnd(index, part.text)

    def _thinking(self, block: Thinking) -> Iterator[StreamEvent]:
        index = len(self.content)
        yield ThinkingStart(index)
        text = ""
        for chunk in block.chunks:
            self.check()
            text += chunk
            yield ThinkingDelta(index, chunk)
        self.check()
        self.content.append(ThinkingPart(thinking=text, signature=block.signature,
                                         provider=self.info.provider))
        yield ThinkingEnd(index, text, block.signature)

    def _call(self, block: Call) -> Iterator[StreamEvent]:
        index = len(self.content)
        call_id = block.id or f"call_{self.turn_no}_{self.calls}"
        self.calls += 1
        yield ToolCallStart(index, call_id, block.name)
        raw = msgspec.json.encode(dict(block.arguments)).decode()
        step = max(1, -(-len(raw) // max(1, block.fragments)))
        for at in range(0, len(raw), step):
            self.check()
            yield ToolCallDelta(index, raw[at : at + step])
        self.check()
        tool_call = ToolCall(id=call_id, name=block.name, arguments=msgspec.json.decode(raw))
        self.content.append(tool_call)
        yield ToolCallEnd(index, tool_call)


async def _wait(block: Delay | Gate, abort: asyncio.Event | None) -> bool:
    """Wait for the block; True when ``abort`` ended the wait first."""
    if abort is None:
        if isinstance(block, Delay):
            await asyncio.sleep(block.seconds)
        else:
            await block.event.wait()
        return False
    if abort.is_set():
        return True
    if isinstance(block, Delay) and block.seconds <= 0:
        await asyncio.sleep(0)
        return abort.is_set()
    waiter = asyncio.ensure_future(abort.wait())
    other = asyncio.ensure_future(
        asyncio.sleep(block.seconds) if isinstance(block, Delay) else block.event.wait()
    )
    try:
        await asyncio.wait((waiter, other), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        other.cancel()
        # Let both finish so closing the stream leaves no task behind.
        await asyncio.wait((waiter, other))
    return abort.is_set()
