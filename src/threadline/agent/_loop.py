"""The inner agent loop: stream the model, run the tools it asks for, repeat.

``AgentLoop`` implements the ``Loop`` protocol of ``threadline.agent._events``
(whose docstring states the event order; every run here keeps it). A turn is
one model call plus the tools it asked for; turns go on while the assistant
asks for tools.

Tools. The calls of one assistant message run concurrently (``parallel_tools``,
the default) or one after another. Each call gets ``ToolExecutionStart``, any
``ToolExecutionUpdate`` (its ``progress`` reports) and ``ToolExecutionEnd``;
in parallel mode the starts come in call order and the rest interleave as the
tools progress. The result messages then follow in call order. Every failure
of a call becomes an error result the model can read, never an exception: an
unknown tool, invalid arguments, a denial by ``before_tool_call``, a raising
tool or hook. ``after_tool_call`` may replace what a tool returned.

Bounds and failures:

- ``max_turns``: after that many model calls the loop stops even if the last
  assistant message asked for tools. Those tools still run, so every call has
  a result; ``AgentEnd.error`` is then an ``AgentError`` saying the bound was hit.
- A model ``ErrorEvent`` (or a model that raises, or ends without a final
  event) ends the turn with the failed assistant message, ``TurnEnd`` and
  ``AgentEnd`` whose ``error`` is the model's typed error.

Stopping:

- ``abort`` set: the model ends its message with stop reason ``aborted``;
  running tools are cancelled and get an ``aborted`` result (with their
  ``ToolExecutionEnd``); calls not started get one too; then ``TurnEnd`` and
  ``AgentEnd`` with ``error`` a ``CancelledError``. No further model call is
  made. The loop relies on the model to honour ``abort`` promptly, as the
  ``LanguageModel`` protocol requires.
- ``aclose()`` on the iterator, or cancelling the task that iterates it: the
  model stream is closed and running tools are cancelled and awaited before
  the close (or the ``CancelledError``) completes; no further events. To get
  the full wind-down report, set ``abort`` instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import msgspec

from threadline.agent._events import (
    AgentEnd,
    AgentEvent,
    AgentStart,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.agent._gate import BeforeModelCall, Pause, ResumeTurn, ToolGate
from threadline.ai import _trace as trace
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    synthesized_result,
)
from threadline.ai._model import (
    BlobReader,
    DoneEvent,
    ErrorEvent,
    LanguageModel,
    ModelInfo,
    ReasoningEffort,
    Request,
    StreamOptions,
)
from threadline.ai._tools import Tool, ToolContext, ToolResult
from threadline.errors import AgentError, ConfigError, ModelError, ToolError

__all__ = ["AfterToolCall", "AgentLoop", "BeforeToolCall", "Deny"]

_T = TypeVar("_T")


@dataclass(slots=True)
class _Reply:
    """How one model call ended (``_reply`` always sets it): the message, and the error."""

    message: AssistantMessage = dataclasses.field(
        default_factory=lambda: AssistantMessage(stop_reason="error"))
    error: BaseException | None = None


@dataclass(slots=True)
class _ToolOutcome:
    """What one assistant message's calls came to (``_run_tools`` fills it).

    ``results[i]`` is call i's result, None while it has none (an aborted call
    keeps None); ``held`` holds the indexes of the calls the gate paused.
    """

    calls: Sequence[ToolCall]
    results: list[ToolResultMessage | None] = dataclasses.field(init=False)
    held: set[int] = dataclasses.field(default_factory=set)
    validated: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Arguments the gate was shown, by call index: the call runs with these."""

    def __post_init__(self) -> None:
        self.results = [None] * len(self.calls)

    def answered(self) -> tuple[ToolResultMessage, ...]:
        """The results in call order, ``aborted`` for a call without one; held calls left out."""
        return tuple(
            r or _aborted(c)
            for i, (r, c) in enumerate(zip(self.results, self.calls, strict=True))
            if i not in self.held
        )

    def paused(self) -> list[str]:
        """The ids of the calls the gate holds, in call order."""
        return [self.calls[i].id for i in sorted(self.held)]


