"""OpenAI Chat Completions and Responses providers against a real local HTTP server.

The official ``openai`` SDK talks to ``WireServer`` over TCP; the server
replays the documented wire format chunk by chunk and records each request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from support.providers import (
    R_USAGE,
    REASONING_ITEM,
    RESPONSES_TOOL_TURN,
    chunk,
    ev,
    response_obj,
)
from support.wire_server import HANG, Reply, WireServer, json_reply, sse_data, sse_reply
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
    ThinkingPart,
    ToolCall,
    ToolCallEnd,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from threadline.ai.providers._common import INVALID_ARGUMENTS_KEY
from threadline.ai.providers._openai_chat import OpenAIChatModel, to_chat_messages
from threadline.ai.providers._openai_responses import OpenAIResponsesModel
from threadline.errors import (
    AuthenticationError,
    ContextOverflowError,
    ModelError,
    RateLimitError,
    TransientProviderError,
)

INFO = ModelInfo(provider="openai", id="gpt-test", images=True)
WEATHER = ToolSpec("weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
HELLO = Request(messages=(UserMessage.of("hi"),), system="be brief")


_models: list[Any] = []


@pytest.fixture(autouse=True)
async def _close_models() -> Any:
    yield
    while _models:
        await _models.pop().aclose()


def chat(server: WireServer, info: ModelInfo = INFO, retries: int = 0) -> OpenAIChatModel:
    model = OpenAIChatModel(info, api_key="sk-test", base_url=server.url + "/v1",
                            max_retries=retries)
    _models.append(model)
    return model


USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
         "prompt_tokens_details": {"cached_tokens": 60},
         "completion_tokens_details": {"reasoning_tokens": 5}}


async def collect(model: Any, request: Request = HELLO,
                  options: StreamOptions | None = None) -> list[StreamEvent]:
    return [e async for e in model.stream(request, options)]


def kinds(events: list[StreamEvent]) -> list[str]:
    return [e.type for e in events]


def final(events: list[StreamEvent]) -> AssistantMessage:
    last = events[-1]
    assert isinstance(last, DoneEvent | ErrorEvent)
    return last.message


# --------------------------------------------------------------------------- chat: streams


async def test_chat_plain_text_usage_and_request() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}), chunk({"content": "lo!"}),
            chunk({}, finish="stop"), chunk(usage=USAGE),
        ])))
        events = await collect(chat(srv), HELLO, StreamOptions(max_tokens=50, temperature=0.2))
    assert kinds(events) == ["start", "text_start", "text_delta", "text_delta", "text_end", "done"]
    msg = final(events)
    assert msg.text == "Hello!"
    assert msg.stop_reason == "stop"
    assert (msg.provider, msg.api, msg.model, msg.response_id) == (
        "openai", "openai-chat", "gpt-test", "chatcmpl-1")
    # prompt_tokens counts the cached ones; ours keeps them apart.
    assert msg.usage.input_tokens == 40
    assert msg.usage.cache_read_tokens == 60
    assert msg.usage.output_tokens == 20
    assert msg.usage.reasoning_tokens == 5
    req = srv.received[0]
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.body["model"] == "gpt-test"
    assert req.body["stream"] is True
    assert req.body["stream_options"] == {"include_usage": True}
    assert req.body["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert req.body["max_completion_tokens"] == 50
    assert req.body["temperature"] == 0.2


async def test_chat_parallel_tool_calls_assembled_from_fragments() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function",
                 "function": {"name": "weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Pa'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                   "function": {"name": "weather", "arguments": '{"city"'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': "Oslo"}'}}]}),
            chunk({}, finish="tool_calls"), chunk(usage=USAGE),
        ])))
        events = await collect(chat(srv), HELLO.__class__(
            messages=HELLO.messages, tools=(WEATHER,)))
    assert kinds(events) == [
        "start", "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_delta",
        "toolcall_end", "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_end",
        "done"]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert [(e.index, e.tool_call.id, e.tool_call.arguments) for e in ends] == [
        (0, "call_a", {"city": "Paris"}), (1, "call_b", {"city": "Oslo"})]
    msg = final(events)
    assert msg.stop_reason == "tool_use"
    assert msg.tool_calls == tuple(e.tool_call for e in ends)
    assert srv.received[0].body["tools"] == [{"type": "function", "function": {
        "name": "weather", "description": "Weather for a city",
        "parameters": WEATHER.parameters}}]


async def test_chat_whole_tool_calls_without_index() -> None:
    """Some compatible servers send each call complete, in one chunk, with no index."""
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({"tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "weather", "arguments": '{"city": "Rome"}'}},
                {"id": "c2", "type": "function",
                 "function": {"name": "weather", "arguments": '{"city": "Bern"}'}}]}),
            chunk({}, finish="stop"),
        ])))
        msg = final(await collect(chat(srv)))
    assert [(c.id, c.arguments) for c in msg.tool_calls] == [
        ("c1", {"city": "Rome"}), ("c2", {"city": "Bern"})]
    assert msg.stop_reason == "tool_use"  # the server said "stop"


async def test_chat_malformed_arguments_kept_as_text() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "weather", "arguments": '{"city": '}}]}),
            chunk({}, finish="tool_calls"),
        ])))
        msg = final(await collect(chat(srv)))
    assert msg.tool_calls[0].arguments == {INVALID_ARGUMENTS_KEY: '{"city": '}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_chat_reasoning_fields_become_thinking_and_go_back(field: str) -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({field: "Let me "}), chunk({field: "think."}),
            chunk({"content": "42"}), chunk({}, finish="stop"),
        ])))
        events = await collect(chat(srv))
        msg = final(events)
        assert kinds(events)[1:4] == ["thinking_start", "thinking_delta", "thinking_delta"]
        assert msg.content[0] == ThinkingPart(
            thinking="Let me think.", signature=field, provider="openai")
        assert msg.text == "42"

        # The same model gets its reasoning back in the field it came in.
        srv.reply(sse_reply(sse_data([chunk({"content": "ok"}), chunk({}, finish="stop")])))
        await collect(chat(srv), Request(messages=(UserMessage.of("q"), msg,
                                                   UserMessage.of("and?"))))
    sent = srv.received[1].body["messages"][1]
    assert sent == {"role": "assistant", field: "Let me think.", "content": "42"}


async def test_chat_mid_stream_error_keeps_partial_text() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            chunk({"content": "partial"}),
            {"error": {"message": "The server had an error", "type": "server_error"}},
        ], done=False)))
        events = await collect(chat(srv))
    assert kinds(events) == ["start", "text_start", "text_delta", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)
    assert last.message.stop_reason == "error"
    assert last.message.text == "partial"
    assert "The server had an error" in (last.message.error_message or "")


async def test_chat_stream_cut_without_finish_reason_is_transient() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([chunk({"content": "The answer is"})], done=False)))
        last = (await collect(chat(srv)))[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)
    assert last.message.text == "The answer is"


# --------------------------------------------------------------------------- errors


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@pytest.mark.parametrize(("reply", "cls"), [
    (json_reply(401, error_body("Incorrect API key provided", "invalid_request_error",
                                "invalid_api_key")), AuthenticationError),
    (json_reply(403, error_body("Project does not have access", "invalid_request_error")),
     AuthenticationError),
    (json_reply(400, error_body(
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130512 tokens.", "invalid_request_error", "context_length_exceeded")),
     ContextOverflowError),
    # llama.cpp server's wording, without a code
    (json_reply(400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                "message": "the request exceeds the available context size"}}),
     ContextOverflowError),
    (json_reply(500, error_body("The server had an error", "server_error")),
     TransientProviderError),
    (json_reply(503, error_body("Service unavailable", "server_error")), TransientProviderError),
    (json_reply(404, error_body("The model `nope` does not exist", "invalid_request_error",
                                "model_not_found")), ModelError),
])
async def test_chat_http_errors_are_typed(reply: Reply, cls: type[ModelError]) -> None:
    async with WireServer() as srv:
        srv.reply(reply)
        events = await collect(chat(srv))
    assert kinds(events) == ["start", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert type(last.error) is cls
    assert last.error.status_code == reply.status
    assert last.error.provider == "openai"
    assert last.error.model == "gpt-test"
    assert last.message.stop_reason == "error"


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "7"}, 7.0), ({"retry-after-ms": "1500"}, 1.5), ({}, None)])
async def test_chat_429_carries_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    async with WireServer() as srv:
        srv.reply(json_reply(429, error_body("Rate limit reached for requests", "requests",
                                             "rate_limit_exceeded"), headers))
        events = await collect(chat(srv))
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, RateLimitError)
    assert last.error.retry_after == seconds
    assert len(srv.received) == 1  # max_retries=0: no hidden retry


async def test_chat_sdk_retries_are_configurable() -> None:
    async with WireServer() as srv:
        srv.reply(
            json_reply(503, error_body("busy", "server_error"), {"retry-after-ms": "1"}),
            sse_reply(sse_data([chunk({"content": "ok"}), chunk({}, finish="stop")])),
        )
        msg = final(await collect(chat(srv, retries=1)))
    assert msg.text == "ok"
    assert len(srv.received) == 2


async def test_chat_connection_refused_is_transient() -> None:
    async with WireServer() as srv:
        url = srv.url
    model = OpenAIChatModel(INFO, api_key="k", base_url=url + "/v1", max_retries=0)
    _models.append(model)
    last = (await collect(model))[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)


# --------------------------------------------------------------------------- cancellation


async def test_chat_abort_mid_stream_closes_connection() -> None:
    abort = asyncio.Event()
    async with WireServer() as srv:
        srv.reply(sse_reply([*sse_data([chunk({"content": "Once upon"})], done=False), HANG]))
        events: list[StreamEvent] = []
        async for event in chat(srv).stream(HELLO, StreamOptions(abort=abort)):
            events.append(event)
            if event.type == "text_delta":
                abort.set()
        await asyncio.wait_for(srv.disconnected.wait(), 5)
    assert kinds(events) == ["start", "text_start", "text_delta", "error"]
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.error is None
    assert last.message.stop_reason == "aborted"
    assert last.message.text == "Once upon"


async def test_chat_abort_before_first_byte() -> None:
    abort = asyncio.Event()
    async with WireServer() as srv:
        srv.reply(Reply(headers={"content-type": "text/event-stream"}, chunks=[HANG]))
        stream = chat(srv).stream(HELLO, StreamOptions(abort=abort))
        assert (await anext(stream)).type == "start"
        waiting = asyncio.ensure_future(anext(stream))
        # Abort once the request is in: not after a fixed pause, which a slow
        # first request (the client's lazy imports) can outlast.
        while not srv.received:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        abort.set()
        last = await asyncio.wait_for(waiting, 5)
        await asyncio.wait_for(srv.disconnected.wait(), 5)
    assert isinstance(last, ErrorEvent)
    assert last.message.stop_reason == "aborted"


async def test_chat_closing_the_iterator_closes_connection() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply([*sse_data([chunk({"content": "a"})], done=False), HANG]))
        stream = chat(srv).stream(HELLO)
        async for event in stream:
            if event.type == "text_delta":
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(srv.disconnected.wait(), 5)


# --------------------------------------------------------------------------- transcripts

PNG = ImagePart(data="iVBORw0KGgo=", mime_type="image/png")


def foreign_transcript() -> tuple[AssistantMessage, ToolResultMessage, ToolResultMessage]:
    """A turn recorded by Anthropic: signed thinking, redacted thinking, long odd ids."""
    long_id = "toolu_" + "x" * 50
    odd_id = "call_1|fc_" + "y" * 60
    assistant = AssistantMessage(
        content=(
            ThinkingPart(thinking="plan the calls", signature="sig-abc", provider="anthropic"),
            ThinkingPart(thinking="", signature="opaque", redacted=True, provider="anthropic"),
            TextPart(text="Checking."),
            ToolCall(id=long_id, name="weather", arguments={"city": "Paris"}),
            ToolCall(id=odd_id, name="shot", arguments={}),
        ),
        model="claude-x", provider="anthropic", api="anthropic-messages", stop_reason="tool_use",
    )
    r1 = ToolResultMessage(tool_call_id=long_id, tool_name="weather",
                           content=(TextPart(text="sunny"),))
    r2 = ToolResultMessage(tool_call_id=odd_id, tool_name="shot",
                           content=(TextPart(text="here"), PNG))
    return assistant, r1, r2


def test_chat_transcript_from_another_provider() -> None:
    assistant, r1, r2 = foreign_transcript()
    out = to_chat_messages("sys", [UserMessage.of("look", PNG), assistant, r1, r2,
                                   UserMessage.of("thanks")], INFO)
    assert out[0] == {"role": "system", "content": "sys"}
    assert out[1] == {"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
    a = out[2]
    # Foreign thinking becomes text; redacted thinking is dropped.
    assert a["content"] == "plan the calls\n\nChecking."
    ids = [c["id"] for c in a["tool_calls"]]
    assert all(len(i) <= 40 for i in ids)
    assert len(set(ids)) == 2
    assert [c["function"]["arguments"] for c in a["tool_calls"]] == ['{"city":"Paris"}', "{}"]
    assert [(m["role"], m["tool_call_id"]) for m in out[3:5]] == [("tool", i) for i in ids]
    assert out[4]["content"] == "here"
    # Images from a tool result follow the tool messages as a user message.
    assert out[5]["role"] == "user"
    assert out[5]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert out[6] == {"role": "user", "content": "thanks"}


def test_chat_images_replaced_for_text_only_models() -> None:
    text_only = ModelInfo(provider="ollama", id="llama3.2", images=False)
    out = to_chat_messages(None, [UserMessage.of("look", PNG)], text_only)
    assert out == [{"role": "user", "content": "look\n(image omitted: this model does not "
                    "accept images)"}]


async def test_chat_request_body_with_tool_results() -> None:
    call = ToolCall(id="call_a", name="weather", arguments={"city": "Paris"})
    transcript = (
        UserMessage.of("weather?"),
        AssistantMessage(content=(call,), model="gpt-test", provider="openai",
                         api="openai-chat", stop_reason="tool_use"),
        ToolResultMessage(tool_call_id="call_a", tool_name="weather",
                          content=(TextPart(text="sunny"),)),
    )
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([chunk({"content": "Sunny."}), chunk({}, finish="stop")])))
        await collect(chat(srv), Request(messages=transcript, tools=(WEATHER,)))
    assert srv.received[0].body["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    ]


# --------------------------------------------------------------------------- responses


def responses(server: WireServer, info: ModelInfo | None = None) -> OpenAIResponsesModel:
    model = OpenAIResponsesModel(
        info or ModelInfo(provider="openai", id="o-test", reasoning=True),
        api_key="sk-test", base_url=server.url + "/v1", max_retries=0)
    _models.append(model)
    return model


async def test_responses_reasoning_and_parallel_calls_round_trip() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data(RESPONSES_TOOL_TURN, done=False)))
        model = responses(srv)
        events = await collect(model, Request(messages=HELLO.messages, system="sys",
                                              tools=(WEATHER,)))
        assert kinds(events) == [
            "start", "thinking_start", "thinking_delta", "thinking_delta", "thinking_end",
            "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_end",
            "toolcall_start", "toolcall_delta", "toolcall_end", "done"]
        msg = final(events)
        assert msg.stop_reason == "tool_use"
        assert msg.response_id == "resp_1"
        thinking = msg.content[0]
        assert isinstance(thinking, ThinkingPart)
        assert thinking.thinking == "Two cities."
        assert thinking.provider == "openai"
        assert json.loads(thinking.signature or "") == REASONING_ITEM
        assert [(c.id, c.arguments) for c in msg.tool_calls] == [
            ("call_1|fc_1", {"city": "Paris"}), ("call_2|fc_2", {"city": "Oslo"})]
        assert msg.usage.input_tokens == 30
        assert msg.usage.cache_read_tokens == 20
        assert msg.usage.reasoning_tokens == 12

        first = srv.received[0]
        assert first.path == "/v1/responses"
        assert first.body["instructions"] == "sys"
        assert first.body["store"] is False
        assert first.body["include"] == ["reasoning.encrypted_content"]
        assert first.body["tools"] == [{"type": "function", "name": "weather",
                                        "description": "Weather for a city",
                                        "parameters": WEATHER.parameters, "strict": False}]

        results = tuple(
            ToolResultMessage(tool_call_id=c.id, tool_name=c.name,
                              content=(TextPart(text=f"sunny in {c.arguments['city']}"),))
            for c in msg.tool_calls)
        srv.reply(sse_reply(sse_data([
            ev("response.output_item.added", 0, output_index=0, item={
                "type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
                "content": []}),
            ev("response.output_text.delta", 1, item_id="msg_1", output_index=0,
               content_index=0, delta="Sunny both.", logprobs=[]),
            ev("response.output_item.done", 2, output_index=0, item={
                "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "Sunny both.", "annotations": []}]}),
            ev("response.completed", 3, response=response_obj(usage=R_USAGE)),
        ], done=False)))
        second = final(await collect(model, Request(messages=(*HELLO.messages, msg, *results))))
        assert second.text == "Sunny both."
    sent = srv.received[1].body["input"]
    assert sent[0] == {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    assert sent[1] == REASONING_ITEM  # sent back whole, encrypted content included
    assert sent[2] == {"type": "function_call", "call_id": "call_1", "name": "weather",
                       "arguments": '{"city":"Paris"}', "id": "fc_1"}
    assert sent[3]["id"] == "fc_2"
    assert sent[4:] == [
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Paris"},
        {"type": "function_call_output", "call_id": "call_2", "output": "sunny in Oslo"}]


async def test_responses_text_incomplete_is_length() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            ev("response.output_item.added", 0, output_index=0, item={
                "type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
                "content": []}),
            ev("response.output_text.delta", 1, item_id="msg_1", output_index=0,
               content_index=0, delta="Once", logprobs=[]),
            ev("response.incomplete", 2, response=response_obj(
                "incomplete", incomplete_details={"reason": "max_output_tokens"})),
        ], done=False)))
        msg = final(await collect(responses(srv, INFO)))
    assert msg.stop_reason == "length"
    assert msg.text == "Once"
    assert "reasoning" not in srv.received[0].body  # not a reasoning model


@pytest.mark.parametrize(("event", "cls"), [
    (ev("response.failed", 1, response=response_obj("failed", error={
        "code": "context_length_exceeded",
        "message": "Your input exceeds the context window of this model."})),
     ContextOverflowError),
    (ev("error", 1, code="rate_limit_exceeded", message="Rate limit reached", param=None),
     RateLimitError),
    (ev("response.failed", 1, response=response_obj("failed", error={
        "code": "server_error", "message": "An error occurred while processing."})),
     TransientProviderError),
])
async def test_responses_errors_in_stream_are_typed(event: dict[str, Any],
                                                    cls: type[ModelError]) -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([
            ev("response.created", 0, response=response_obj("in_progress")), event], done=False)))
        last = (await collect(responses(srv)))[-1]
    assert isinstance(last, ErrorEvent)
    assert type(last.error) is cls


async def test_responses_truncated_stream_is_an_error() -> None:
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data(RESPONSES_TOOL_TURN[:7], done=False)))
        last = (await collect(responses(srv)))[-1]
    assert isinstance(last, ErrorEvent)
    assert isinstance(last.error, TransientProviderError)
    # Finished blocks survive; the half-streamed call is not offered for execution.
    assert isinstance(last.message.content[0], ThinkingPart)
    assert last.message.tool_calls == ()


async def test_responses_abort_mid_stream() -> None:
    abort = asyncio.Event()
    async with WireServer() as srv:
        srv.reply(sse_reply([*sse_data(RESPONSES_TOOL_TURN[:3], done=False), HANG]))
        events = []
        async for e in responses(srv).stream(HELLO, StreamOptions(abort=abort)):
            events.append(e)
            if e.type == "thinking_delta":
                abort.set()
        await asyncio.wait_for(srv.disconnected.wait(), 5)
    last = events[-1]
    assert isinstance(last, ErrorEvent)
    assert last.message.stop_reason == "aborted"


def test_responses_transcript_from_another_provider() -> None:
    from threadline.ai.providers._openai_responses import to_response_input

    assistant, r1, r2 = foreign_transcript()
    out = to_response_input([assistant, r1, r2], INFO)
    assert out[0] == {"type": "message", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": "plan the calls\n\nChecking.",
                                   "annotations": []}]}
    calls, results = out[1:3], out[3:]
    assert [c["type"] for c in calls] == ["function_call"] * 2
    assert all("id" not in c for c in calls)  # foreign item ids are never sent
    assert [c["call_id"] for c in calls] == [r["call_id"] for r in results]
    assert calls[1]["call_id"] == "call_1"
    assert results[1]["output"][1] == {"type": "input_image", "detail": "auto",
                                       "image_url": "data:image/png;base64,iVBORw0KGgo="}
