"""The Anthropic Messages provider against a real local HTTP server.

The official ``anthropic`` SDK talks to ``WireServer`` over TCP; the server
replays named server-sent events chunk by chunk and records each request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.providers import (
    ANTHROPIC_TOOL_TURN,
    anthropic_text_turn,
    block_start,
    delta,
    message_end,
    message_start,
    stop,
)
from support.wire_server import HANG, Reply, WireServer, json_reply, sse_named, sse_reply
from threadline.ai import (
    AssistantMessage,
    DoneEvent,
    ErrorEvent,
    ImagePart,
    ModelInfo,
    Request,
    StreamEvent,
    StreamOptions,
    TextPart,
    ThinkingEnd,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from threadline.ai.providers._anthropic import AnthropicModel, to_anthropic_messages
from threadline.errors import (
    AuthenticationError,
    ContextOverflowError,
    ModelError,
    RateLimitError,
    TransientProviderError,
)

INFO = ModelInfo(provider="anthropic", id="claude-test", images=True, reasoning=True,
                 max_output_tokens=4096)
WEATHER = ToolSpec("weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
HELLO = Request(messages=(UserMessage.of("hi"),), system="be brief")

_models: list[AnthropicModel] = []


@pytest.fixture(autouse=True)
async def _close_models() -> Any:
    yield
    while _models:
        await _models.pop().aclose()


def claude(server: WireServer, retries: int = 0) -> AnthropicModel:
    model = AnthropicModel(INFO, api_key="sk-ant-test", base_url=server.url, max_retries=retries)
    _models.append(model)
    return model


async def collect(model: AnthropicModel, request: Request = HELLO,
                  options: StreamOptions | None = None) -> list[StreamEvent]:
    return [e async for e in model.stream(request, options)]


def kinds(events: list[StreamEvent]) -> list[str]:
    return [e.type for e in events]


def final(events: list[StreamEvent]) -> AssistantMessage:
    last = events[-1]
    assert isinstance(last, DoneEvent | ErrorEvent)
    return last.message


async def test_plain_text_usage_and_request() -> None:
    async with WireServer() as srv:
        srv.reply(anthropic_text_turn("Hello!"))
        events = await collect(claude(srv), HELLO, StreamOptions(temperature=0.3))
    assert kinds(events) == ["start", "text_start", "text_delta", "text_end", "done"]
    msg = final(events)
    assert msg.text == "Hello!"
    assert (msg.stop_reason, msg.api, msg.response_id) == ("stop", "anthropic-messages", "msg_1")
    assert msg.usage.input_tokens == 12
    assert msg.usage.cache_read_tokens == 300
    assert msg.usage.cache_write_tokens == 40
    assert msg.usage.output_tokens == 50
    req = srv.received[0]
    assert (req.method, req.path) == ("POST", "/v1/messages")
    # This SDK version sends the key as a bearer token; older ones used x-api-key.
    bearer = req.headers.get("authorization", "").removeprefix("Bearer ")
    key = req.headers.get("x-api-key") or bearer
    assert key == "sk-ant-test"
    assert "anthropic-version" in req.headers
    assert req.body["stream"] is True
    assert req.body["max_tokens"] == 4096
    assert req.body["temperature"] == 0.3
    assert req.body["system"] == [
        {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    assert req.body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]


async def test_thinking_signatures_and_parallel_tool_use_round_trip() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(ANTHROPIC_TOOL_TURN))
        model = claude(srv)
        events = await collect(model, Request(messages=HELLO.messages, tools=(WEATHER,)),
                               StreamOptions(reasoning_effort="low", temperature=0.5))
        assert kinds(events) == [
            "start", "thinking_start", "thinking_delta", "thinking_delta", "thinking_end",
            "thinking_start", "thinking_end", "text_start", "text_delta", "text_end",
            "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_end",
            "toolcall_start", "toolcall_delta", "toolcall_end", "done"]
        ends = [e for e in events if isinstance(e, ThinkingEnd)]
        assert ends[0].signature == "EqQBCkYIARgC"
        msg = final(events)
        assert msg.stop_reason == "tool_use"
        assert msg.usage.output_tokens == 88
        assert msg.content[0] == ThinkingPart(
            thinking="Two cities, two calls.", signature="EqQBCkYIARgC", provider="anthropic")
        assert msg.content[1] == ThinkingPart(
            thinking="", signature="EmwKAhgBEgy3va3pzix/LafPsn4a", redacted=True,
            provider="anthropic")
        assert [(c.id, c.arguments) for c in msg.tool_calls] == [
            ("toolu_01A", {"city": "Paris"}), ("toolu_01B", {"city": "Oslo"})]

        first = srv.received[0].body
        assert first["thinking"] == {"type": "enabled", "budget_tokens": 4096}
        assert first["max_tokens"] > 4096
        assert "temperature" not in first  # not allowed with thinking
        assert first["tools"] == [{"name": "weather", "description": "Weather for a city",
                                   "input_schema": WEATHER.parameters}]

        results = [ToolResultMessage(tool_call_id=c.id, tool_name=c.name,
                                     content=(TextPart(text="sunny"),)) for c in msg.tool_calls]
        srv.reply(anthropic_text_turn("Both sunny."))
        second = final(await collect(model, Request(messages=(*HELLO.messages, msg, *results))))
        assert second.text == "Both sunny."
    sent = srv.received[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == [
        {"type": "thinking", "thinking": "Two cities, two calls.", "signature": "EqQBCkYIARgC"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
        {"type": "text", "text": "Checking both."},
        {"type": "tool_use", "id": "toolu_01A", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_01B", "name": "weather", "input": {"city": "Oslo"}},
    ]
    # Both results ride in one user turn; the last block carries the cache breakpoint.
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01A", "is_error": False,
         "content": [{"type": "text", "text": "sunny"}]},
        {"type": "tool_result", "tool_use_id": "toolu_01B", "is_error": False,
         "content": [{"type": "text", "text": "sunny"}],
         "cache_control": {"type": "ephemeral"}},
    ]


async def test_mid_stream_overloaded_error() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_named([
            message_start(), block_start(0, {"type": "text", "text": ""}),
            delta(0, {"type": "text_delta", "text": "Part"}),
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ])))
        events = await collect(claude(srv))
    assert kinds(events) == ["start", "text_start", "text_delta", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)
    assert last.message.text == "Part"
    assert last.message.stop_reason == "error"
    assert "Overloaded" in (last.message.error_message or "")


async def test_stream_cut_before_message_stop_is_transient() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_named(TOOL_TURN_EVENTS[:12])))
        last = (await collect(claude(srv)))[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)
    assert last.message.tool_calls == ()  # the half-streamed call is not offered


TOOL_TURN_EVENTS: list[Any] = [
    message_start(),
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "hmm"}),
    delta(0, {"type": "signature_delta", "signature": "sig"}),
    stop(0),
    block_start(1, {"type": "text", "text": "ok"}),
    stop(1),
    block_start(2, {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
    delta(2, {"type": "input_json_delta", "partial_json": '{"ci'}),
    delta(2, {"type": "input_json_delta", "partial_json": 'ty": '}),
    delta(2, {"type": "input_json_delta", "partial_json": '"Rome"}'}),
    {"type": "ping"},
    stop(2),
    *message_end("tool_use"),
]


def api_error(status: int, type_: str, message: str,
              headers: dict[str, str] | None = None) -> Reply:
    return json_reply(status, {"type": "error", "error": {"type": type_, "message": message},
                               "request_id": "req_1"}, headers)


@pytest.mark.parametrize(("reply", "cls"), [
    (api_error(401, "authentication_error", "invalid x-api-key"), AuthenticationError),
    (api_error(403, "permission_error", "no access to this model"), AuthenticationError),
    (api_error(400, "invalid_request_error", "prompt is too long: 213000 tokens > 200000 maximum"),
     ContextOverflowError),
    (api_error(500, "api_error", "Internal server error"), TransientProviderError),
    (api_error(529, "overloaded_error", "Overloaded"), TransientProviderError),
    (api_error(400, "invalid_request_error", "messages: field required"), ModelError),
])
async def test_http_errors_are_typed(reply: Reply, cls: type[ModelError]) -> None:
    async with WireServer() as srv:
        srv.reply(reply)
        events = await collect(claude(srv))
    assert kinds(events) == ["start", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert type(last.error) is cls
    assert last.error.status_code == reply.status
    assert (last.error.provider, last.error.model) == ("anthropic", "claude-test")


async def test_429_carries_retry_after() -> None:
    async with WireServer() as srv:
        srv.reply(api_error(429, "rate_limit_error", "Number of request tokens has exceeded "
                            "your per-minute rate limit", {"retry-after": "13"}))
        last = (await collect(claude(srv)))[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, RateLimitError)
    assert last.error.retry_after == 13.0
    assert len(srv.received) == 1


async def test_abort_mid_stream_closes_connection() -> None:
    abort = asyncio.Event()
    async with WireServer() as srv:
        srv.reply(sse_reply([*sse_named(TOOL_TURN_EVENTS[:3]), HANG]))
        events: list[StreamEvent] = []
        async for event in claude(srv).stream(HELLO, StreamOptions(abort=abort)):
            events.append(event)
            if event.type == "thinking_delta":
                abort.set()
        await asyncio.wait_for(srv.disconnected.wait(), 5)
    assert kinds(events) == ["start", "thinking_start", "thinking_delta", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.message.stop_reason == "aborted"
    assert last.message.error_message == "aborted"


async def test_cancelled_consumer_closes_connection() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply([*sse_named(TOOL_TURN_EVENTS[:3]), HANG]))
        seen = asyncio.Event()

        async def consume() -> None:
            async for event in claude(srv).stream(HELLO):
                if event.type == "thinking_delta":
                    seen.set()

        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(seen.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(srv.disconnected.wait(), 5)


# --------------------------------------------------------------------------- transcripts

PNG = ImagePart(data="iVBORw0KGgo=", mime_type="image/png")


def test_transcript_from_openai() -> None:
    odd_id = "call_1|fc_" + "y" * 70
    dotted = "call.with:odd/chars"
    assistant = AssistantMessage(
        content=(
            ThinkingPart(thinking="reasoned", signature='{"id":"rs_1"}', provider="openai"),
            ThinkingPart(thinking="", signature='{"id":"rs_2"}', redacted=True,
                         provider="openai"),
            TextPart(text=""),
            ToolCall(id=odd_id, name="shot", arguments={}),
            ToolCall(id=dotted, name="weather", arguments={"city": "Rome"}),
        ),
        model="o-test", provider="openai", api="openai-responses", stop_reason="tool_use")
    results = [
        ToolResultMessage(tool_call_id=odd_id, tool_name="shot",
                          content=(TextPart(text="here"), PNG)),
        ToolResultMessage(tool_call_id=dotted, tool_name="weather", is_error=True),
    ]
    out = to_anthropic_messages(
        [UserMessage.of("a"), UserMessage.of("b"), assistant, *results, UserMessage.of("c")],
        INFO)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[0]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    blocks = out[1]["content"]
    # Foreign reasoning turns into text; the redacted one and the empty text vanish.
    assert blocks[0] == {"type": "text", "text": "reasoned"}
    ids = [b["id"] for b in blocks[1:]]
    assert ids[0] == "call_1"
    assert len(ids[1]) <= 64
    assert all(c.isalnum() or c in "_-" for i in ids for c in i)
    turn = out[2]["content"]
    assert [b.get("tool_use_id") for b in turn] == [*ids, None]
    assert turn[0]["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    assert turn[1]["is_error"] is True
    assert turn[1]["content"] == [{"type": "text", "text": "(no output)"}]
    assert turn[2] == {"type": "text", "text": "c"}


def test_signatures_only_go_back_to_the_model_that_made_them() -> None:
    made = AssistantMessage(
        content=(ThinkingPart(thinking="t", signature="sig", provider="anthropic"),
                 ThinkingPart(thinking="", signature="data", redacted=True,
                              provider="anthropic"),
                 TextPart(text="x")),
        model="claude-other", provider="anthropic", api="anthropic-messages")
    out = to_anthropic_messages([UserMessage.of("q"), made], INFO)
    assert out[1]["content"] == [{"type": "text", "text": "t"}, {"type": "text", "text": "x"}]
