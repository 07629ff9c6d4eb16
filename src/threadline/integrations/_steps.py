"""The steps a durable-execution engine runs for a conversation, shared by its integrations.

An engine (Temporal, DBOS) keeps two strings per conversation, the session
id and the leaf id; threadline keeps the transcript. Each step takes those
two strings, does one thing, appends what it produced after the leaf, and
returns the new leaf and a few ids:

- ``model_turn``: builds the context on the path to the leaf, calls the model
  once, and stores the input (if any), the assistant message and the effect
  ledger's records for its calls in one append;
- ``tool_call``: runs one call of the turn at the leaf through the effect
  ledger (its started record, replay policy and approval decision), and
  stores its result;
- ``decide``: records a human decision on a held call.

A step's entries get ids derived from a key the engine gives it (its
workflow, run and step), so a step that is retried, or replayed after the
process running it died, finds what an earlier attempt stored and returns
that: nothing is stored twice and a stored model reply is never asked for
again. An append whose acknowledgement was lost is retried with the same
bytes, which the stores acknowledge without storing it again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from threadline.agent._events import AgentEnd, MessageEnd, TurnEnd
from threadline.agent._gate import Pause, ResumeTurn
from threadline.agent._loop import AgentLoop
from threadline.ai._messages import AssistantMessage, Message, ToolResultMessage, UserMessage
from threadline.ai._model import BlobReader, LanguageModel
from threadline.ai._tools import Tool
from threadline.durable import _effects as effects
from threadline.durable._blobs import blob_reader
from threadline.durable._retry import retry_append
from threadline.errors import (
    AgentError,
    AuthenticationError,
    ConfigError,
    InvalidEntry,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
)
from threadline.session._context import build_context
from threadline.session._entries import CustomEntry, Entry, MessageEntry, SessionRecord, utcnow
from threadline.session._tree import TreeIndex, TreeView
from threadline.stores._contract import Store

__all__ = ["FINAL_ERRORS", "Call", "Steps", "Turn", "step_ids"]

FINAL_ERRORS = (AgentError, AuthenticationError, ConfigError, InvalidEntry)
"""Errors another attempt of a step would meet again: the engine should not retry them."""

_NAMESPACE = uuid.UUID("5f0c3a9e-7d1b-4c55-9a53-2e6f1b8d4c21")


def step_ids(step_key: str) -> Callable[[int], str]:
    """The ids of a step's entries: the n-th is the same in every attempt of the step."""
    return lambda n: str(uuid.uuid5(_NAMESPACE, f"{step_key}\0{n}"))


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a stored assistant message, as an engine schedules it."""

    call_id: str
    tool_name: str
    idempotency_key: str
    needs_approval: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    """What a model turn stored: the new leaf and the calls the message asked for."""

    leaf_id: str
    calls: tuple[Call, ...] = ()
    stop_reason: str = "stop"


class _View:
    """The session as a step sees it: the loaded tree, its leaf moved by the step's appends."""

    def __init__(self, store: Store, session_id: str, entries: Iterable[Entry],
                 leaf_id: str | None, ids: Callable[[int], str]) -> None:
        self.store = store
        self.session_id = session_id
        self._tree = TreeIndex(entries, session_id=session_id)
        self._ids = ids
        # A step's own entries from an earlier attempt come after the given leaf.
        self.mine: list[Entry] = []
        while (entry_id := ids(len(self.mine))) in self._tree:
            self.mine.append(self._tree.get(entry_id))
        self._tree.set_leaf(self.mine[-1].id if self.mine else leaf_id)

    @property
    def leaf_id(self) -> str | None:
        return self._tree.leaf_id

    @property
    def tree(self) -> TreeView:
        return self._tree.view()

    def path(self) -> list[Entry]:
        return self._tree.path()

    async def append(self, items: Sequence[Entry | Message]) -> list[Entry]:
        """Store ``items`` after the leaf under the step's next ids; the leaf moves to the last."""
        parent = self._tree.leaf_id
        batch: list[Entry] = []
        for item in items:
            entry_id, now = self._ids(len(self.mine) + len(batch)), utcnow()
            entry: Entry
            if isinstance(item, CustomEntry):
                entry = msgspec.structs.replace(item, id=entry_id, parent_id=parent,
                                                timestamp=now)
            else:
                assert isinstance(item, UserMessage | AssistantMessage | ToolResultMessage)
                entry = MessageEntry(message=item, id=entry_id, parent_id=parent, timestamp=now)
            batch.append(entry)
            parent = entry.id
        try:
            await self.store.append_entries(self.session_id, batch)
        except StoreUnavailable as exc:
            await retry_append(self.store, self.session_id, batch, exc)
        except StoreError as exc:
            if isinstance(exc, SessionNotFound):
                raise
            # Another attempt of this step stored these ids first (it was
            # thought dead but was not): what it stored stands.
            stored = await self._stored(batch)
            if stored is None:
                raise
            batch = stored
        for entry in batch:
            self._tree.add(entry)
        self.mine.extend(batch)
        self._tree.set_leaf(batch[-1].id)
        return batch

    async def _stored(self, batch: list[Entry]) -> list[Entry] | None:
        entries = await self.store.load_entries(self.session_id)
        found = {e.id: e for e in entries if e.id in {b.id for b in batch}}
        if len(found) != len(batch):
            return None
        return [found[b.id] for b in batch]


class _HoldAll:
    """A gate that runs no call: the model step only asks; each call is its own step."""

    async def admit(self, call: Any, tool: Tool, arguments: dict[str, Any]) -> Pause:
        return Pause()

    async def begin(self, call: Any, tool: Tool) -> Any:  # never reached: every call is held
        raise AgentError("a model step runs no tool")


