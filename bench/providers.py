"""A provider's stream against iterating the official SDK's own stream of the same response.

A local HTTP server (the test suite's wire server) sends one Chat
Completions or Anthropic Messages response of 4,000 server-sent events in
one write. In turns: the SDK's own ``create(stream=True)`` iterated to the
end (the floor, on a client made here with the same settings), and
threadline's ``model.stream(...)`` consumed to the end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench._harness import Run, alternate, test_helper
from bench._targets import ModelInfo, Request, UserMessage, providers

NEEDS = ("import:openai,anthropic",)
MINUTES = 0.5
REQ = Request(messages=(UserMessage.of("go"),))


def chat_body(wire: Any, n: int) -> list[bytes]:
    def c(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return [b"".join(wire.sse_data([c({"content": "tok "}) for _ in range(n)] + [c({}, "stop")]))]


def anthropic_body(wire: Any, n: int) -> list[bytes]:
    start = {"type": "message_start", "message": {
        "id": "m", "type": "message", "role": "assistant", "content": [], "model": "m",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1}}}
    return [b"".join(wire.sse_named([
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "text_delta", "text": "tok "}} for _ in range(n)),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": n}},
        {"type": "message_stop"},
    ]))]


async def scenario(run: Run, name: str, n: int, turns: int) -> None:
    import anthropic
    import openai

    wire = test_helper("wire_server")
    ours = providers()
    async with wire.WireServer() as srv:
        if name == "OpenAI Chat Completions":
            body = chat_body(wire, n)
            model: Any = ours.OpenAIChatModel(ModelInfo(provider="openai", id="m"), api_key="k",
                                         base_url=srv.url + "/v1", max_retries=0)
            client: Any = openai.AsyncOpenAI(api_key="k", base_url=srv.url + "/v1",
                                             max_retries=0)

            async def sdk() -> None:
                srv.reply(wire.sse_reply(body))
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "go"}], stream=True)
                async for _ in stream:
                    pass
        else:
            body = anthropic_body(wire, n)
            model = ours.AnthropicModel(ModelInfo(provider="anthropic", id="m"), api_key="k",
                                   base_url=srv.url, max_retries=0)
            client = anthropic.AsyncAnthropic(api_key="k", base_url=srv.url, max_retries=0)

            async def sdk() -> None:
                srv.reply(wire.sse_reply(body))
                stream = await client.messages.create(
                    model="m", max_tokens=10, messages=[{"role": "user", "content": "go"}],
                    stream=True)
                async for _ in stream:
                    pass

        async def threadline() -> None:
            srv.reply(wire.sse_reply(body))
            async for _ in model.stream(REQ):
                pass

        got = await alternate({"sdk": sdk, "ours": threadline}, turns)
        await model.aclose()
        await client.close()
    run.row(f"{name} stream of {n:,} events, per event", got.median("ours") / n * 1e6, "µs",
            versus="iterating the official SDK's stream of the same response",
            versus_value=got.median("sdk") / n * 1e6, ratio=got.paired("ours", "sdk"),
            detail=f"median of {turns} paired turns")
    run.uses(name.split(maxsplit=1)[0].lower(), getattr(openai if "OpenAI" in name else anthropic,
                                              "__version__", None))


def main(run: Run) -> None:
    n, turns = run.pick((4_000, 9), (300, 2))
    for name in ("OpenAI Chat Completions", "Anthropic Messages"):
        asyncio.run(scenario(run, name, n, turns))
