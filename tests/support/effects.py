"""Shared by the durable-tool-execution tests: stores by kind (the ``stores``
fixture, new handles on one storage), a real side effect, a refund that asks for
approval, and the log a process killed mid-turn leaves.

The side effect is a counter row per idempotency key in a real SQLite file,
so a test can count how often an effect really happened, across processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from threadline import durable
from threadline.ai import AssistantMessage, ToolCall, ToolContext, ToolResultMessage
from threadline.ai._tools import Replay, Tool, tool
from threadline.durable import ToolPlan, ToolStarted
from threadline.session import CustomEntry, Entry, MessageEntry
from threadline.stores import MemoryStore, Store, open_store
from threadline.testing import Call, ScriptedModel, Turn

STORE_KINDS = ["memory", "file", "sqlite", "postgres"]
PROCESS_STORE_KINDS = ["file", "sqlite", "postgres"]


def store_url(kind: str, tmp: Path, pg_url: str | None = None, schema: str | None = None) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "file":
        return f"file://{tmp}/sessions"
    if kind == "sqlite":
        return f"sqlite:///{tmp}/sessions.db"
    assert pg_url is not None and schema is not None
    return f"{pg_url}?schema={schema}"


class Counter:
    """Effects by key in a SQLite file: ``hits`` counts attempts, ``applied`` effects."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects "
                       "(key TEXT PRIMARY KEY, hits INTEGER NOT NULL, applied INTEGER NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout = 30000")
        return db

    def hit(self, key: str, *, dedupe: bool) -> int:
        """Apply the effect for ``key`` (once only with ``dedupe``); the applied count."""
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT applied FROM effects WHERE key = ?", (key,)).fetchone()
            applied = 0 if row is None else int(row[0])
            if not (dedupe and applied):
                applied += 1
            db.execute("INSERT INTO effects VALUES (?, 1, ?) ON CONFLICT(key) DO UPDATE "
                       "SET hits = hits + 1, applied = excluded.applied", (key, applied))
            db.execute("COMMIT")
            return applied
        finally:
            db.close()

    def applied(self, key: str) -> int:
        db = self._db()
        try:
            row = db.execute("SELECT applied FROM effects WHERE key = ?", (key,)).fetchone()
            return 0 if row is None else int(row[0])
        finally:
            db.close()

    def table(self) -> dict[str, tuple[int, int]]:
        db = self._db()
        try:
            rows = db.execute("SELECT key, hits, applied FROM effects").fetchall()
            return {k: (int(h), int(a)) for k, h, a in rows}
        finally:
            db.close()


def pay_tool(counter: Counter, *, replay: Replay, reconcile: bool = False,
             hooks: Any = None, pause: Callable[[], Awaitable[None]] | None = None) -> Tool:
    """``pay(order)``: one effect per call keyed by the call's idempotency key.

    ``hooks`` (optional) is called with a phase name after each step, so a
    child process can report where it is; ``pause`` is awaited between steps,
    so a kill can land between them.
    """

    def mark(phase: str, key: str) -> None:
        if hooks is not None:
            hooks(phase, key)

    async def step() -> None:
        if pause is not None:
            await pause()

    async def pay(order: str, context: ToolContext) -> str:
        """Charge an order."""
        key = context.idempotency_key
        await step()
        mark("entered", key)
        await step()
        applied = counter.hit(key, dedupe=replay == "safe")
        mark("effect", key)
        await step()
        return f"paid {order} (applied {applied})"

    def found(key: str) -> str | None:
        return "paid (found by reconcile)" if counter.applied(key) else None

    return tool(pay, replay=replay, side_effects=True,
                reconcile=found if reconcile else None)


def results_by_call(path: Sequence[Entry]) -> dict[str, list[ToolResultMessage]]:
    out: dict[str, list[ToolResultMessage]] = {}
    for entry in path:
        if isinstance(entry, MessageEntry):
            m = entry.message
            if isinstance(m, AssistantMessage):
                for call in m.tool_calls:
                    out.setdefault(call.id, [])
            elif isinstance(m, ToolResultMessage):
                out.setdefault(m.tool_call_id, []).append(m)
    return out


def assert_one_result_each(path: Sequence[Entry]) -> dict[str, ToolResultMessage]:
    """Every call on the stored path has exactly one stored result."""
    results = results_by_call(path)
    for call_id, found in results.items():
        assert len(found) == 1, f"call {call_id}: {len(found)} results {found}"
    return {k: v[0] for k, v in results.items()}


__all__ = [
    "PROCESS_STORE_KINDS",
    "STORE_KINDS",
    "Counter",
    "assert_one_result_each",
    "open_store",
    "pay_tool",
    "results_by_call",
    "store_url",
]


class Stores:
    """New handles on one storage, closed at the end."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self._memory = MemoryStore()
        self._opened: list[Any] = []

    def open(self) -> Store:
        if self.kind == "memory":
            return self._memory
        store = open_store(self.url)
        self._opened.append(store)
        return store

    async def close(self) -> None:
        for store in self._opened:
            await store.close()


@pytest.fixture(params=STORE_KINDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    kind = request.param
    if kind == "postgres":
        pg_url = request.getfixturevalue("pg_url")
        schema = request.getfixturevalue("pg_schema")
        url = store_url(kind, tmp_path, pg_url, schema)
    else:
        url = store_url(kind, tmp_path)
    s = Stores(kind, url)
    yield s
    await s.close()


async def crashed_turn(stores: Stores, sid: str, calls: Sequence[ToolCall],
                       started: Sequence[str]) -> None:
    """The log a process leaves when killed mid-turn: the assistant message, its
    plan, and started records for ``started``, written as the ledger writes them."""
    agent = await durable.open(None, store=stores.open(), session_id=sid)
    await agent.append(durable_user("go"))
    (assistant,) = await agent.append(AssistantMessage(content=tuple(calls),
                                                       stop_reason="tool_use"))
    await agent.append(CustomEntry(kind="threadline.tool_plan",
                                   data=ToolPlan(calls=tuple(c.id for c in calls))))
    from threadline.durable._effects import idempotency_key

    for call in calls:
        if call.id in started:
            await agent.append(CustomEntry(kind="threadline.tool_started", data=ToolStarted(
                call_id=call.id, tool_name=call.name,
                idempotency_key=idempotency_key(assistant.id, call.id))))


def durable_user(text: str) -> Any:
    from threadline.ai import UserMessage

    return UserMessage.of(text)


def refund_tool(counter: Counter) -> Any:
    @tool(side_effects=True,
          approval=lambda args: f"refund of {args['amount']} is over 100"
          if args["amount"] > 100 else None)
    async def refund(order: str, amount: int, ctx: ToolContext) -> str:
        """Refund an order."""
        counter.hit(ctx.idempotency_key, dedupe=False)
        return f"refunded {amount} on {order}"

    return refund


def refund_script() -> ScriptedModel:
    return ScriptedModel([
        Turn(Call("refund", {"order": "o1", "amount": 20}, id="small"),
             Call("refund", {"order": "o2", "amount": 500}, id="big")),
        Turn.text("done"),
    ])