class Steps:
    """The three steps, for one store, model and set of tools (what a worker holds)."""

    def __init__(self, store: Store, lm: LanguageModel, tools: Iterable[Tool | Any] = (), *,
                 system: str | None = None, approval: effects.ApprovalRule | None = None,
                 **options: Any) -> None:
        self.store = store
        self.approval = approval
        self._model = AgentLoop(lm, tools, system=system, max_turns=1, **options)
        self.tools: dict[str, Tool] = self._model.tools

    async def _open(self, session_id: str, leaf_id: str | None, step_key: str) -> _View:
        try:
            entries = await self.store.load_entries(session_id)
        except SessionNotFound:
            if leaf_id is not None:
                raise
            with contextlib.suppress(SessionExists):  # an earlier attempt created it
                await self.store.create_session(SessionRecord(id=session_id, created_at=utcnow()))
            entries = await self.store.load_entries(session_id)
        if leaf_id is not None and not any(e.id == leaf_id for e in entries):
            raise AgentError(f"session {session_id!r} has no entry {leaf_id!r} to continue from")
        return _View(self.store, session_id, entries, leaf_id, step_ids(step_key))

    def _ledger(self, view: _View) -> effects.Ledger:
        return effects.Ledger(view, view.append, self.tools, self.approval)

    async def model_turn(self, step_key: str, session_id: str, leaf_id: str | None,
                         text: str | None = None) -> Turn:
        """Ask the model once from the leaf (after ``text`` as the user's input) and store it."""
        view = await self._open(session_id, leaf_id, step_key)
        if not view.mine:
            context = build_context(view.path())
            inputs: list[Message] = [UserMessage.of(text)] if text is not None else []
            reply = await self._ask(context, inputs, blob_reader(self.store, session_id,
                                                                 view.path))
            records = await self._ledger(view).records_for(reply)
            await view.append([*inputs, reply, *records])
        return self._turn(view)

    async def _ask(self, context: list[Message], inputs: list[Message],
                   blobs: BlobReader) -> AssistantMessage:
        reply: AssistantMessage | None = None
        async for event in self._model.run(context, inputs, gate=_HoldAll(), blobs=blobs):
            if isinstance(event, MessageEnd) and isinstance(event.message, AssistantMessage):
                reply = event.message
            elif isinstance(event, AgentEnd) and event.error is not None:
                # Nothing is stored: the engine retries the step, or gives up, by its policy.
                raise event.error
        assert reply is not None
        return reply

    def _turn(self, view: _View) -> Turn:
        assistant = next(e for e in reversed(view.mine) if isinstance(e, MessageEntry)
                         and isinstance(e.message, AssistantMessage))
        message = assistant.message
        assert isinstance(message, AssistantMessage)
        states = {s.call.id: s for s in effects.call_states(view)}
        calls = tuple(Call(c.id, c.name, effects.idempotency_key(assistant.id, c.id),
                           c.id in states and states[c.id].status == "awaiting_approval")
                      for c in message.tool_calls)
        assert view.leaf_id is not None
        return Turn(view.leaf_id, calls, message.stop_reason)

    async def tool_call(self, step_key: str, session_id: str, leaf_id: str, call_id: str,
                        idempotency_key: str) -> str:
        """Run one call of the turn at the leaf through the effect ledger; the new leaf."""
        view = await self._open(session_id, leaf_id, step_key)
        if not any(isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)
                   for e in view.mine):
            state = next((s for s in effects.call_states(view) if s.call.id == call_id), None)
            if state is None:
                raise AgentError(f"session {session_id!r}: the turn at entry {leaf_id!r} has "
                                 f"no call {call_id!r}")
            if state.idempotency_key != idempotency_key:
                raise AgentError(f"session {session_id!r}: call {call_id!r} has idempotency "
                                 f"key {state.idempotency_key}, not {idempotency_key}")
            if state.status != "answered":
                result = await self._execute(view, state)
                if result is None:
                    raise AgentError(f"session {session_id!r}: call {call_id!r} awaits a "
                                     "decision; record one first")
                await view.append([result])
        assert view.leaf_id is not None
        return view.leaf_id

    async def _execute(self, view: _View, state: effects.CallState) -> ToolResultMessage | None:
        turn = next(e for e in reversed(view.path()) if isinstance(e, MessageEntry)
                    and isinstance(e.message, AssistantMessage))
        message = turn.message
        assert isinstance(message, AssistantMessage)
        context = [m for m in build_context(view.path())
                   if not (isinstance(m, ToolResultMessage) and m.tool_call_id == state.call.id)]
        result: ToolResultMessage | None = None
        events = self._model.run(context, [], gate=self._ledger(view),
                                 resume=ResumeTurn(message, [state.call]))
        async for event in events:
            if isinstance(event, TurnEnd):
                result = next(iter(event.tool_results), None)
        return result

    async def decide(self, step_key: str, session_id: str, leaf_id: str, call_id: str, *,
                     approved: bool, reason: str = "", by: str = "") -> str:
        """Record a decision on a held call at the leaf; the new leaf.

        The call then follows the first decision for it in the log's order
       , which is this one unless another process decided first.
        """
        view = await self._open(session_id, leaf_id, step_key)
        if not view.mine:
            await view.append([effects.decision_for(view, call_id, approved=approved,
                                                    reason=reason, by=by)])
        assert view.leaf_id is not None
        return view.leaf_id
