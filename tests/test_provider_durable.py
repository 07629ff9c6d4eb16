"""Full durable runs with tools over each real provider SDK.

Each run goes: user input -> the model asks for two tools in parallel -> the
tools run -> the model answers. The model is the official SDK talking to the
local wire server; the session lives in a real JSONL file, is reopened from
disk, and continues on a different provider.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.providers import ANTHROPIC_TOOL_TURN, RESPONSES_TOOL_TURN, chunk, ev, response_obj
from support.providers import anthropic_text_turn as anthropic_text
from support.wire_server import Reply, WireServer, sse_data, sse_reply
from threadline import durable
from threadline.ai import (
    AssistantMessage,
    LanguageModel,
    ModelInfo,
    ThinkingPart,
    ToolResultMessage,
    UserMessage,
    tool,
)
from threadline.ai.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from threadline.durable import StoredMessageEnd
from threadline.stores import FileStore


@tool
def weather(city: str) -> str:
    """Weather for a city.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


def chat_tool_turn() -> Reply:
    return sse_reply(sse_data([
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "weather", "arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}),
        chunk({}, finish="tool_calls"),
    ]))


def chat_text(text: str) -> Reply:
    return sse_reply(sse_data([chunk({"content": text}), chunk({}, finish="stop")]))


def responses_text(text: str) -> Reply:
    item = {"type": "message", "id": "msg_9", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return sse_reply(sse_data([
        ev("response.output_item.added", 0, output_index=0,
           item={**item, "status": "in_progress", "content": []}),
        ev("response.output_text.delta", 1, item_id="msg_9", output_index=0, content_index=0,
           delta=text, logprobs=[]),
        ev("response.output_item.done", 2, output_index=0, item=item),
        ev("response.completed", 3, response=response_obj()),
    ], done=False))


def results_sent(api: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, output text) of each tool result in a request body."""
    if api == "chat":
        return [(m["tool_call_id"], m["content"]) for m in body["messages"]
                if m["role"] == "tool"]
    if api == "responses":
        return [(i["call_id"], i["output"]) for i in body["input"]
                if i.get("type") == "function_call_output"]
    return [(b["tool_use_id"], b["content"][0]["text"]) for m in body["messages"]
            if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"]


Make = Callable[[str], LanguageModel]
CASES: dict[str, tuple[Make, Callable[[], Reply], Callable[[str], Reply]]] = {
    "chat": (
        lambda url: OpenAIChatModel(ModelInfo(provider="openai", id="gpt-test"),
                                    api_key="k", base_url=url + "/v1", max_retries=0),
        chat_tool_turn, chat_text),
    "responses": (
        lambda url: OpenAIResponsesModel(ModelInfo(provider="openai", id="o-test",
                                                   reasoning=True),
                                         api_key="k", base_url=url + "/v1", max_retries=0),
        lambda: sse_reply(sse_data(RESPONSES_TOOL_TURN, done=False)), responses_text),
    "anthropic": (
        lambda url: AnthropicModel(ModelInfo(provider="anthropic", id="claude-test"),
                                   api_key="k", base_url=url, max_retries=0),
        lambda: sse_reply(ANTHROPIC_TOOL_TURN), anthropic_text),
}


async def run_tool_session(api: str, root: Path, srv: WireServer) -> list[StoredMessageEnd]:
    make, tool_turn, text = CASES[api]
    srv.reply(tool_turn(), text("Sunny in both."))
    model = make(srv.url)
    agent = await durable.open(durable.model(model, [weather], system="Be brief."),
                               store=FileStore(root), session_id="trip")
    events = await agent.run("Weather in Paris and Oslo?").collect()
    await model.aclose()  # type: ignore[attr-defined]
    return [e for e in events if isinstance(e, StoredMessageEnd)]


@pytest.mark.parametrize("api", list(CASES))
async def test_durable_run_with_parallel_tools(api: str, tmp_path: Path) -> None:
    async with WireServer() as srv:
        stored = await run_tool_session(api, tmp_path, srv)
    roles = [type(e.message).__name__ for e in stored]
    assert roles == ["UserMessage", "AssistantMessage", "ToolResultMessage",
                     "ToolResultMessage", "AssistantMessage"]
    first, last = stored[1].message, stored[-1].message
    assert isinstance(first, AssistantMessage) and isinstance(last, AssistantMessage)
    assert first.stop_reason == "tool_use"
    assert [c.arguments for c in first.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert last.text == "Sunny in both."
    results = [e.message for e in stored[2:4]]
    assert [r.tool_call_id for r in results if isinstance(r, ToolResultMessage)] == [
        c.id for c in first.tool_calls]
    # Every receipt names entries that are on disk: reopening yields the same messages.
    reopened = await durable.open(None, store=FileStore(tmp_path), session_id="trip")
    assert reopened.messages() == [e.message for e in stored]
    # The second request carried both results, each paired with its call.
    sent = results_sent(api, srv.received[1].body)
    assert [text for _, text in sent] == ["sunny in Paris", "sunny in Oslo"]
    assert len({call_id for call_id, _ in sent}) == 2


async def test_session_recorded_on_anthropic_continues_on_openai(tmp_path: Path) -> None:
    async with WireServer() as srv:
        await run_tool_session("anthropic", tmp_path, srv)
        srv.reply(chat_text("Rain tomorrow."))
        make = CASES["chat"][0]
        model = make(srv.url)
        agent = await durable.open(durable.model(model, [weather]), store=FileStore(tmp_path),
                                   session_id="trip")
        thinking = [p for m in agent.messages() if isinstance(m, AssistantMessage)
                    for p in m.content if isinstance(p, ThinkingPart)]
        assert thinking and thinking[0].signature  # stored with its Anthropic signature
        events = await agent.run("And tomorrow?").collect()
        await model.aclose()  # type: ignore[attr-defined]
    assert any(isinstance(e, StoredMessageEnd) and isinstance(e.message, AssistantMessage)
               and e.message.text == "Rain tomorrow." for e in events)
    body = srv.received[-1].body["messages"]
    assistant = body[1]
    # Anthropic's signed thinking arrives as plain text; the redacted block is gone.
    assert assistant["content"] == "Two cities, two calls.\n\nChecking both."
    assert "reasoning_content" not in assistant
    call_ids = [c["id"] for c in assistant["tool_calls"]]
    assert [m["tool_call_id"] for m in body[2:4]] == call_ids
    assert body[-1] == {"role": "user", "content": "And tomorrow?"}
    assert isinstance(agent.messages()[-2], UserMessage)
