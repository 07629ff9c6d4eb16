"""Shared by the Temporal and DBOS tests: the conversation, its tools, and the checks.

The conversation is deterministic in what the model is sent: each user
message ``order X`` makes the model call ``pay`` (a side effect counted in a
real SQLite file, tests/support/effects.py) and ``lookup``, then answer with
what they returned; ``refund N`` asks for a refund that needs approval when
over 100. So a worker that is killed and replaced gets the same replies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from support.effects import Counter, assert_one_result_each, pay_tool
from threadline.ai import ToolContext, ToolResultMessage, UserMessage, tool
from threadline.ai._model import Request
from threadline.durable._effects import TOOL_STARTED
from threadline.session import CustomEntry, Entry, MessageEntry, encode_entry
from threadline.testing import Call, ScriptedModel, Turn

MESSAGES = ["order A-1", "order B-2", "order C-3"]


def reply(request: Request) -> Turn:
    last = request.messages[-1]
    if isinstance(last, UserMessage):
        verb, _, what = last.text.partition(" ")
        if verb == "refund":
            return Turn(Call("refund", {"amount": int(what)}, id=f"refund-{what}"))
        return Turn(Call("pay", {"order": what}, id=f"pay-{what}"),
                    Call("lookup", {"order": what}, id=f"lookup-{what}"))
    answers = []
    for message in reversed(request.messages):
        if not isinstance(message, ToolResultMessage):
            break
        answers.append(message.text)
    return Turn.text("done: " + "; ".join(reversed(answers)))


def model() -> ScriptedModel:
    return ScriptedModel([reply] * 100_000)


@tool
def lookup(order: str) -> str:
    """Where an order is."""
    return f"order {order}: shipped"


def refund_tool(counter: Counter) -> Any:
    @tool(side_effects=True, approval=lambda a: "over 100" if a["amount"] > 100 else None)
    async def refund(amount: int, ctx: ToolContext) -> str:
        """Refund an amount."""
        counter.hit(ctx.idempotency_key, dedupe=False)
        return f"refunded {amount}"

    return refund


def tools(counter: Counter, replay: Any = "never",
          hooks: Callable[[str, str], None] | None = None) -> list[Any]:
    return [pay_tool(counter, replay=replay, hooks=hooks), lookup, refund_tool(counter)]


def normalized(path: Sequence[Entry]) -> list[dict[str, Any]]:
    """The path without what differs between two runs of one conversation: ids, times, keys."""
    out = []
    for entry in path:
        data = msgspec.json.decode(encode_entry(entry))
        for field in ("id", "parent_id", "timestamp"):
            data.pop(field, None)
        if isinstance(entry, CustomEntry) and isinstance(data.get("data"), dict):
            for field in ("idempotency_key", "request_id"):
                if field in data["data"]:
                    data["data"][field] = "-"
        out.append(data)
    return out


def check_exactly_once(entries: Sequence[Entry], path: Sequence[Entry],
                       reference: Sequence[Entry], counter: Counter) -> None:
    """The whole log is one path, equal to the uninterrupted run's; each effect happened once."""
    assert [e.id for e in entries] == [e.id for e in path], "the log has entries off the path"
    assert len({e.id for e in entries}) == len(entries)
    assert normalized(path) == normalized(reference)
    assert_one_result_each(path)
    table = counter.table()
    for entry in path:
        if isinstance(entry, CustomEntry) and entry.kind == TOOL_STARTED:
            assert table[entry.data.idempotency_key] == (1, 1), entry.data
    assert sum(isinstance(e, MessageEntry) for e in path) == sum(
        isinstance(e, MessageEntry) for e in reference)
