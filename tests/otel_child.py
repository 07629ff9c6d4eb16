"""A durable run under the OpenTelemetry SDK's in-memory exporter, spans printed as JSON.

Run as a child process by tests/test_tracing.py: a tracer provider is set once
per process, so each scenario gets a process of its own. ``argv[1]`` is the
store folder; ``block`` as ``argv[2]`` makes ``import opentelemetry`` fail first.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

if sys.argv[2:] == ["block"]:
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import now fails

from threadline import durable
from threadline.ai import Usage
from threadline.stores import FileStore
from threadline.testing import ScriptedModel, Turn

SECRET = "the-secret-word"


def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: The word.
    """
    return f"{word} means {SECRET}-result"


def explode(word: str) -> str:
    """Fail, quoting the word.

    Args:
        word: The word.
    """
    raise ValueError(f"cannot explode {word}")


async def scenario() -> None:
    model = ScriptedModel([
        Turn.tool_calls(("lookup", {"word": SECRET}), ("explode", {"word": SECRET}),
                        usage=Usage(input_tokens=11, output_tokens=3)),
        Turn.text(f"It is {SECRET}.", usage=Usage(input_tokens=17, output_tokens=5,
                                                  cache_read_tokens=2)),
        Turn.text(f"Goal: learn {SECRET}.", usage=Usage(input_tokens=23, output_tokens=7)),
    ])
    store = FileStore(sys.argv[1])
    agent = await durable.open(durable.model(model, [lookup, explode]), store=store,
                               session_id="traced")
    await agent.run(f"What is {SECRET}?").collect()
    assert await agent.compact_with(model, keep_recent_tokens=0) is not None
    reopened = await durable.open(None, store=store, session_id="traced")
    print(json.dumps({"ids": [e.id for e in reopened.entries]}))


def main() -> None:
    if sys.argv[2:] == ["block"]:
        from threadline.ai import _trace

        asyncio.run(scenario())
        print(json.dumps({"tracer": _trace.tracer() is not None}))
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    asyncio.run(scenario())
    spans: list[dict[str, Any]] = [{
        "name": s.name, "id": s.context.span_id,
        "parent": s.parent.span_id if s.parent is not None else None,
        "kind": s.kind.name, "status": s.status.status_code.name,
        "attributes": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in (s.attributes or {}).items()},
    } for s in exporter.get_finished_spans()]
    print(json.dumps({"spans": spans}))


main()
