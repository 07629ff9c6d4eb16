"""Provider overhead: what our stream adds on top of iterating the official SDK.

A local HTTP server (tests/wire_server.py) sends one Chat Completions or
Anthropic response of N server-sent events (in one write, so the server's
own cost stays small). In the same process and run we time:

- sdk: iterating the SDK's own stream (``create(stream=True)``), the floor;
- ours: ``model.stream(...)`` consumed to the end, no abort signal;
- ours+abort: the same with an abort event, so each chunk read is raced
  against it.

overhead per chunk = (ours - sdk) / N. Best of several repetitions.

    .venv/bin/python bench/providers.py [--quick]

Writes bench/results/providers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from threadline.ai import ModelInfo, Request, StreamOptions, UserMessage
from threadline.ai.providers import AnthropicModel, OpenAIChatModel
from wire_server import WireServer, sse_data, sse_named, sse_reply

RESULTS = Path(__file__).resolve().parent / "results" / "providers.json"
REQ = Request(messages=(UserMessage.of("go"),))


def chat_chunks(n: int) -> list[Any]:
    def c(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    # One write: the server's per-write cost would otherwise blur the client's.
    return [b"".join(sse_data([c({"content": "tok "}) for _ in range(n)] + [c({}, "stop")]))]


def anthropic_chunks(n: int) -> list[Any]:
    start = {"type": "message_start", "message": {
        "id": "m", "type": "message", "role": "assistant", "content": [], "model": "m",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1}}}
    return [b"".join(sse_named([
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "text_delta", "text": "tok "}} for _ in range(n)),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": n}},
        {"type": "message_stop"},
    ]))]


async def best(fns: list[Callable[[], Awaitable[None]]], reps: int) -> list[float]:
    """Best time of each function, the functions interleaved so load spikes hit all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            await fn()
            ts.append(time.perf_counter() - t0)
    return [min(ts) for ts in times]


async def scenario(name: str, n: int, reps: int) -> dict[str, Any]:
    async with WireServer() as srv:
        if name == "openai-chat":
            body = chat_chunks(n)
            model: Any = OpenAIChatModel(ModelInfo(provider="openai", id="m"), api_key="k",
                                         base_url=srv.url + "/v1", max_retries=0)

            async def sdk() -> None:
                srv.reply(sse_reply(body))
                stream = await model._client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "go"}], stream=True)
                async for _ in stream:
                    pass
        else:
            body = anthropic_chunks(n)
            model = AnthropicModel(ModelInfo(provider="anthropic", id="m"), api_key="k",
                                   base_url=srv.url, max_retries=0)

            async def sdk() -> None:
                srv.reply(sse_reply(body))
                stream = await model._client.messages.create(
                    model="m", max_tokens=10, messages=[{"role": "user", "content": "go"}],
                    stream=True)
                async for _ in stream:
                    pass

        async def ours(abort: asyncio.Event | None = None) -> None:
            srv.reply(sse_reply(body))
            async for _ in model.stream(REQ, StreamOptions(abort=abort)):
                pass

        await sdk()  # warm the connection pool and imports
        await ours()
        t_sdk, t_ours, t_abort = await best([sdk, ours, lambda: ours(asyncio.Event())], reps)
        await model.aclose()
    return {
        "provider": name, "chunks": n, "sdk_s": t_sdk, "ours_s": t_ours, "ours_abort_s": t_abort,
        "overhead_us_per_chunk": (t_ours - t_sdk) / n * 1e6,
        "overhead_abort_us_per_chunk": (t_abort - t_sdk) / n * 1e6,
        "ratio": t_ours / t_sdk, "ratio_abort": t_abort / t_sdk,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, reps = (500, 3) if args.quick else (4000, 7)
    rows = [await scenario(p, n, reps) for p in ("openai-chat", "anthropic")]
    print(f"{'provider':<12} {'chunks':>6} {'sdk ms':>8} {'ours ms':>8} {'+abort ms':>9} "
          f"{'us/chunk':>8} {'+abort':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['provider']:<12} {r['chunks']:>6} {r['sdk_s'] * 1e3:>8.1f} "
              f"{r['ours_s'] * 1e3:>8.1f} {r['ours_abort_s'] * 1e3:>9.1f} "
              f"{r['overhead_us_per_chunk']:>8.1f} {r['overhead_abort_us_per_chunk']:>7.1f} "
              f"{r['ratio']:>6.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"python": platform.python_version(), "rows": rows},
                                  indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
