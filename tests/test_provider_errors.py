"""Provider errors keep their cause and say where they happened.

Each provider has one mapping point from its SDK's and transport's exceptions
to ``ModelError``. The official SDKs talk to the local wire server (or to a
port nobody listens on); the tests check the typed error, its ``__cause__``
chain and that it names provider, model, server and HTTP status. A bug in our
own stream parsing must surface as itself, never as a model failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from support.wire_server import (
    CUT,
    HANG,
    Reply,
    WireServer,
    json_reply,
    sse_data,
    sse_named,
    sse_reply,
)
from threadline.agent import AgentEnd, AgentLoop
from threadline.ai import (
    DoneEvent,
    ErrorEvent,
    ModelInfo,
    Request,
    StreamEvent,
    UserMessage,
)
from threadline.ai.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from threadline.ai.providers._common import Builder, SDKModel, StreamState
from threadline.errors import ModelError, TransientProviderError

HELLO = Request(messages=(UserMessage.of("hi"),))


@dataclass(frozen=True)
class Kind:
    """One provider: its model class, URL suffix, SDK error root and wire replies."""

    name: str
    cls: type[SDKModel]
    suffix: str
    sdk_error: type[Exception]
    connection_error: type[Exception]

    def make(self, url: str, cls: type[SDKModel] | None = None) -> SDKModel:
        info = ModelInfo(provider=self.name.split("-")[0], id="m-test")
        model: SDKModel = (cls or self.cls)(  # type: ignore[call-arg]
            info, api_key="k", base_url=url + self.suffix, max_retries=0)
        return model

    def text_reply(self, text: str, *, tail: Iterable[Any] = ()) -> Reply:
        """A stream that starts a text answer, then ``tail`` (wire markers), then ends."""
        if self.name == "openai-chat":
            first = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": text},
                                  "finish_reason": None}]}
            last = {**first, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            return sse_reply([*sse_data([first], done=False), *tail, *sse_data([last])])
        if self.name == "openai-responses":
            events = [
                {"type": "response.output_item.added", "output_index": 0, "sequence_number": 1,
                 "item": {"type": "message", "id": "msg_1", "role": "assistant",
                          "status": "in_progress", "content": []}},
                {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1",
                 "content_index": 0, "delta": text, "sequence_number": 2, "logprobs": []},
            ]
            done = {"type": "response.completed", "sequence_number": 3, "response": {
                "id": "resp_1", "object": "response", "created_at": 1, "model": "m",
                "status": "completed", "output": [], "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": []}}
            return sse_reply([*sse_data(events, done=False), *tail, *sse_data([done])])
        start = {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m",
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}}
        events = [start,
                  {"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}},
                  {"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": text}}]
        end = [{"type": "content_block_stop", "index": 0},
               {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2}},
               {"type": "message_stop"}]
        return sse_reply([*sse_named(events), *tail, *sse_named(end)])

    def not_json(self) -> bytes:
        if self.name == "anthropic":
            return b"event: content_block_delta\ndata: {not json\n\n"
        return b"data: {not json\n\n"


KINDS = [
    Kind("openai-chat", OpenAIChatModel, "/v1", openai.OpenAIError, openai.APIConnectionError),
    Kind("openai-responses", OpenAIResponsesModel, "/v1", openai.OpenAIError,
         openai.APIConnectionError),
    Kind("anthropic", AnthropicModel, "", anthropic.AnthropicError, anthropic.APIConnectionError),
]

_models: list[SDKModel] = []


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
async def kind(request: pytest.FixtureRequest) -> AsyncIterator[Kind]:
    """Each provider in turn; the models a test made with ``model_for`` are closed after it."""
    yield request.param
    while _models:
        await _models.pop().aclose()


def model_for(kind: Kind, url: str, cls: type[SDKModel] | None = None) -> SDKModel:
    model = kind.make(url, cls)
    _models.append(model)
    return model


async def collect(model: SDKModel) -> list[StreamEvent]:
    return [e async for e in model.stream(HELLO)]


async def failure(model: SDKModel) -> ModelError:
    events = await collect(model)
    last = events[-1]
    assert isinstance(last, ErrorEvent), events
    assert last.error is not None
    assert last.message.error_message == str(last.error)
    return last.error


def causes(exc: BaseException) -> list[BaseException]:
    chain = []
    cur: BaseException | None = exc.__cause__
    while cur is not None:
        chain.append(cur)
        cur = cur.__cause__
    return chain


def refused_url() -> str:
    """A 127.0.0.1 URL whose port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------- mapping


