"""The OpenAI Agents SDK's ``Session`` protocol over any threadline store.

Items are kept as ``_items`` says: as threadline messages where they are
messages (so ``threadline show``, ``export`` and the viewer display the
conversation), whole otherwise, each coming back equal to what was added.

The log stays append-only. ``pop_item`` and ``clear_session`` are durable
branches: the popped items stay in the log, off the active path. Items
are appended with ``append_linear``, so every writer's items land on one
path, and every read first takes in what other writers appended. The session
keeps the items of its active path in memory and follows the log by what is
new, so a call costs what it adds or reads, not the history. The session is
opened without crash repair: the SDK pairs its own tool calls and outputs,
and a result the SDK did not add must never appear in its history.

Store work runs on threadline's own event loop (``_loop``), whichever loop
or thread the SDK calls from.
"""

from __future__ import annotations

import asyncio
import collections.abc
import weakref
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from threadline import durable
from threadline.ai import AssistantMessage
from threadline.durable import DurableAgent
from threadline.errors import AgentError, StoreError
from threadline.integrations.openai_agents._items import (
    ITEM_KIND,
    Read,
    entries_for,
    read_items,
)
from threadline.integrations.openai_agents._loop import in_home, on_home, run_at_home
from threadline.session import Entry, MessageEntry
from threadline.stores import LinearStore, Store, open_store

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "threadline.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'threadline[openai-agents]'"
    ) from exc

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["ITEM_KIND", "ThreadlineSession"]


class _Path:
    """The items on the active path as of ``leaf``, and the tool names its calls gave.

    Only the home loop's thread reads or changes it.
    """

    __slots__ = ("items", "leaf", "size", "tool_names")

    def __init__(self) -> None:
        self.items: list[Read] = []
        self.tool_names: dict[str, str] = {}
        self.leaf: str | None = None
        self.size = -1  # entries in the agent's tree when ``leaf`` was taken in; -1: none yet

    def follow(self, agent: DurableAgent) -> None:
        """Take in what the agent's active path gained since ``leaf``: only what is
        new when the path grew on from there, else the whole path again."""
        tree = agent.tree
        size, leaf = len(tree), tree.leaf_id
        if self.size >= 0 and leaf == self.leaf:
            self.size = size  # entries on other branches change nothing here
            return
        grown: list[Entry] = []
        entry = tree.leaf
        # A path that grew from ``leaf`` meets it within the entries added since.
        while self.size >= 0 and entry is not None and entry.id != self.leaf \
                and len(grown) < size - self.size:
            grown.append(entry)
            entry = tree.get(entry.parent_id) if entry.parent_id is not None else None
        if self.size < 0 or (entry.id if entry is not None else None) != self.leaf:
            self.items, self.tool_names = [], {}
            grown = agent.path()  # moved elsewhere (a pop, another writer's branch)
        else:
            grown.reverse()
        self.items += read_items(grown)
        for added in grown:
            if isinstance(added, MessageEntry) and isinstance(added.message, AssistantMessage):
                self.tool_names.update((c.id, c.name) for c in added.message.tool_calls)
        self.leaf, self.size = leaf, size


class _Closing(collections.abc.Coroutine[Any, Any, None]):
    """What ``close()`` returns: the close is under way, and awaiting this waits for it."""

    def __init__(self, done: Any) -> None:
        self._done = done
        self._steps: Generator[Any, None, None] | None = None

    def __await__(self) -> Generator[Any, None, None]:
        if self._done is not None:
            yield from asyncio.wrap_future(self._done).__await__()

    def _gen(self) -> Generator[Any, None, None]:
        if self._steps is None:
            self._steps = self.__await__()
        return self._steps

    def send(self, value: Any) -> Any:
        return self._gen().send(value)

    def throw(self, *args: Any) -> Any:
        return self._gen().throw(*args)

    def close(self) -> None:
        self._gen().close()