@dataclass(frozen=True, slots=True)
class Deny:
    """Returned by ``before_tool_call`` to refuse a call; the model sees the reason."""

    reason: str = "not allowed"


BeforeToolCall: TypeAlias = Callable[[ToolCall], Deny | Awaitable[Deny | None] | None]
"""Called with each valid call before it runs; return ``Deny(...)`` to refuse it."""

AfterToolCall: TypeAlias = Callable[
    [ToolCall, ToolResult], ToolResult | Awaitable[ToolResult | None] | None
]
"""Called with each executed call and its result; return a ``ToolResult`` to replace it."""

_FINAL = (DoneEvent, ErrorEvent)


class AgentLoop:
    """Model + tools + system prompt -> a ``Loop`` whose ``run`` streams agent events."""

    def __init__(
        self,
        model: LanguageModel,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        system: str | None = None,
        max_turns: int | None = 50,
        parallel_tools: bool = True,
        before_tool_call: BeforeToolCall | None = None,
        after_tool_call: AfterToolCall | None = None,
        options: StreamOptions | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        reasoning_effort: ReasoningEffort | None = None,
    ) -> None:
        if max_turns is not None and max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1 (or None), got {max_turns}")
        self.model = model
        self.system = system
        self.max_turns = max_turns
        self.parallel_tools = parallel_tools
        self.before_tool_call = before_tool_call
        self.after_tool_call = after_tool_call
        base = options or StreamOptions()
        self.options = dataclasses.replace(
            base,
            max_tokens=max_tokens if max_tokens is not None else base.max_tokens,
            temperature=temperature if temperature is not None else base.temperature,
            reasoning_effort=reasoning_effort or base.reasoning_effort,
        )
        self.tools: dict[str, Tool] = {}
        for t in tools:
            made = t if isinstance(t, Tool) else Tool.from_function(t)
            if made.name in self.tools:
                raise ToolError(f"two tools are named {made.name!r}")
            self.tools[made.name] = made
        self._specs = tuple(t.spec for t in self.tools.values())

    def run(
        self,
        context: Sequence[Message],
        input: Sequence[Message],
        *,
        abort: asyncio.Event | None = None,
        gate: ToolGate | None = None,
        resume: ResumeTurn | None = None,
        blobs: BlobReader | None = None,
        before_model: BeforeModelCall | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run turns from ``context`` + ``input``.

        ``blobs`` goes on every model request (``Request.blobs``): how the
        provider reads the attachments the messages reference.

        ``gate`` watches every tool call (the durable effect ledger). With
        ``resume`` the first turn is that stored turn's tool phase: no model
        call and no events for the assistant message, results only for its
        open calls. A call the gate pauses gets no result; the run ends after
        that turn with ``AgentEnd.awaiting_approval`` naming it.
        ``before_model`` is awaited before each model call; the exception it
        returns ends the run there (``AgentEnd.error``), no call made.
        """
        return self._run(context, input, _AbortSignal(abort or self.options.abort), gate, resume,
                         blobs=blobs, before_model=before_model)

    async def _run(
        self, context: Sequence[Message], input: Sequence[Message], signal: _AbortSignal,
        gate: ToolGate | None, resume: ResumeTurn | None, *, blobs: BlobReader | None,
        before_model: BeforeModelCall | None = None,
    ) -> AsyncIterator[AgentEvent]:
        try:
            abort = signal.abort
            options = self._options(abort)
            info = self.model.info
            history = list(context)
            produced: list[Message] = []
            error: BaseException | None = None
            yield AgentStart()
            for event in _taken_in(input, history, produced):
                yield event
            turn = 0
            paused: list[str] = []
            while True:
                error = await self._halted(abort, None if resume else before_model, history)
                if error is not None:
                    break
                turn += 1
                yield TurnStart(turn)
                if resume is not None:
                    final, calls = resume.message, tuple(resume.calls)
                    resume = None
                else:
                    yield MessageStart(AssistantMessage(model=info.id, provider=info.provider))
                    reply = _Reply()
                    async with aclosing(
                            self._reply(history, options, abort, reply, blobs)) as updates:
                        async for update in updates:
                            yield update
                    final, error = reply.message, reply.error
                    history.append(final)
                    produced.append(final)
                    yield MessageEnd(final)
                    calls = final.tool_calls
                outcome = _ToolOutcome(calls)
                if calls and error is None and not _is_set(abort):
                    async with aclosing(self._run_tools(outcome, signal, gate)) as tool_events:
                        async for tool_event in tool_events:
                            yield tool_event
                done = outcome.answered()
                paused.extend(outcome.paused())
                for event in _taken_in(done, history, produced):
                    yield event
                yield TurnEnd(turn, final, done)
                if error is not None or not calls or paused:
                    break
                if self.max_turns is not None and turn >= self.max_turns and not _is_set(abort):
                    error = AgentError(
                        f"stopped after max_turns={self.max_turns}: the model still asked for tools"
                    )
                    break
            yield AgentEnd(tuple(produced), error, awaiting_approval=tuple(paused))
        finally:
            await signal.close()  # the run is over: stop watching abort

    async def _halted(self, abort: asyncio.Event | None, before_model: BeforeModelCall | None,
                      history: list[Message]) -> BaseException | None:
        """Why no further turn starts: the abort, or ``before_model``'s refusal; or None."""
        if _is_set(abort):
            return asyncio.CancelledError("run aborted")
        if before_model is None:
            return None
        return await before_model(Request(tuple(history), self.system, self._specs),
                                  self.model.info)

    def _options(self, abort: asyncio.Event | None) -> StreamOptions:
        options = self.options
        return options if options.abort is abort else dataclasses.replace(options, abort=abort)

    async def _reply(
        self, history: list[Message], options: StreamOptions, abort: asyncio.Event | None,
        reply: _Reply, blobs: BlobReader | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Stream one assistant message as updates; its end and error land in ``reply``."""
        info = self.model.info
        if _is_set(abort):  # set while TurnStart was reported
            reply.message = AssistantMessage(
                model=info.id, provider=info.provider, stop_reason="aborted",
                error_message="aborted",
            )
            reply.error = asyncio.CancelledError("run aborted")
            return
        # Ended in the finally however the stream ends: done, failed, or closed by the consumer.
        span = trace.model_span(info.provider, info.id, history, self.system)
        try:
            stream = self.model.stream(
                Request(tuple(history), self.system, self._specs, blobs), options)
            try:
                async for event in stream:
                    if isinstance(event, _FINAL):
                        reply.message = event.message
                        if isinstance(event, ErrorEvent):
                            reply.error = _stream_error(event, info)
                        return
                    yield MessageUpdate(event)
            except Exception as exc:  # a model that breaks the protocol and raises
                reply.error = exc
                reply.message = _failed(info.id, info.provider, f"{type(exc).__name__}: {exc}")
                return
            finally:
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()
            text = "model stream ended without a final event"
            reply.error = ModelError(text, provider=info.provider, model=info.id)
            reply.message = _failed(info.id, info.provider, text)
        finally:
            trace.end_model_span(span, reply.message, reply.error)

    async def _run_tools(
        self, outcome: _ToolOutcome, signal: _AbortSignal, gate: ToolGate | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Execute ``outcome.calls``, filling ``outcome``; a call left at None was aborted.

        Calls the gate answers get their result without execution events;
        calls it pauses are added to ``outcome.held`` and left at None.
        """
        calls, results = outcome.calls, outcome.results
        abort = signal.abort
        if gate is not None and getattr(gate, "passive", False):
            # Validated now all the same, before any call runs (see ToolGate).
            for i, call in enumerate(calls):
                self._validate(call, i, outcome.validated)
            gate = None
        admitted = [True] * len(calls) if gate is None else await self._admit_all(gate, outcome)
        # Tool tasks report through one queue: an update, the index of a call that
        # finished, or None when abort fired. Plain tasks rather than a TaskGroup:
        # a TaskGroup would cancel the consumer's task, which runs this generator.
        queue: asyncio.Queue[ToolExecutionUpdate | int | None] = asyncio.Queue()
        tasks: dict[int, asyncio.Task[ToolResultMessage]] = {}
        signal.watch(queue)
        launched = finished = 0
        try:
            while finished < len(calls):
                while (
                    launched < len(calls)
                    and (self.parallel_tools or launched == finished)
                    and not _is_set(abort)
                ):
                    if not admitted[launched]:
                        launched += 1
                        finished += 1
                        continue
                    call = calls[launched]
                    yield ToolExecutionStart(call.id, call.name, call.arguments)
                    tasks[launched] = asyncio.create_task(
                        self._tool_task(launched, call, queue, gate,
                                        outcome.validated.get(launched)),
                        name=f"tool {call.name} {call.id}",
                    )
                    launched += 1
                if finished == len(calls):
                    break
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, ToolExecutionUpdate):
                    yield item
                    continue
                results[item] = result = tasks.pop(item).result()
                finished += 1
                yield ToolExecutionEnd(result.tool_call_id, result.tool_name, result)
        finally:
            signal.watch(None)
            await _cancel_and_wait(tasks)
        # Only reached when abort fired: close every started call.
        for index, task in sorted(tasks.items()):
            results[index] = ended = _ended(task, calls[index])
            yield ToolExecutionEnd(ended.tool_call_id, ended.tool_name, ended)

    async def _admit_all(self, gate: ToolGate, outcome: _ToolOutcome) -> list[bool]:
        """Put every call to the gate, in call order; False for those it answered or held."""
        admitted: list[bool] = []
        for i, call in enumerate(outcome.calls):
            verdict = await self._admit(gate, call, i, outcome.validated)
            if isinstance(verdict, Pause):
                outcome.held.add(i)
            elif verdict is not None:
                outcome.results[i] = verdict
            admitted.append(verdict is None)
        return admitted

    async def _admit(
        self, gate: ToolGate, call: ToolCall, index: int, validated: dict[int, dict[str, Any]]
    ) -> ToolResultMessage | Pause | None:
        tool = self._validate(call, index, validated)
        if tool is None:
            return None  # answered by _execute: an unknown tool, invalid arguments
        verdict = await gate.admit(call, tool, validated[index])
        if isinstance(verdict, ToolResult):
            return ToolResultMessage(
                tool_call_id=call.id, tool_name=call.name, content=verdict.content,
                is_error=verdict.is_error, details=verdict.details,
            )
        return verdict

    def _validate(self, call: ToolCall, index: int,
                  validated: dict[int, dict[str, Any]]) -> Tool | None:
        """The call's tool once its arguments are in ``validated``; None if they cannot be."""
        tool = self.tools.get(call.name)
        if tool is None:
            return None
        try:
            validated[index] = tool.validate(call.arguments)
        except msgspec.ValidationError:
            return None
        return tool

    async def _tool_task(
        self, index: int, call: ToolCall, queue: asyncio.Queue[ToolExecutionUpdate | int | None],
        gate: ToolGate | None = None, kwargs: dict[str, Any] | None = None,
    ) -> ToolResultMessage:
        running = True

        def progress(update: Any) -> None:
            if running:  # an update after the end would break the event order
                queue.put_nowait(ToolExecutionUpdate(call.id, call.name, update))

        try:
            with trace.span(f"execute_tool {call.name}", _tool_attributes(call)) as span:
                result = await self._execute(call, progress, gate, kwargs)
                trace.tool_result(span, result)
            return result
        finally:
            running = False
            queue.put_nowait(index)

    async def _execute(
        self, call: ToolCall, progress: Callable[[Any], None], gate: ToolGate | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> ToolResultMessage:
        """Run one call; ``kwargs`` are its arguments as already validated (for the gate)."""
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(self.tools) or "none"
            return _error(call, f"Unknown tool {call.name!r}. Available tools: {names}.")
        if kwargs is None:
            try:
                kwargs = tool.validate(call.arguments)
            except msgspec.ValidationError as exc:
                return _error(call, tool.invalid_arguments_message(call.arguments, exc))
        if self.before_tool_call is not None:
            try:
                verdict = await _resolve(self.before_tool_call(call))
            except Exception as exc:
                return _error(call, f"before_tool_call failed for {call.name!r}: {_describe(exc)}")
            if isinstance(verdict, Deny):
                return _error(call, f"Tool call denied: {verdict.reason}")
        # The gate's own failure (a store write) is not the tool's: it ends the run.
        context = (await gate.begin(call, tool) if gate is not None
                   else ToolContext(call_id=call.id, tool_name=call.name, idempotency_key=call.id))
        try:
            result = await tool.execute(kwargs, progress, context)
        except Exception as exc:
            result = ToolResult.error(f"Tool {call.name!r} failed: {_describe(exc)}")
        if self.after_tool_call is not None:
            try:
                replaced = await _resolve(self.after_tool_call(call, result))
            except Exception as exc:
                return _error(call, f"after_tool_call failed for {call.name!r}: {_describe(exc)}")
            if replaced is not None:
                result = replaced
        return ToolResultMessage(
            tool_call_id=call.id, tool_name=call.name, content=result.content,
            is_error=result.is_error, details=result.details,
        )


def _tool_attributes(call: ToolCall) -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool",
                                  "gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id}
    if trace.capture_content():
        attributes["gen_ai.tool.call.arguments"] = msgspec.json.encode(call.arguments).decode()
    return attributes


def _taken_in(messages: Iterable[Message], history: list[Message],
              produced: list[Message]) -> Iterator[AgentEvent]:
    """The start and end events of messages the run adds as they are (input, results)."""
    for message in messages:
        history.append(message)
        produced.append(message)
        yield MessageStart(message)
        yield MessageEnd(message)


def _is_set(abort: asyncio.Event | None) -> bool:
    return abort is not None and abort.is_set()


class _AbortSignal:
    """Tells a run's tool phases when ``abort`` fires.

    Waiting for an ``asyncio.Event`` takes a task. One per run, whose one
    done-callback wakes the tool phase under way, instead of a task (or even
    a callback) per phase: starting, cancelling and awaiting a task per turn
    cost more than the turn itself.
    """

    __slots__ = ("_queue", "_watcher", "abort")

    def __init__(self, abort: asyncio.Event | None) -> None:
        self.abort = abort
        self._watcher: asyncio.Future[Any] | None = None
        self._queue: asyncio.Queue[Any] | None = None

    def watch(self, queue: asyncio.Queue[Any] | None) -> None:
        """Put None into ``queue`` once ``abort`` fires (at once if it has); None: stop."""
        self._queue = queue
        if self.abort is None or queue is None:
            return
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self.abort.wait())
            self._watcher.add_done_callback(self._fired)
        elif self._watcher.done():
            queue.put_nowait(None)

    def _fired(self, _: asyncio.Future[Any]) -> None:
        queue = self._queue
        if queue is not None:
            queue.put_nowait(None)

    async def close(self) -> None:
        watcher = self._watcher
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.wait((watcher,))  # leave no task behind the run


async def _cancel_and_wait(tasks: dict[int, asyncio.Task[ToolResultMessage]]) -> None:
    """Cancel the tool tasks still running, then await them all."""
    for task in tasks.values():
        task.cancel()
    if tasks:
        await asyncio.wait(tasks.values())


def _ended(task: asyncio.Task[ToolResultMessage], call: ToolCall) -> ToolResultMessage:
    """A wound-down tool task's result: its own if it finished, else ``aborted``."""
    if task.cancelled() or task.exception() is not None:
        return _aborted(call)
    return task.result()


async def _resolve(value: _T | Awaitable[_T]) -> _T:
    if inspect.isawaitable(value):
        return await value
    return value


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _stream_error(event: ErrorEvent, info: ModelInfo) -> BaseException:
    text = event.message.error_message
    if event.message.stop_reason == "aborted":
        return asyncio.CancelledError(text or "run aborted")
    return event.error or ModelError(text or "model error", provider=info.provider, model=info.id)


def _failed(model: str, provider: str, text: str) -> AssistantMessage:
    return AssistantMessage(model=model, provider=provider, stop_reason="error", error_message=text)


def _error(call: ToolCall, text: str) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=(TextPart(text=text),), is_error=True
    )


def _aborted(call: ToolCall) -> ToolResultMessage:
    return synthesized_result(call.id, call.name, "aborted")
