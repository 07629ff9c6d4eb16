"""Provider wire streams as the real APIs send them: Anthropic Messages and OpenAI Chat
Completions and Responses events, for the wire server (``support.wire_server``) to play."""

from __future__ import annotations

from typing import Any

from support.wire_server import Reply, sse_named, sse_reply


def message_start(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "stop_reason": None, "stop_sequence": None,
        "usage": usage or {"input_tokens": 12, "output_tokens": 1,
                           "cache_read_input_tokens": 300, "cache_creation_input_tokens": 40}}}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, d: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": d}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_end(reason: str, output_tokens: int = 50) -> list[dict[str, Any]]:
    return [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
             "usage": {"output_tokens": output_tokens}},
            {"type": "message_stop"}]


def anthropic_text_turn(text: str) -> Reply:
    return sse_reply(sse_named([
        message_start(), block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": text}), stop(0), *message_end("end_turn")]))


ANTHROPIC_TOOL_TURN = sse_named([
    message_start(),
    {"type": "ping"},
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "Two cities, "}),
    delta(0, {"type": "thinking_delta", "thinking": "two calls."}),
    delta(0, {"type": "signature_delta", "signature": "EqQBCkYIARgC"}),
    stop(0),
    block_start(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}),
    stop(1),
    block_start(2, {"type": "text", "text": ""}),
    delta(2, {"type": "text_delta", "text": "Checking both."}),
    stop(2),
    block_start(3, {"type": "tool_use", "id": "toolu_01A", "name": "weather", "input": {}}),
    delta(3, {"type": "input_json_delta", "partial_json": ""}),
    delta(3, {"type": "input_json_delta", "partial_json": '{"city": "Pa'}),
    delta(3, {"type": "input_json_delta", "partial_json": 'ris"}'}),
    stop(3),
    block_start(4, {"type": "tool_use", "id": "toolu_01B", "name": "weather", "input": {}}),
    delta(4, {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'}),
    stop(4),
    *message_end("tool_use", 88),
])


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
        "choices": [] if delta is None else [
            {"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        c["usage"] = usage
    return c


def response_obj(status: str = "completed", output: list[Any] | None = None,
                 usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": "o-test",
            "status": status, "output": output or [], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "usage": usage, **extra}


REASONING_ITEM = {"id": "rs_1", "type": "reasoning", "encrypted_content": "ENC==",
                  "summary": [{"type": "summary_text", "text": "Two cities."}]}


R_USAGE = {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20,
                                                        "cache_write_tokens": 0},
           "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12},
           "total_tokens": 80}


def ev(type_: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "sequence_number": seq, **fields}


def call_item(n: int, args: str = "") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
            "name": "weather", "arguments": args, "status": "in_progress"}


RESPONSES_TOOL_TURN = [
    ev("response.created", 0, response=response_obj("in_progress")),
    ev("response.output_item.added", 1, output_index=0,
       item={**REASONING_ITEM, "summary": [], "encrypted_content": None}),
    ev("response.reasoning_summary_text.delta", 2, item_id="rs_1", output_index=0,
       summary_index=0, delta="Two "),
    ev("response.reasoning_summary_text.delta", 3, item_id="rs_1", output_index=0,
       summary_index=0, delta="cities."),
    ev("response.output_item.done", 4, output_index=0, item=REASONING_ITEM),
    ev("response.output_item.added", 5, output_index=1, item=call_item(1)),
    ev("response.function_call_arguments.delta", 6, item_id="fc_1", output_index=1,
       delta='{"city":'),
    ev("response.function_call_arguments.delta", 7, item_id="fc_1", output_index=1,
       delta='"Paris"}'),
    ev("response.output_item.done", 8, output_index=1, item=call_item(1, '{"city":"Paris"}')),
    ev("response.output_item.added", 9, output_index=2, item=call_item(2)),
    ev("response.function_call_arguments.delta", 10, item_id="fc_2", output_index=2,
       delta='{"city":"Oslo"}'),
    ev("response.output_item.done", 11, output_index=2, item=call_item(2, '{"city":"Oslo"}')),
    ev("response.completed", 12, response=response_obj(usage=R_USAGE)),
]
