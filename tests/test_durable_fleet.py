"""The durable agent's side of S25 (retrying after a lost acknowledgement) and
S26 (watching its session), on the memory and SQLite stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.stores import BareStore
from threadline import durable
from threadline.ai._messages import UserMessage
from threadline.durable import StoredMessageEnd
from threadline.durable import _retry as retry
from threadline.errors import AgentError, StoreError, StoreUnavailable
from threadline.stores import MemoryStore, SQLiteStore
from threadline.testing import FaultyStore, ScriptedModel, Turn


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.0, 0.001, 0.002))


def _lost(message: str = "connection lost after COMMIT") -> StoreUnavailable:
    return StoreUnavailable(message, session_id="s")


async def test_s25_lost_acknowledgements_give_each_receipt_once() -> None:
    # Append 1 (the run's input) and 2 (the reply) are stored, then reported as
    # lost; each retry is recognised by the store as already stored.
    memory = MemoryStore()
    store = FaultyStore(memory, fail_append_on={1, 3}, when="after", error=_lost())
    agent = await durable.open(durable.model(ScriptedModel([Turn.text("hello")])),
                               store=store, session_id="s")
    events = await agent.run("hi").collect()
    receipts = [e for e in events if isinstance(e, StoredMessageEnd)]
    written = [entry.id for r in receipts for entry in r.entries]
    stored = [e.id for e in await memory.load_entries("s")]
    assert store.append_calls == 4  # two appends, each retried once
    assert stored == [e.id for e in agent.entries]
    assert len(stored) == len(set(stored)) == 2
    assert set(written) <= set(stored) and len(written) == len(set(written))


async def test_s25_retries_run_out_with_the_error_and_no_receipt() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory, fail_append_on=range(1, 100), error=_lost("server down"))
    agent = await durable.open(None, store=store, session_id="s")
    with pytest.raises(StoreUnavailable, match="server down"):
        await agent.append(UserMessage.of("never stored"))
    assert store.append_calls == len(retry.RETRY_DELAYS) + 1
    assert agent.entries == [] and list(await memory.load_entries("s")) == []


async def test_s25_other_store_errors_are_not_retried() -> None:
    store = FaultyStore(MemoryStore(), fail_append_on=1,
                        error=StoreError("disk says no", session_id="s"))
    agent = await durable.open(None, store=store, session_id="s")
    with pytest.raises(StoreError, match="disk says no"):
        await agent.append(UserMessage.of("x"))
    assert store.append_calls == 1


async def test_s26_agent_watch_follows_what_another_agent_appends(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with SQLiteStore(path) as a_store, SQLiteStore(path) as b_store:
        watcher = await durable.open(None, store=a_store, session_id="live")
        writer = await durable.open(durable.model(ScriptedModel([Turn.text("answer")])),
                                    store=b_store, session_id="live")
        first = await writer.append(UserMessage.of("before watching"))
        watch = watcher.watch(after=first[0].id)
        await writer.run("question").collect()
        got = [await anext(watch), await anext(watch)]
        await watch.aclose()  # type: ignore[attr-defined]
        assert [e.id for e in got] == [e.id for e in writer.entries[1:]]
        assert watcher.entries == []  # the watching agent's own view is untouched


async def test_s26_agent_watch_on_a_store_without_watch_is_a_clear_error() -> None:
    agent = await durable.open(None, store=BareStore(MemoryStore()), session_id="plain")
    with pytest.raises(AgentError, match=r"'plain'.*BareStore offers no watch"):
        agent.watch()
