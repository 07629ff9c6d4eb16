"""The durable run's spans: the run itself, around the loop's own spans.

The run span (``invoke_agent``) is current in the task that drives the loop,
so the loop's ``chat`` and ``execute_tool`` spans, and the appends made while
it runs, are its children, and every span made there names the session as
``gen_ai.conversation.id``. None of it runs while tracing is off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

from threadline.agent._events import AgentEnd, AgentEvent, MessageEnd
from threadline.ai import _trace as trace
from threadline.ai._messages import AssistantMessage, Usage
from threadline.session._entries import Entry
from threadline.stores._contract import Store

__all__ = ["load", "traced_append", "traced_events", "traced_run"]


async def traced_run(main: Coroutine[Any, Any, None], session_id: str, store: object,
                     input_entries: Sequence[Entry], holder: list[Any]) -> None:
    """Drive ``main`` inside the run's span; ``holder`` gets the span for ``traced_events``."""
    attributes = {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "threadline",
        "gen_ai.conversation.id": session_id, "threadline.store.kind": trace.store_kind(store),
        "threadline.entry.ids": [e.id for e in input_entries],
    }
    with trace.conversation(session_id), trace.span("invoke_agent threadline",
                                                     attributes) as span:
        holder.append(span)
        await main


async def traced_events(events: AsyncIterator[AgentEvent], span: Any
                        ) -> AsyncIterator[AgentEvent]:
    """``events``, noting on ``span`` the run's total usage and how it ended."""
    used, calls = Usage(), 0
    try:
        async for event in events:
            if isinstance(event, MessageEnd) and isinstance(event.message, AssistantMessage):
                used, calls = used + event.message.usage, calls + 1
            elif isinstance(event, AgentEnd):
                span.set_attribute("threadline.run.stop_reason", event.stop_reason)
                trace.fail(span, event.error if event.stop_reason != "budget" else None)
            yield event
    finally:
        span.set_attributes({
            "gen_ai.usage.input_tokens": (used.input_tokens + used.cache_read_tokens
                                          + used.cache_write_tokens),
            "gen_ai.usage.output_tokens": used.output_tokens,
            "threadline.run.model_calls": calls,
        })
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def load(store: Store, session_id: str) -> list[Entry]:
    """``store.load_entries``, as a load span."""
    with trace.store_span("load", store, session_id) as span:
        entries = await store.load_entries(session_id)
        trace.loaded(span, entries)
    return entries


async def traced_append(store: Store, session_id: str, held: Entry) -> None:
    """One entry's append, as an append span (the run's usual append, while tracing)."""
    with trace.store_span("append", store, session_id, (held,)):
        await store.append_entries(session_id, (held,))
