"""The OpenAI Agents SDK's ``Session`` protocol over any threadline store.

Each SDK item is stored as a custom entry holding the item's JSON exactly as
added (so ``get_items`` gives back equal items, whatever their type). An item
that has a meaning in threadline's message model (user and assistant text,
function calls and their outputs) is followed by a message entry saying the
same, which ``threadline show``, ``export`` and the viewer display; the model
context built by threadline sees the messages, never the raw items.

The log stays append-only. ``pop_item`` and ``clear_session`` are durable
branches (S31): the popped items stay in the log, off the active path. Items
are appended with ``append_linear`` (S32), so every writer's items land on one
path, and every read first takes in what other writers appended. The session
is opened without crash repair: the SDK pairs its own tool calls and outputs,
and a result the SDK did not add must never appear in its history.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from threadline import durable
from threadline.ai import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.durable import DurableAgent
from threadline.errors import AgentError, StoreError
from threadline.session import (
    CustomEntry,
    Entry,
    LinearStore,
    MessageEntry,
    Store,
    register_custom,
)
from threadline.stores import open_store

try:
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "threadline.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'threadline[openai-agents]'"
    ) from exc

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["ITEM_KIND", "ThreadlineSession"]

ITEM_KIND = "openai_agents.item"
"""The custom entry kind that holds one SDK item."""


class _Item(msgspec.Struct, frozen=True):
    item: dict[str, Any]


register_custom(ITEM_KIND, _Item)


class ThreadlineSession:
    """An Agents SDK ``Session`` kept in a threadline session of the same id.

    Pass it as ``Runner.run(agent, input, session=...)``. It can be used from
    any thread and event loop. ``agent()`` gives the threadline view of the
    same session (tree, branches, fork, compaction, export).
    """

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._store = store
        self._owns_store = False
        self._closed = False
        self._agent: DurableAgent | None = None
        self._guard = threading.Lock()

    @classmethod
    def from_url(
        cls, session_id: str, url: str, *, session_settings: SessionSettings | None = None,
    ) -> ThreadlineSession:
        """A session in the store ``url`` names (see ``stores.open_store``);
        ``close()`` closes that store."""
        session = cls(session_id, open_store(url), session_settings=session_settings)
        session._owns_store = True
        return session

    async def agent(self) -> DurableAgent:
        """The durable agent over this session (opened on first use, no repair)."""
        if self._closed:
            raise StoreError(f"session {self.session_id!r}: the ThreadlineSession is closed",
                             session_id=self.session_id)
        agent = self._agent
        if agent is None:
            opened = await durable.open(None, store=self._store, session_id=self.session_id,
                                        repair=False)
            with self._guard:  # two threads may open at once: keep one agent
                if self._agent is None:
                    self._agent = opened
                agent = self._agent
        return agent

    # -- the Session protocol ----------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items on the active path, oldest first; ``limit`` keeps the latest ones."""
        agent = await self.agent()
        await agent.refresh()
        items = [entry.data.item for entry in _item_entries(agent.path())]
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and n >= 0:  # a negative limit means no limit, as in SQLiteSession
            items = items[-n:] if n else []
        return [_copy(item) for item in items]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after the last item any writer added, in one write."""
        agent = await self.agent()
        if not items:
            return
        names = _tool_names(agent.path())
        entries: list[Entry] = []
        for n, item in enumerate(items):
            try:
                stored = msgspec.json.decode(msgspec.json.encode(item))
            except (msgspec.EncodeError, TypeError) as exc:
                raise AgentError(
                    f"session {self.session_id!r}: item {n} of add_items is not JSON "
                    f"({type(item).__name__}: {exc}); nothing was added") from exc
            if not isinstance(stored, dict):
                raise AgentError(f"session {self.session_id!r}: item {n} of add_items is a "
                                 f"{type(item).__name__}, not an item; nothing was added")
            entries.append(CustomEntry(kind=ITEM_KIND, data=_Item(stored)))
            message = to_message(stored, names)
            if message is not None:
                entries.append(MessageEntry(message=message))
        if isinstance(agent.store, LinearStore):
            await agent.append_linear(*entries)
        else:
            await agent.append(*entries)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take the latest item off the active path; it stays in the log (S31)."""
        agent = await self.agent()
        await agent.refresh()
        last = next(reversed(_item_entries(agent.path())), None)
        if last is None:
            return None
        await agent.branch_to(last.parent_id)
        popped: TResponseInputItem = _copy(last.data.item)
        return popped

    async def clear_session(self) -> None:
        """Start the active path afresh; every earlier item stays in the log.

        To erase the session for real, use the store's ``delete_session``.
        """
        agent = await self.agent()
        await agent.refresh()
        if _item_entries(agent.path()):
            await agent.branch_to(None)

    async def close(self) -> None:
        """Close the store if this session opened it (``from_url``); else nothing."""
        if not self._owns_store or self._closed:
            return
        self._closed = True
        closer = getattr(self._store, "close", None)
        if closer is not None:
            await closer()


def _item_entries(path: Sequence[Entry]) -> list[CustomEntry[_Item]]:
    return [e for e in path
            if isinstance(e, CustomEntry) and e.kind == ITEM_KIND and isinstance(e.data, _Item)]


def _copy(item: dict[str, Any]) -> Any:
    # The caller owns what it is given: mutating it must not change the history.
    return msgspec.json.decode(msgspec.json.encode(item))


def _tool_names(path: Sequence[Entry]) -> dict[str, str]:
    names: dict[str, str] = {}
    for entry in path:
        if isinstance(entry, MessageEntry) and isinstance(entry.message, AssistantMessage):
            names.update((call.id, call.name) for call in entry.message.tool_calls)
    return names


def to_message(item: dict[str, Any], tool_names: dict[str, str]) -> Message | None:
    """The threadline message ``item`` reads as, or None for an item type with none.

    ``tool_names`` maps call ids to tool names; a function call adds to it.
    """
    kind = item.get("type", "message")
    role = item.get("role")
    if kind == "message" and role == "user":
        text = _text(item.get("content"))
        return UserMessage.of(text) if text is not None else None
    if kind == "message" and role == "assistant":
        text = _text(item.get("content"))
        return AssistantMessage(content=(TextPart(text=text),)) if text is not None else None
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            return None
        tool_names[call_id] = name
        return AssistantMessage(content=(ToolCall(id=call_id, name=name,
                                                  arguments=_arguments(item.get("arguments"))),),
                                stop_reason="tool_use")
    if kind == "function_call_output":
        call_id = item.get("call_id")
        text = _text(item.get("output"))
        if not isinstance(call_id, str) or text is None:
            return None
        return ToolResultMessage(tool_call_id=call_id, tool_name=tool_names.get(call_id, ""),
                                 content=(TextPart(text=text),))
    return None


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if p.get("type") != "refusal" else p.get("refusal")
                 for p in content if isinstance(p, dict)]
        texts = [p for p in parts if isinstance(p, str)]
        return "".join(texts) if texts else None
    return None


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_value": parsed}
    return {}
