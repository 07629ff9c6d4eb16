"""The steps both engine integrations run (S50), on a real SQLite store, without an engine.

A step run again with the same key (the engine's retry after a lost
worker) returns what the first run stored and does nothing else; two runs
at once store one of them, and both return it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from support.effects import Counter, assert_one_result_each
from support.engines import reply, tools
from threadline.integrations._steps import Steps
from threadline.stores import SQLiteStore
from threadline.testing import Gate, ScriptedModel, Text, Turn


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = SQLiteStore(tmp_path / "sessions.db")
    yield s
    await s.close()


async def test_s50_a_step_run_again_returns_what_it_stored(store: SQLiteStore,
                                                           tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    lm = ScriptedModel([reply] * 10)
    steps = Steps(store, lm, tools(counter))
    first = await steps.model_turn("w/1", "s", None, "order A-1")
    again = await steps.model_turn("w/1", "s", None, "order A-1")
    assert again == first and len(lm.requests) == 1  # the model was not asked twice
    pay, lookup = first.calls
    leaf = await steps.tool_call("w/2", "s", first.leaf_id, pay.call_id, pay.idempotency_key)
    assert await steps.tool_call("w/2", "s", first.leaf_id, pay.call_id,
                                 pay.idempotency_key) == leaf
    leaf = await steps.tool_call("w/3", "s", leaf, lookup.call_id, lookup.idempotency_key)
    done = await steps.model_turn("w/4", "s", leaf)
    assert not done.calls
    entries = list(await store.load_entries("s"))
    assert entries[-1].id == done.leaf_id and len(entries) == 7
    assert_one_result_each(entries)
    assert counter.table() == {pay.idempotency_key: (1, 1)}  # the payment ran once


async def test_s50_two_attempts_at_once_store_one_and_both_return_it(store: SQLiteStore
                                                                     ) -> None:
    both_asked = [asyncio.Event(), asyncio.Event()]
    go = asyncio.Event()

    def model(word: str, mine: asyncio.Event) -> ScriptedModel:
        def turn(request: Any) -> Turn:
            mine.set()
            return Turn(Gate(go), Text(word))
        return ScriptedModel([turn])

    a = Steps(store, model("first", both_asked[0]))
    b = Steps(store, model("second", both_asked[1]))
    ta = asyncio.ensure_future(a.model_turn("w/1", "s", None, "hello"))
    tb = asyncio.ensure_future(b.model_turn("w/1", "s", None, "hello"))
    for event in both_asked:  # each attempt loaded the session and asked its model
        await event.wait()
    go.set()
    got_a, got_b = await asyncio.gather(ta, tb)
    assert got_a == got_b
    entries = list(await store.load_entries("s"))
    assert len(entries) == 2 and entries[-1].id == got_a.leaf_id
    assert entries[-1].message.text in ("first", "second")  # type: ignore[union-attr]


async def test_s50_a_leaf_the_session_lacks_is_refused(store: SQLiteStore) -> None:
    from threadline.errors import AgentError, SessionNotFound

    steps = Steps(store, ScriptedModel([Turn.text("hi")]))
    with pytest.raises(SessionNotFound):
        await steps.model_turn("w/1", "nobody", "some-leaf", "hello")
    await steps.model_turn("w/1", "s", None, "hello")
    with pytest.raises(AgentError, match="no entry 'elsewhere'"):
        await steps.model_turn("w/2", "s", "elsewhere", "again")