async def test_refused_connection_keeps_its_cause_and_names_the_server(kind: Kind) -> None:
    url = refused_url()
    error = await failure(model_for(kind, url))
    assert type(error) is TransientProviderError
    assert error.base_url == url + kind.suffix
    assert error.provider == kind.name.split("-")[0] and error.model == "m-test"
    text = str(error)
    assert f"{error.provider}:m-test at {url}{kind.suffix}: connection failed: " in text
    assert "Connection error." not in text  # the SDK's wrapper says nothing; its cause does
    chain = causes(error)
    assert isinstance(chain[0], kind.connection_error)
    assert any(isinstance(c, httpx2.ConnectError) for c in chain)
    assert error.__suppress_context__


async def test_http_error_names_status_and_server_and_keeps_the_response(kind: Kind) -> None:
    async with WireServer() as srv:
        srv.reply(json_reply(503, {"type": "error", "error": {
            "type": "overloaded_error", "message": "busy right now"}}))
        error = await failure(model_for(kind, srv.url))
    assert type(error) is TransientProviderError
    assert error.status_code == 503
    assert f"at {srv.url}{kind.suffix}: HTTP 503: busy right now" in str(error)
    assert isinstance(error.__cause__, kind.sdk_error)
    assert error.__cause__.status_code == 503  # type: ignore[attr-defined]


async def test_connection_cut_mid_stream_is_transient_and_keeps_partial_text(kind: Kind) -> None:
    async with WireServer() as srv:
        srv.reply(kind.text_reply("Once upon", tail=[CUT]))
        events = await collect(model_for(kind, srv.url))
    last = events[-1]
    assert isinstance(last, ErrorEvent) and last.error is not None
    assert type(last.error) is TransientProviderError
    assert last.message.text == "Once upon"
    assert "connection failed" in str(last.error) and srv.url in str(last.error)
    assert any(isinstance(c, httpx2.TransportError) for c in causes(last.error))


async def test_event_that_is_not_json_is_a_model_error_with_its_cause(kind: Kind) -> None:
    async with WireServer() as srv:
        srv.reply(kind.text_reply("Hello", tail=[kind.not_json()]))
        error = await failure(model_for(kind, srv.url))
    assert "the server sent an event that is not JSON" in str(error)
    assert srv.url in str(error)
    assert isinstance(error.__cause__, json.JSONDecodeError)


# --------------------------------------------------------------------------- our own bugs


class _Broken:
    """Our stream state with a bug: the first chunk it sees raises ``error``."""

    def __init__(self, inner: StreamState, error: Exception) -> None:
        self.inner = inner
        self.error = error

    def handle(self, event: Any) -> Iterable[StreamEvent]:
        raise self.error

    def finish(self) -> list[StreamEvent]:
        return self.inner.finish()


def broken(kind: Kind, error: Exception) -> type[SDKModel]:
    base: Any = kind.cls

    class BrokenModel(base):  # type: ignore[misc]
        def _state(self, builder: Builder) -> StreamState:
            return _Broken(super()._state(builder), error)

    return BrokenModel


@pytest.mark.parametrize("bug", [KeyError("index"), AttributeError("'NoneType' has no 'x'")],
                         ids=["KeyError", "AttributeError"])
