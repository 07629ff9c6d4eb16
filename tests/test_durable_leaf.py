"""S27: leaf mutations are serialised, and lifecycle events never lie.

A sync ``branch`` races an async append (or fork, or compaction) whose write
is held inside a real store, before or after the store wrote it. The branch
must refuse rather than be undone when the write returns, nothing may be
published for it, and what is stored must chain the way the agent says.
``agent.tree`` is a read-only view: the only way to move the leaf is
``branch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from threadline import durable
from threadline.ai._messages import UserMessage
from threadline.durable import DurableAgent, LifecycleEvent, SessionBranched
from threadline.errors import AgentError, SessionNotFound
from threadline.session import Entry, SessionRecord, TreeIndex, TreeView
from threadline.stores import FileStore, MemoryStore, Store


class HeldAppendStore:
    """A real store whose ``append_entries`` waits on ``release`` while held.

    ``where="before"`` holds the batch before the inner store sees it;
    ``"after"`` holds it once the inner store has written it.
    """

    def __init__(self, inner: Store, where: str) -> None:
        self.inner = inner
        self.where = where
        self.held = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        if not self.held:
            await self.inner.append_entries(session_id, entries)
            return
        if self.where == "after":
            await self.inner.append_entries(session_id, entries)
        self.entered.set()
        await self.release.wait()
        if self.where == "before":
            await self.inner.append_entries(session_id, entries)


@pytest.fixture(params=["memory", "file"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else FileStore(tmp_path / "sessions")


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


async def opened(store: Store) -> tuple[DurableAgent, list[LifecycleEvent], list[Entry]]:
    published: list[LifecycleEvent] = []
    agent = await durable.open(None, store=store, session_id="s27", publisher=published.append)
    chain = [*await agent.append(user("root")), *await agent.append(user("second"))]
    published.clear()
    return agent, published, chain


MUTATIONS: dict[str, Callable[[DurableAgent, list[Entry]], Coroutine[Any, Any, Any]]] = {
    "append": lambda agent, chain: agent.append(user("third")),
    "compact": lambda agent, chain: agent.compact("summary", chain[1].id),
    "fork": lambda agent, chain: agent.fork("s27-child"),
}


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("verb", sorted(MUTATIONS))
async def test_s27_branch_refuses_while_a_mutation_is_held_in_the_store(
    inner: Store, where: str, verb: str
) -> None:
    store = HeldAppendStore(inner, where)
    agent, published, chain = await opened(store)
    store.held = True
    task = asyncio.create_task(MUTATIONS[verb](agent, chain))
    async with asyncio.timeout(10):
        await store.entered.wait()
    with pytest.raises(AgentError, match="in flight") as refused:
        agent.branch(chain[0].id)
    assert "s27" in str(refused.value)
    assert published == []  # nothing happened, so nothing is announced
    store.release.set()
    store.held = False
    async with asyncio.timeout(10):
        await task

    # The leaf is where the held write put it (or, for a fork, where it was).
    if verb == "fork":
        assert agent.leaf_id == chain[1].id
    else:
        (written,) = [e for e in agent.entries if e.id not in {c.id for c in chain}]
        assert (agent.leaf_id, written.parent_id) == (written.id, chain[1].id)
    before = agent.leaf_id

    # Once the write is done, branching works, is published, and holds.
    published.clear()
    agent.branch(chain[0].id)
    assert published == [SessionBranched(session_id="s27", from_id=before, to_id=chain[0].id)]
    (after_branch,) = await agent.append(user("on the branch"))
    assert after_branch.parent_id == chain[0].id
    stored = {e.id: e for e in await inner.load_entries("s27")}
    assert stored[after_branch.id].parent_id == chain[0].id


async def test_s27_branch_during_a_run_is_refused_and_publishes_nothing(
    inner: Store,
) -> None:
    from threadline.durable import RunStarted
    from threadline.testing import Gate, ScriptedModel, Text, Turn

    gate = asyncio.Event()
    published: list[LifecycleEvent] = []
    agent = await durable.open(durable.model(ScriptedModel([Turn(Gate(gate), Text("hi"))])),
                               store=inner, session_id="run", publisher=published.append)
    published.clear()
    async with asyncio.timeout(10), agent.run("go") as run:
        async for event in run:
            if isinstance(event, RunStarted):
                with pytest.raises(AgentError, match="run is in progress"):
                    agent.branch(None)
                gate.set()
    assert published == []
    assert agent.leaf is not None and agent.leaf.parent_id is not None


async def test_s27_tree_is_a_read_only_view_that_follows_the_agent(inner: Store) -> None:
    agent, _, chain = await opened(inner)
    view = agent.tree
    assert isinstance(view, TreeView) and not isinstance(view, TreeIndex)
    assert not hasattr(view, "add") and not hasattr(view, "set_leaf")
    with pytest.raises(AttributeError):
        view.leaf_id = chain[0].id  # type: ignore[misc]
    assert view.leaf_id == chain[1].id and [e.id for e in view.path()] == [c.id for c in chain]
    (third,) = await agent.append(user("third"))
    agent.branch(chain[0].id)
    assert view.leaf_id == chain[0].id and third.id in view and len(view) == 3
    assert view.children(chain[1].id) == [third]


async def test_s27_open_is_the_one_way_to_get_an_agent(inner: Store) -> None:
    with pytest.raises(AgentError, match=r"durable\.open"):
        DurableAgent(None, store=inner, session_id="s")
    with pytest.raises(SessionNotFound):
        await durable.open(None, store=inner, session_id="nobody", create=False)
    with pytest.raises(SessionNotFound):
        await inner.load_entries("nobody")  # refusing to create left nothing behind
