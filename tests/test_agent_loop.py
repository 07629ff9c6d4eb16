"""The agent loop (``threadline.agent.AgentLoop``) and the scripted model.

Every run goes through ``check_order``, which asserts the event grammar stated
in ``threadline/agent/_events.py``. Concurrency is proven with barriers (two
tools that each wait for the other), never with timings; ``asyncio.timeout``
only turns a deadlock into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from threadline.agent import (
    AgentEnd,
    AgentEvent,
    AgentLoop,
    Deny,
    Loop,
    MessageStart,
    MessageUpdate,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
    TurnEnd,
    TurnStart,
)
from threadline.ai import (
    AssistantMessage,
    DoneEvent,
    ErrorEvent,
    ImagePart,
    Message,
    ModelInfo,
    Progress,
    Request,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDelta,
    TextEnd,
    TextPart,
    ToolCallDelta,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
    tool,
)
from threadline.errors import AgentError, ConfigError, ModelError, RateLimitError, ToolError
from threadline.testing import Call, Delay, Fail, Gate, ScriptedModel, Text, Thinking, Turn
from threadline.testing._grammar import assert_event_order, assert_stream_order

# --------------------------------------------------------------------------- grammar

check_order = assert_event_order
check_stream = assert_stream_order


def assert_every_call_answered(messages: Sequence[Message]) -> None:
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage) and m.tool_calls:
            following = messages[i + 1 : i + 1 + len(m.tool_calls)]
            assert [r.tool_call_id for r in following if isinstance(r, ToolResultMessage)] == [
                c.id for c in m.tool_calls
            ], f"message {i}: unanswered tool calls"


async def collect(
    loop: Loop,
    input: str = "hi",
    *,
    context: Sequence[Message] = (),
    abort: asyncio.Event | None = None,
    sequential: bool = False,
) -> tuple[list[AgentEvent], AgentEnd]:
    events = [e async for e in loop.run(context, [UserMessage.of(input)], abort=abort)]
    return events, check_order(events, sequential=sequential)


def of(events: Sequence[AgentEvent], cls: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


# --------------------------------------------------------------------------- runs


async def test_text_only_run_reports_one_turn_and_records_the_request() -> None:
    model = ScriptedModel([Turn(Thinking("hmm"), Text("Hel", "lo"), usage=Usage(output_tokens=3))])
    earlier = [UserMessage.of("before"), AssistantMessage(content=(TextPart(text="ok"),))]
    events, end = await collect(AgentLoop(model, system="be brief"), context=earlier)
    assert end.error is None
    user, answer = end.messages
    assert isinstance(answer, AssistantMessage)
    assert answer.text == "Hello" and answer.usage.output_tokens == 3
    assert answer.stop_reason == "stop"
    assert [e.event.delta for e in of(events, MessageUpdate) if isinstance(e.event, TextDelta)] == [
        "Hel", "lo"
    ]
    (request,) = model.requests
    assert request.system == "be brief" and request.tools == ()
    assert request.messages == (*earlier, user)


async def test_single_tool_call_result_goes_back_to_the_model() -> None:
    seen: list[str] = []

    @tool
    def ls(path: str) -> list[str]:
        """List files."""
        seen.append(path)
        return ["a.txt", "b.txt"]

    model = ScriptedModel([Turn.tool_call("ls", {"path": "."}, id="c1"), Turn.text("two")])
    events, end = await collect(AgentLoop(model, [ls]))
    assert seen == ["."]
    assert len(of(events, TurnStart)) == 2
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage)
    assert result.text == '["a.txt","b.txt"]' and not result.is_error
    assert model.requests[1].messages == end.messages[:3]
    assert model.requests[0].tools[0].name == "ls"


async def test_parallel_tools_overlap_and_results_come_in_call_order() -> None:
    a_started, b_started, b_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @tool
    async def a() -> str:
        a_started.set()
        await b_started.wait()  # deadlocks unless b runs at the same time
        await b_done.wait()
        return "A"

    @tool
    async def b() -> str:
        b_started.set()
        await a_started.wait()
        b_done.set()
        return "B"

    model = ScriptedModel([Turn.tool_calls(("a", {}), ("b", {})), Turn.text("done")])
    async with asyncio.timeout(10):  # a deadlock fails the test instead of hanging it
        events, _ = await collect(AgentLoop(model, [a, b]))
    assert [e.tool_name for e in of(events, ToolExecutionEnd)] == ["b", "a"]  # b finished first
    turn_end = of(events, TurnEnd)[0]
    assert [r.text for r in turn_end.tool_results] == ["A", "B"]  # yet reported in call order
    starts = [i for i, e in enumerate(events) if isinstance(e, ToolExecutionStart)]
    first_end = next(i for i, e in enumerate(events) if isinstance(e, ToolExecutionEnd))
    assert max(starts) < first_end


def _concurrency_probe() -> tuple[list[int], Any]:
    state = [0, 0]  # running now, most at once

    @tool
    async def probe(n: int) -> str:
        state[0] += 1
        state[1] = max(state)
        for _ in range(3):
            await asyncio.sleep(0)
        state[0] -= 1
        return str(n)

    return state, probe


async def test_sequential_mode_runs_one_tool_at_a_time() -> None:
    script = [Turn.tool_calls(("probe", {"n": 1}), ("probe", {"n": 2}), ("probe", {"n": 3})),
              Turn.text("ok")]
    state, probe = _concurrency_probe()
    events, _ = await collect(
        AgentLoop(ScriptedModel(script), [probe], parallel_tools=False), sequential=True
    )
    assert state[1] == 1
    assert [e.result.text for e in of(events, ToolExecutionEnd)] == ["1", "2", "3"]
    state, probe = _concurrency_probe()  # the same tools overlap in parallel mode
    await collect(AgentLoop(ScriptedModel(script), [probe]))
    assert state[1] == 3


async def test_progress_updates_arrive_between_start_and_end() -> None:
    @tool
    async def work(steps: int, progress: Progress) -> ToolResult:
        for i in range(steps):
            progress({"done": i + 1})
            await asyncio.sleep(0)
        return ToolResult.text("finished", details={"steps": steps})

    model = ScriptedModel([Turn.tool_call("work", {"steps": 3}), Turn.text("ok")])
    events, end = await collect(AgentLoop(model, [work]))
    kinds = [type(e).__name__ for e in events if type(e).__name__.startswith("ToolExecution")]
    assert kinds == ["ToolExecutionStart"] + ["ToolExecutionUpdate"] * 3 + ["ToolExecutionEnd"]
    assert [e.update for e in of(events, ToolExecutionUpdate)] == [{"done": i} for i in (1, 2, 3)]
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage) and result.details == {"steps": 3}
    assert result.text == "finished"


async def test_a_raising_tool_becomes_an_error_result_and_the_loop_goes_on() -> None:
    @tool
    def boom(x: int) -> str:
        raise RuntimeError(f"disk on fire ({x})")

    model = ScriptedModel([Turn.tool_call("boom", {"x": 7}), Turn.text("sorry")])
    _, end = await collect(AgentLoop(model, [boom]))
    assert end.error is None
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage) and result.is_error
    assert "RuntimeError: disk on fire (7)" in result.text
    assert model.requests[1].messages[-1] == result
    assert isinstance(end.messages[-1], AssistantMessage) and end.messages[-1].text == "sorry"


async def test_invalid_arguments_and_unknown_tools_get_readable_errors_without_a_call() -> None:
    calls: list[int] = []

    @tool
    def count(n: int) -> str:
        calls.append(n)
        return "ok"

    model = ScriptedModel([
        Turn.tool_calls(("count", {"n": "three"}), ("count", {"m": 1}), ("nope", {}),
                        ("count", {"n": 3})),
        Turn.text("done"),
    ])
    _, end = await collect(AgentLoop(model, [count]))
    assert calls == [3]
    bad_type, missing, unknown, good = (m for m in end.messages if isinstance(m, ToolResultMessage))
    assert bad_type.is_error and "Expected `int`, got `str` - at `$.n`" in bad_type.text
    assert "count" in bad_type.text and '"three"' in bad_type.text
    assert missing.is_error and "`m`" in missing.text
    assert unknown.is_error and "Unknown tool 'nope'" in unknown.text and "count" in unknown.text
    assert not good.is_error and good.text == "ok"


async def test_before_hook_denies_and_after_hook_replaces() -> None:
    ran: list[str] = []

    @tool
    def rm(path: str) -> str:
        ran.append(path)
        return f"removed {path}"

    async def guard(call: Any) -> Deny | None:
        await asyncio.sleep(0)
        return Deny("never under /etc") if call.arguments["path"].startswith("/etc") else None

    def redact(call: Any, result: ToolResult) -> ToolResult | None:
        if call.arguments["path"] == "secret":
            return ToolResult.text("[redacted]", details={"was": result.content[0]})
        return None

    model = ScriptedModel([
        Turn.tool_calls(("rm", {"path": "/etc/passwd"}), ("rm", {"path": "secret"}),
                        ("rm", {"path": "tmp"})),
        Turn.text("ok"),
    ])
    _, end = await collect(AgentLoop(model, [rm], before_tool_call=guard, after_tool_call=redact))
    assert ran == ["secret", "tmp"]
    denied, redacted, plain = (m for m in end.messages if isinstance(m, ToolResultMessage))
    assert denied.is_error and "denied: never under /etc" in denied.text
    assert redacted.text == "[redacted]"
    assert redacted.details == {"was": TextPart(text="removed secret")}
    assert plain.text == "removed tmp"


async def test_a_raising_hook_becomes_an_error_result() -> None:
    @tool
    def noop() -> str:
        return "ran"

    def bad_hook(call: Any) -> None:
        raise ValueError("policy store down")

    model = ScriptedModel([Turn.tool_call("noop"), Turn.text("ok")])
    _, end = await collect(AgentLoop(model, [noop], before_tool_call=bad_hook))
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage) and result.is_error
    assert "before_tool_call" in result.text and "policy store down" in result.text


async def test_max_turns_stops_after_running_the_last_turns_tools() -> None:
    ran: list[int] = []

    @tool
    def step(i: int) -> str:
        ran.append(i)
        return "again"

    model = ScriptedModel([Turn.tool_call("step", {"i": i}) for i in range(5)])
    events, end = await collect(AgentLoop(model, [step], max_turns=2))
    assert len(model.requests) == 2 and ran == [0, 1]
    assert len(of(events, TurnEnd)) == 2
    assert isinstance(end.error, AgentError) and "max_turns=2" in str(end.error)
    assert isinstance(end.messages[-1], ToolResultMessage)  # the last call was answered
    assert_every_call_answered(end.messages)


def test_bad_loop_options_are_rejected() -> None:
    with pytest.raises(ConfigError, match="max_turns"):
        AgentLoop(ScriptedModel(), max_turns=0)

    def same() -> None: ...

    with pytest.raises(ToolError, match="same"):
        AgentLoop(ScriptedModel(), [same, same])


async def test_model_error_ends_the_run_with_the_typed_error() -> None:
    limit = RateLimitError("slow down", provider="scripted", retry_after=3.0)
    model = ScriptedModel([Turn(Text("partial"), Call("ls"), Fail("429", limit))])

    @tool
    def ls() -> str:
        raise AssertionError("a call from a failed message must not run")

    events, end = await collect(AgentLoop(model, [ls]))
    assert end.error is limit
    failed = end.messages[1]
    assert isinstance(failed, AssistantMessage)
    assert failed.stop_reason == "error" and failed.error_message == "429"
    assert failed.text == "partial"
    assert not of(events, ToolExecutionStart)
    assert_every_call_answered(end.messages)
    assert len(model.requests) == 1


class _RaisingModel:
    """A model that breaks the protocol: raises instead of yielding ErrorEvent."""

    info = ModelInfo(provider="broken", id="broken-1")

    def __init__(self, finish: bool = False) -> None:
        self.finish = finish

    async def stream(
        self, request: Request, options: StreamOptions | None = None
    ) -> AsyncIterator[StreamEvent]:
        yield StartEvent(model="broken-1", provider="broken")
        if not self.finish:
            raise ConnectionResetError("socket closed")


async def test_a_model_that_raises_or_stops_early_still_ends_the_run() -> None:
    _, end = await collect(AgentLoop(_RaisingModel()))
    assert isinstance(end.error, ConnectionResetError)
    failed = end.messages[-1]
    assert isinstance(failed, AssistantMessage) and failed.stop_reason == "error"
    assert "socket closed" in (failed.error_message or "")

    _, end = await collect(AgentLoop(_RaisingModel(finish=True)))
    assert isinstance(end.error, ModelError) and "without a final event" in str(end.error)


async def test_plain_functions_are_tools() -> None:
    def shout(text: str) -> str:
        """Upper-case text."""
        return text.upper()

    model = ScriptedModel([Turn.tool_call("shout", {"text": "hey"}), Turn.text("ok")])
    loop = AgentLoop(model, [shout], system="s")
    events = [e async for e in loop.run([], [UserMessage.of("go")])]
    end = check_order(events)
    assert isinstance(end.messages[0], UserMessage) and end.messages[0].text == "go"
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage) and result.text == "HEY"
    assert model.requests[0].tools[0].description == "Upper-case text."


async def test_stream_options_reach_the_model() -> None:
    model = ScriptedModel([Turn.text("x")])
    abort = asyncio.Event()
    loop = AgentLoop(model, max_tokens=100, temperature=0.2, reasoning_effort="low")
    await collect(loop, abort=abort)
    (options,) = model.options
    assert options is not None
    assert (options.max_tokens, options.temperature, options.reasoning_effort) == (
        100, 0.2, "low"
    )
    assert options.abort is abort


async def test_abort_before_the_first_turn_makes_no_model_call() -> None:
    model = ScriptedModel([Turn.text("x")])
    abort = asyncio.Event()
    abort.set()
    events, end = await collect(AgentLoop(model), abort=abort)
    assert model.requests == [] and not of(events, TurnStart)
    assert isinstance(end.error, asyncio.CancelledError)


async def test_abort_while_the_model_streams_keeps_the_partial_text() -> None:
    gate = asyncio.Event()
    model = ScriptedModel([Turn(Text("Hel", "lo"), Gate(gate), Text("never"))])
    abort = asyncio.Event()
    events: list[AgentEvent] = []
    async for ev in AgentLoop(model).run([], [UserMessage.of("hi")], abort=abort):
        events.append(ev)
        if isinstance(ev, MessageUpdate) and isinstance(ev.event, TextEnd):
            abort.set()  # the model is now held at the gate
    end = check_order(events)
    aborted = end.messages[-1]
    assert isinstance(aborted, AssistantMessage) and aborted.stop_reason == "aborted"
    assert aborted.text == "Hello"
    assert not gate.is_set()


# --------------------------------------------------------------- cancellation sweep


@dataclass
class _Tracker:
    started: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)


def _sweep_loop(parallel: bool) -> tuple[AgentLoop, ScriptedModel, _Tracker]:
    """Three turns: text, thinking and three tool calls; one call; a final answer."""
    tracker = _Tracker()

    @tool
    async def slow(n: int, progress: Progress) -> str:
        tracker.started.add(n)
        try:
            for k in range(3):
                progress(k)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            tracker.cancelled.add(n)
            raise
        tracker.finished.add(n)
        return f"slow {n}"

    @tool
    def fast(x: str) -> str:
        return x.upper()

    model = ScriptedModel([
        Turn(Thinking("plan", "ning"), Delay(0), Text("Let me ", "look."),
             Call("slow", {"n": 1}), Delay(0), Call("slow", {"n": 2}), Call("fast", {"x": "a"})),
        Turn(Text("again"), Call("slow", {"n": 3})),
        Turn.text("done ", "now"),
    ])
    return AgentLoop(model, [slow, fast], parallel_tools=parallel), model, tracker


def _pending_tasks() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


async def _full_run_length(parallel: bool) -> int:
    loop, _, _ = _sweep_loop(parallel)
    events, end = await collect(loop, sequential=not parallel)
    assert end.error is None and len(of(events, TurnEnd)) == 3
    return len(events)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
async def test_abort_at_every_event_index_winds_down_with_a_full_report(parallel: bool) -> None:
    total = await _full_run_length(parallel)
    seen_cancelled_tools = seen_aborted_streams = seen_unstarted_calls = 0
    for index in range(total):
        loop, model, tracker = _sweep_loop(parallel)
        abort = asyncio.Event()
        events: list[AgentEvent] = []
        requests_at_abort = -1
        async for ev in loop.run([], [UserMessage.of("go")], abort=abort):
            events.append(ev)
            if len(events) == index + 1:
                abort.set()
                requests_at_abort = len(model.requests)
        where = f"abort at event {index} ({type(events[index]).__name__})"
        try:
            end = check_order(events, sequential=not parallel)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc
        assert_every_call_answered(end.messages)
        assert tracker.started == tracker.finished | tracker.cancelled, where
        assert len(model.requests) == requests_at_abort, f"{where}: a model call after abort"
        last = end.messages[-1]
        if isinstance(last, AssistantMessage) and last.stop_reason == "stop":
            assert end.error is None and last.text == "done now", where  # nothing left to stop
        else:
            assert isinstance(end.error, asyncio.CancelledError), where
        synthesized = [
            m for m in end.messages if isinstance(m, ToolResultMessage) and m.synthesized
        ]
        assert len(synthesized) >= len(tracker.cancelled), where
        assert not _pending_tasks(), where
        seen_cancelled_tools += bool(tracker.cancelled)
        seen_aborted_streams += any(
            isinstance(m, AssistantMessage) and m.stop_reason == "aborted" and m.content
            for m in end.messages
        )
        executed = {e.tool_call_id for e in of(events, ToolExecutionStart)}
        seen_unstarted_calls += any(m.tool_call_id not in executed for m in synthesized)
    # the sweep really hit each wind-down path
    assert seen_cancelled_tools and seen_aborted_streams and seen_unstarted_calls


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
async def test_aclose_at_every_event_index_leaves_nothing_running(parallel: bool) -> None:
    total = await _full_run_length(parallel)
    cancelled_somewhere = 0
    for index in range(total):
        loop, _, tracker = _sweep_loop(parallel)
        stream = loop.run([], [UserMessage.of("go")])
        events = [await anext(stream) for _ in range(index + 1)]
        await stream.aclose()  # type: ignore[attr-defined]
        where = f"aclose after event {index} ({type(events[index]).__name__})"
        assert not _pending_tasks(), where
        assert tracker.started == tracker.finished | tracker.cancelled, where
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        cancelled_somewhere += bool(tracker.cancelled)
    assert cancelled_somewhere  # some closes landed while tools ran


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
async def test_task_cancel_at_every_event_index_propagates_and_cleans_up(parallel: bool) -> None:
    total = await _full_run_length(parallel)
    cancelled_somewhere = 0
    for index in range(total):
        loop, _, tracker = _sweep_loop(parallel)
        seen: list[AgentEvent] = []

        async def consume(loop: AgentLoop = loop, seen: list[AgentEvent] = seen,
                          index: int = index) -> None:
            async for ev in loop.run([], [UserMessage.of("go")]):
                seen.append(ev)
                if len(seen) == index + 1:
                    task = asyncio.current_task()
                    assert task is not None
                    task.cancel()

        task = asyncio.create_task(consume())
        where = f"cancel at event {index}"
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled(), f"{where}: the cancellation was swallowed"
        assert not _pending_tasks(), where
        assert tracker.started == tracker.finished | tracker.cancelled, where
        cancelled_somewhere += bool(tracker.cancelled)
    assert cancelled_somewhere


# ------------------------------------------------------------------- scripted model


async def _stream(model: ScriptedModel, options: StreamOptions | None = None) -> list[StreamEvent]:
    return [e async for e in model.stream(Request(messages=()), options)]


async def test_scripted_model_streams_arguments_in_fragments_and_reports_usage() -> None:
    usage = Usage(input_tokens=10, output_tokens=4)
    model = ScriptedModel([
        Turn(Call("grep", {"pattern": "x" * 30, "paths": ["a", "b"]}, id="c9", fragments=4),
             usage=usage)
    ])
    events = await _stream(model)
    deltas = [e.delta for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) == 4
    assert "".join(deltas) == '{"pattern":"' + "x" * 30 + '","paths":["a","b"]}'
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.message.stop_reason == "tool_use" and done.message.usage == usage
    assert done.message.tool_calls[0].id == "c9"
    check_stream(events[:-1], done.message)


async def test_scripted_model_replies_from_a_function_and_reports_exhaustion() -> None:
    def echo(request: Request) -> Turn:
        last = request.messages[-1]
        assert isinstance(last, UserMessage)
        return Turn.text(last.text[::-1])

    model = ScriptedModel([echo])
    events = [e async for e in model.stream(Request(messages=(UserMessage.of("abc"),)))]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.message.text == "cba"
    assert model.remaining == 0
    events = await _stream(model)
    assert isinstance(events[0], StartEvent)
    error = events[-1]
    assert isinstance(error, ErrorEvent) and isinstance(error.error, ModelError)
    assert "exhausted after 1 turn" in (error.message.error_message or "")


async def test_scripted_model_honours_abort_during_a_delay() -> None:
    abort = asyncio.Event()
    model = ScriptedModel([Turn(Text("a"), Delay(3600), Text("b"))])
    stream = model.stream(Request(messages=()), StreamOptions(abort=abort))
    seen = []
    async for ev in stream:
        seen.append(ev)
        if isinstance(ev, TextEnd):
            asyncio.get_running_loop().call_soon(abort.set)
    last = seen[-1]
    assert isinstance(last, ErrorEvent) and last.message.stop_reason == "aborted"
    assert last.message.text == "a"
    assert not _pending_tasks()


async def test_scripted_turns_carry_images_through_tool_results() -> None:
    @tool
    def snap() -> list[Any]:
        return [TextPart(text="screen:"), ImagePart(data="aGk=", mime_type="image/png")]

    model = ScriptedModel([Turn.tool_call("snap"), Turn.text("nice")])
    _, end = await collect(AgentLoop(model, [snap]))
    result = end.messages[2]
    assert isinstance(result, ToolResultMessage)
    image = ImagePart(data="aGk=", mime_type="image/png")
    assert result.content == (TextPart(text="screen:"), image)


async def test_check_order_rejects_broken_runs() -> None:
    """The grammar checker itself can fail: mutate a valid run and watch it object."""
    @tool
    def t(n: int) -> str:
        return str(n)

    model = ScriptedModel([Turn.tool_calls(("t", {"n": 1}), ("t", {"n": 2})), Turn.text("ok")])
    events, _ = await collect(AgentLoop(model, [t]))
    results = [i for i, e in enumerate(events)
               if isinstance(e, MessageStart) and isinstance(e.message, ToolResultMessage)]
    swapped = list(events)
    swapped[results[0] : results[0] + 2], swapped[results[1] : results[1] + 2] = (
        events[results[1] : results[1] + 2], events[results[0] : results[0] + 2])
    no_end = [e for e in events if not isinstance(e, ToolExecutionEnd)]
    late_update = [*events[: results[0]], ToolExecutionUpdate("call_0_0", "t", 1),
                   *events[results[0] :]]
    twice = [*events[:-1], *events[1:]]
    for broken in (swapped, no_end, late_update, twice, events[:-1], events[1:]):
        with pytest.raises(AssertionError):
            check_order(broken)