class ThreadlineSession:
    """An Agents SDK ``Session`` kept in a threadline session of the same id.

    Pass it as ``Runner.run(agent, input, session=...)``. It can be used from
    any thread and event loop. ``agent()`` gives the threadline view of the
    same session (tree, branches, fork, compaction, export).
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        # As the SDK's own sessions: a dict is checked and made SessionSettings
        # (an unknown field is a TypeError), and None means the defaults.
        self.session_settings = (coerce_session_settings(session_settings)
                                 if session_settings is not None else SessionSettings())
        self._store = store
        self._owns_store = False
        self._closed = False
        self._agent: DurableAgent | None = None
        self._path = _Path()

    @classmethod
    def from_url(
        cls, session_id: str, url: str, *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> ThreadlineSession:
        """A session in the store ``url`` names (see ``stores.open_store``);
        ``close()`` closes that store."""
        store = open_store(url)
        session = cls(session_id, store, session_settings=session_settings)
        session._owns_store = True
        # A session dropped unclosed still closes its store, on the loop that used it.
        weakref.finalize(session, _close_later, store)
        return session

    async def agent(self) -> DurableAgent:
        """The durable agent over this session (opened on first use, no repair)."""
        return await run_at_home(self._opened())

    async def _opened(self) -> DurableAgent:
        if self._closed:
            raise StoreError(f"session {self.session_id!r}: the ThreadlineSession is closed",
                             session_id=self.session_id)
        if self._agent is None:
            opened = await durable.open(None, store=self._store, session_id=self.session_id,
                                        repair=False)
            if self._agent is None:  # two callers may open at once: keep one agent
                self._agent = opened
        return self._agent

    async def _refreshed(self) -> tuple[DurableAgent, _Path]:
        agent = await self._opened()
        await agent.refresh()
        self._path.follow(agent)
        return agent, self._path

    # -- the Session protocol ----------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items on the active path, oldest first; ``limit`` keeps the latest ones."""
        return await run_at_home(self._get_items(limit))

    async def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        _, path = await self._refreshed()
        n = resolve_session_limit(limit, self.session_settings)
        reads = path.items
        if n is not None and n >= 0:  # a negative limit means no limit, as in SQLiteSession
            reads = reads[max(0, len(reads) - n):] if n else []
        # The caller owns what it is given: mutating it must not change the history.
        return [_copy(r.item) for r in reads]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after the last item any writer added, in one write."""
        await run_at_home(self._add(items))

    def _entries(self, items: Sequence[Any]) -> list[Entry]:
        names = dict(self._path.tool_names)
        entries: list[Entry] = []
        for n, item in enumerate(items):
            try:
                kept = msgspec.json.decode(msgspec.json.encode(item))
            except (msgspec.EncodeError, TypeError) as exc:
                raise AgentError(
                    f"session {self.session_id!r}: item {n} of add_items is not JSON "
                    f"({type(item).__name__}: {exc}); nothing was added") from exc
            if not isinstance(kept, dict):
                raise AgentError(f"session {self.session_id!r}: item {n} of add_items is a "
                                 f"{type(item).__name__}, not an item; nothing was added")
            entries += entries_for(kept, names)
        return entries

    async def _add(self, items: Sequence[Any]) -> None:
        agent = await self._opened()
        entries = self._entries(items)
        if not entries:
            return
        if isinstance(agent.store, LinearStore):
            await agent.append_linear(*entries)
        else:
            await agent.append(*entries)
        self._path.follow(agent)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take the latest item off the active path; it stays in the log."""
        return await run_at_home(self._pop())

    async def _pop(self) -> TResponseInputItem | None:
        agent, path = await self._refreshed()
        if not path.items:
            return None
        last = path.items[-1]
        await agent.branch_to(last.first.parent_id)
        path.follow(agent)
        popped: TResponseInputItem = _copy(last.item)
        return popped

    async def clear_session(self) -> None:
        """Start the active path afresh; every earlier item stays in the log.

        To erase the session for real, use the store's ``delete_session``.
        """
        await run_at_home(self._clear())

    async def _clear(self) -> None:
        agent, path = await self._refreshed()
        if path.items:
            await agent.branch_to(None)
            path.follow(agent)

    def close(self) -> _Closing:
        """Close the store if this session opened it (``from_url``); else nothing.

        Works called plainly, as the SDK's own sessions are closed
        (``session.close()`` returns once the store is closed), and awaited
        (``await session.close()``) in async code, which then does not block its
        loop. Either way the session refuses every later call.
        """
        if self._closed:
            return _Closing(None)
        self._closed = True
        closer = getattr(self._store, "close", None) if self._owns_store else None
        if closer is None:
            return _Closing(None)
        done = on_home(closer())
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            done.result()  # no loop here: close before returning, like SQLiteSession
            return _Closing(None)
        if in_home():
            return _Closing(None)  # pragma: no cover - no caller runs on the home loop
        return _Closing(done)


def _close_later(store: Store) -> None:
    closer = getattr(store, "close", None)
    if closer is not None:
        on_home(closer())


def _copy(item: dict[str, Any]) -> Any:
    return msgspec.json.decode(msgspec.json.encode(item))