async def test_bug_in_stream_state_propagates_as_itself(kind: Kind, bug: Exception) -> None:
    async with WireServer() as srv:
        srv.reply(kind.text_reply("Hello", tail=[HANG]))
        model = model_for(kind, srv.url, broken(kind, bug))
        with pytest.raises(type(bug)) as caught:
            await collect(model)
        assert caught.value is bug
        # The HTTP stream is still closed on the way out.
        await asyncio.wait_for(srv.disconnected.wait(), 30)


async def test_bug_in_stream_state_reaches_the_agent_loop_as_itself(kind: Kind) -> None:
    bug = KeyError("index")
    async with WireServer() as srv:
        srv.reply(kind.text_reply("Hello"))
        loop = AgentLoop(model_for(kind, srv.url, broken(kind, bug)))
        events = [e async for e in loop.run([], [UserMessage.of("hi")])]
    end = events[-1]
    assert isinstance(end, AgentEnd)
    assert end.error is bug and not isinstance(end.error, ModelError)


# --------------------------------------------------------------------------- closing


class _FailingClose:
    """The SDK's stream, whose ``close`` closes it and then raises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __anext__(self) -> Any:
        return self.inner.__anext__()

    async def close(self) -> None:
        await self.inner.close()
        raise RuntimeError("close failed")


def failing_close(kind: Kind) -> type[SDKModel]:
    base: Any = kind.cls

    class FailingCloseModel(base):  # type: ignore[misc]
        async def _create(self, body: dict[str, Any]) -> Any:
            return _FailingClose(await super()._create(body))

    return FailingCloseModel


async def test_error_closing_the_sdk_stream_is_logged(
    kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="threadline.ai.providers._common")
    async with WireServer() as srv:
        srv.reply(kind.text_reply("Hello"))
        events = await collect(model_for(kind, srv.url, failing_close(kind)))
    assert isinstance(events[-1], DoneEvent)  # the answer is complete all the same
    (record,) = [r for r in caplog.records if r.name == "threadline.ai.providers._common"]
    assert record.levelno == logging.WARNING
    assert "closing the response stream failed" in record.getMessage()
    assert srv.url in record.getMessage()
    assert record.exc_info is not None and str(record.exc_info[1]) == "close failed"


# --------------------------------------------------------------------------- extras

_MISSING_EXTRA = r"""
import json, sys
blocked, code = sys.argv[1], sys.argv[2]
sys.modules[blocked] = None  # makes "import <blocked>" raise ImportError
from threadline.errors import ConfigError
try:
    exec(code)
except ConfigError as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc),
                      "cause_is_import_error": isinstance(exc.__cause__, ImportError)}))
"""


@pytest.mark.parametrize(("blocked", "code", "needed_by", "extra"), [
    ("httpx2", "from threadline.ai.providers import OpenAIChatModel",
     "the OpenAI providers", "openai"),
    ("openai", "from threadline.ai import get_model; get_model('openai:gpt-x', api_key='k')",
     "the OpenAI providers", "openai"),
    ("anthropic", "from threadline.ai.providers import AnthropicModel",
     "the Anthropic provider", "anthropic"),
    ("psycopg", "from threadline.session import PostgresStore", "PostgresStore", "postgres"),
    ("psycopg_pool", "from threadline.session import PostgresStore", "PostgresStore", "postgres"),
    ("psycopg", "from threadline.stores import open_store; open_store('postgresql://h/db')",
     "store URL 'postgresql://h/db'", "postgres"),
], ids=["old-openai-sdk", "get_model", "anthropic", "psycopg", "psycopg-pool", "store-url"])
def test_missing_extra_is_one_config_error_naming_the_extra(
    blocked: str, code: str, needed_by: str, extra: str
) -> None:
    out = subprocess.run([sys.executable, "-c", _MISSING_EXTRA, blocked, code],
                         capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout)
    assert result == {
        "type": "ConfigError",
        "message": f"{needed_by}: the {extra!r} extra is missing or too old (cannot import "
                   f"{blocked!r}); pip install -U 'threadline[{extra}]'",
        "cause_is_import_error": True,
    }
