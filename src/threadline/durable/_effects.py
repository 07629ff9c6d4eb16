"""Durable tool execution: the effect ledger, replay, resume, approvals.

A tool call's life is written as custom entries between its assistant message
and its result, so every store keeps them unchanged and the model never sees
them:

- ``threadline.tool_plan``, in the same append as the assistant message: the
  calls the ledger tracks (tools that declare side effects, calls that need
  approval). Crash repair leaves tracked calls to ``continue_run``.
- ``threadline.approval_requested``, in that same append, for each call a
  rule holds for a human.
- ``threadline.approval_decided``: ``approve`` / ``deny``, from any process.
  The first decision for a request in log order counts; a later one is kept
  but inert, and the call that wrote it gets ``DecisionConflict``.
- ``threadline.tool_started``: one durable append right before a tracked
  tool's function runs, carrying the call's idempotency key.

On ``continue_run`` the open calls of the stored turn at the leaf are
classified: never started ones run; in-doubt ones (started, no result)
follow their tool's ``replay`` policy: ``"safe"`` runs again with the
same key, ``"never"`` asks ``reconcile(key)`` or gets an "outcome unknown"
result. Every call still gets exactly one result.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias

import msgspec

from threadline.agent._gate import Pause, ResumeTurn
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._tools import Tool, ToolContext, ToolResult
from threadline.durable._events import ApprovalRequested, RunEvent, ToolCallInDoubt
from threadline.errors import (
    AgentError,
    ApprovalError,
    DecisionConflict,
    SessionNotFound,
    StoreError,
    ThreadlineError,
)
from threadline.session._context import build_context
from threadline.session._entries import CustomEntry, Entry, MessageEntry, register_custom
from threadline.session._tree import TreeIndex, TreeView
from threadline.stores._contract import Store

__all__ = [
    "APPROVAL_DECIDED",
    "APPROVAL_REQUESTED",
    "TOOL_PLAN",
    "TOOL_STARTED",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalRule",
    "CallState",
    "Ledger",
    "PendingApproval",
    "PendingApprovals",
    "PlainGate",
    "SessionView",
    "ToolPlan",
    "ToolStarted",
    "describe_record",
    "nothing_to_track",
    "pending_approvals",
]

TOOL_PLAN = "threadline.tool_plan"
TOOL_STARTED = "threadline.tool_started"
APPROVAL_REQUESTED = "threadline.approval_requested"
APPROVAL_DECIDED = "threadline.approval_decided"


class ToolPlan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    calls: tuple[str, ...]
    """Ids of the assistant message's calls the ledger tracks."""


class ToolStarted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    call_id: str
    tool_name: str
    idempotency_key: str
    attempt: int = 1


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    call_id: str
    tool_name: str
    arguments: dict[str, Any] = {}
    reason: str = ""


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    call_id: str
    request_id: str
    """Id of the ``approval_requested`` entry decided."""
    approved: bool
    reason: str = ""
    by: str = ""


register_custom(TOOL_PLAN, ToolPlan)
register_custom(TOOL_STARTED, ToolStarted)
register_custom(APPROVAL_REQUESTED, ApprovalRequest)
register_custom(APPROVAL_DECIDED, ApprovalDecision)

ApprovalRule: TypeAlias = Callable[[ToolCall], Any]
"""Agent-wide rule: given a call, true or a reason string to hold it for approval."""


class SessionView(Protocol):
    """What the ledger reads of the durable agent it serves: the session as loaded.

    The ledger changes nothing in it. What it writes goes through the
    ``Append`` it is handed; taking in what other processes wrote is the
    agent's own business (it reloads before and after a decision).
    """

    @property
    def session_id(self) -> str: ...

    @property
    def leaf_id(self) -> str | None: ...

    @property
    def tree(self) -> TreeView: ...

    def path(self) -> list[Entry]: ...


Append: TypeAlias = Callable[[Sequence[Entry]], Awaitable[list[Entry]]]
"""Stores entries chained after the leaf, which moves to the last; gives them as stored."""

Status: TypeAlias = Literal[
    "answered", "awaiting_approval", "denied", "never_started", "in_doubt"
]

UNKNOWN_TEXT = (
    "The outcome of this tool call is unknown: the process stopped after the tool started and "
    "before it reported a result, and the tool may not be re-run automatically. Do not call it "
    "again blindly, because its effect may already have happened. Check first (idempotency key "
    "{key}) or ask the user."
)
DENIED_TEXT = "A human denied this tool call, so it did not run. Reason: {reason}"


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A call held for a human decision."""

    session_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    request_id: str
    requested_at: datetime


@dataclass(frozen=True, slots=True)
class CallState:
    """What the log says about one call of the turn at the leaf."""

    call: ToolCall
    status: Status
    idempotency_key: str
    tracked: bool
    attempts: int
    """Started records for this call's key, on any branch loaded."""
    request: CustomEntry[Any] | None = None
    decision: CustomEntry[Any] | None = None


def idempotency_key(assistant_entry_id: str, call_id: str) -> str:
    """Stable for a call: the stored assistant message that made it, and its id.

    Entry ids are unique across sessions, so the session needs no part; a
    fork's copy keeps the source id as ``origin_id`` and so keeps the key.
    """
    digest = hashlib.sha256(f"{assistant_entry_id}\0{call_id}".encode())
    return digest.hexdigest()[:32]


def _record(entry: Entry, kind: str) -> Any:
    if isinstance(entry, CustomEntry) and entry.kind == kind:
        return entry.data
    return None


class _Turn:
    """The stored turn at the leaf: its assistant message and everything after it."""

    __slots__ = ("after", "assistant")

    def __init__(self, assistant: MessageEntry, after: list[Entry]) -> None:
        self.assistant = assistant
        self.after = after

    @property
    def message(self) -> AssistantMessage:
        message = self.assistant.message
        assert isinstance(message, AssistantMessage)
        return message

    def results(self) -> dict[str, ToolResultMessage]:
        out: dict[str, ToolResultMessage] = {}
        for entry in self.after:
            if isinstance(entry, MessageEntry) and isinstance(entry.message, ToolResultMessage):
                out.setdefault(entry.message.tool_call_id, entry.message)
        return out

    def tracked(self) -> set[str]:
        out: set[str] = set()
        for entry in self.after:
            plan = _record(entry, TOOL_PLAN)
            if plan is not None:
                out.update(plan.calls)
        return out

    def keys(self) -> dict[str, str]:
        """Call id -> the key its started records carry (a fork keeps them)."""
        out: dict[str, str] = {}
        for entry in self.after:
            started = _record(entry, TOOL_STARTED)
            if started is not None:
                out.setdefault(started.call_id, started.idempotency_key)
        return out

    def requests(self) -> dict[str, CustomEntry[Any]]:
        out: dict[str, CustomEntry[Any]] = {}
        for entry in self.after:
            if _record(entry, APPROVAL_REQUESTED) is not None:
                assert isinstance(entry, CustomEntry)
                out.setdefault(entry.data.call_id, entry)
        return out


def _tip(tree: TreeView) -> _Turn | None:
    """The turn at the leaf, if only its results and ledger records follow it."""
    after: list[Entry] = []
    entry_id = tree.leaf_id
    while entry_id is not None:
        entry = tree.get(entry_id)
        if isinstance(entry, MessageEntry):
            message = entry.message
            if isinstance(message, AssistantMessage):
                after.reverse()
                return _Turn(entry, after)
            if not isinstance(message, ToolResultMessage):
                return None
        elif not isinstance(entry, CustomEntry):
            return None
        after.append(entry)
        entry_id = entry.parent_id
    return None


class _Index:
    """Started records by key and first decisions by request, over every loaded branch."""

    __slots__ = ("decisions", "started")

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.started: dict[str, int] = {}
        self.decisions: dict[str, CustomEntry[Any]] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        started = _record(entry, TOOL_STARTED)
        if started is not None:
            key = started.idempotency_key
            self.started[key] = self.started.get(key, 0) + 1
            return
        decision = _record(entry, APPROVAL_DECIDED)
        if decision is not None:
            assert isinstance(entry, CustomEntry)
            self.decisions.setdefault(decision.request_id, entry)  # first in log order wins


class _Tables:
    """What the turn's entries say, read once for all of its calls."""

    __slots__ = ("keys", "requests", "results", "tracked")

    def __init__(self, turn: _Turn) -> None:
        self.results = turn.results()
        self.tracked = turn.tracked()
        self.requests = turn.requests()
        self.keys = turn.keys()


def _states(session_id: str, turn: _Turn, index: _Index) -> list[CallState]:
    tables = _Tables(turn)
    return [_call_state(turn, call, index, tables) for call in turn.message.tool_calls]


def _call_state(turn: _Turn, call: ToolCall, index: _Index, tables: _Tables) -> CallState:
    results, tracked, requests = tables.results, tables.tracked, tables.requests
    key = tables.keys.get(call.id) or idempotency_key(
        turn.assistant.origin_id or turn.assistant.id, call.id)
    request = requests.get(call.id)
    decision = None
    if request is not None:
        # A fork's copy of a decision still names the request it copied.
        decision = index.decisions.get(request.id) or (
            index.decisions.get(request.origin_id) if request.origin_id else None)
    attempts = index.started.get(key, 0)
    status: Status
    if call.id in results:
        status = "answered"
    elif request is not None and decision is None:
        status = "awaiting_approval"
    elif decision is not None and not decision.data.approved:
        status = "denied"
    elif attempts:
        status = "in_doubt"
    else:
        status = "never_started"
    return CallState(call, status, key, call.id in tracked or request is not None,
                     attempts, request, decision)


def call_states(session: SessionView) -> list[CallState]:
    """The calls of the turn at the leaf, classified."""
    turn = _tip(session.tree)
    if turn is None or turn.message.stop_reason in ("error", "aborted"):
        return []
    return _states(session.session_id, turn, _index_for(session.tree, turn))


_NO_INDEX = _Index(())


def _index_for(tree: TreeView, turn: _Turn) -> _Index:
    # Reading every branch costs a pass over the session; a turn the ledger
    # does not track (the common case) needs none of it.
    return _Index(tree) if turn.tracked() or turn.requests() else _Index(())


def held_calls(path: Sequence[Entry]) -> set[str]:
    """Calls on ``path`` crash repair must leave to the ledger: tracked and unanswered."""
    held: set[str] = set()
    for entry in path:
        plan = _record(entry, TOOL_PLAN)
        if plan is not None:
            held.update(plan.calls)
        request = _record(entry, APPROVAL_REQUESTED)
        if request is not None:
            held.add(request.call_id)
        if isinstance(entry, MessageEntry) and isinstance(entry.message, ToolResultMessage):
            held.discard(entry.message.tool_call_id)
    return held


def check_settled(session: SessionView) -> None:
    """A new run may not leave tracked calls at the leaf behind unanswered."""
    open_calls = [s for s in call_states(session) if s.tracked and s.status != "answered"]
    if open_calls:
        names = ", ".join(f"{s.call.id} ({s.status.replace('_', ' ')})" for s in open_calls)
        raise AgentError(
            f"session {session.session_id!r} has tool calls left open at its leaf: {names}; "
            "decide the pending approvals and continue that run first"
        )


def pending(session: SessionView) -> list[PendingApproval]:
    return [_pending(session.session_id, s) for s in call_states(session)
            if s.status == "awaiting_approval"]


def in_doubt(session: SessionView) -> list[CallState]:
    """Calls whose effect may or may not have happened: still open, or answered "unknown"."""
    out = [s for s in call_states(session) if s.status == "in_doubt"]
    index = _Index(session.tree)
    started: dict[str, str] = {}  # call id -> key, of started records on the path
    calls: dict[str, ToolCall] = {}  # call id -> the latest call on the path with that id
    for entry in session.path():
        record = _record(entry, TOOL_STARTED)
        if record is not None:
            started[record.call_id] = record.idempotency_key
        if not isinstance(entry, MessageEntry):
            continue
        if isinstance(entry.message, AssistantMessage):
            calls.update((c.id, c) for c in entry.message.tool_calls)
            continue
        if not isinstance(entry.message, ToolResultMessage):
            continue
        result = entry.message
        details = result.details if isinstance(result.details, dict) else {}
        # "Outcome unknown" from continue_run, or a started call the run's
        # own abort answered before the tool could report.
        unknown = details.get("outcome") == "unknown" or (
            result.synthesized is not None and result.tool_call_id in started)
        if unknown:
            key = str(details.get("idempotency_key") or started.get(result.tool_call_id, ""))
            # The call as the model made it, arguments included: an operator
            # needs to see which order, and how much.
            call = calls.get(result.tool_call_id) or ToolCall(id=result.tool_call_id,
                                                              name=result.tool_name)
            out.append(CallState(call, "answered", key, True, index.started.get(key, 0)))
    return out


def _pending(session_id: str, state: CallState) -> PendingApproval:
    request = state.request
    assert request is not None
    data: ApprovalRequest = request.data
    return PendingApproval(session_id, data.call_id, data.tool_name, dict(data.arguments),
                           data.reason, request.id, request.timestamp)


class PendingApprovals(list[PendingApproval]):
    """The calls ``pending_approvals`` found, plus the sessions it could not read.

    ``problems`` holds one ``StoreError`` per session that could not be
    looked at (a log the store cannot load, a log whose tree the ledger
    cannot follow, a named session that does not exist), each naming its
    session in ``session_id``: one odd session never hides the others'
    approvals.
    """

    __slots__ = ("problems",)

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[StoreError] = []


async def pending_approvals(store: Store, session_ids: Sequence[str] | None = None
                            ) -> PendingApprovals:
    """Calls awaiting a decision at the leaf of each session (all listed ones by default)."""
    named = session_ids is not None
    if session_ids is None:
        lister = getattr(store, "list_sessions", None)
        if lister is None:
            raise AgentError(
                f"{type(store).__name__} cannot list sessions; name the sessions to look in"
            )
        session_ids = []
        cursor: str | None = None
        while True:
            page = await lister(cursor=cursor)
            session_ids.extend(r.id for r in page.sessions)
            cursor = page.next_cursor
            if cursor is None:
                break
    out = PendingApprovals()
    for sid in session_ids:
        try:
            entries = await store.load_entries(sid)
            tree = TreeIndex(entries, session_id=sid)
            turn = _tip(tree)
            if turn is None:
                continue
            out.extend(_pending(sid, s) for s in _states(sid, turn, _Index(entries))
                       if s.status == "awaiting_approval")
        except SessionNotFound as exc:
            if named:  # a listed session deleted since is simply gone
                out.problems.append(exc)
        except StoreError as exc:
            out.problems.append(exc)
        except ThreadlineError as exc:  # an entry whose parent is not in the log, ...
            problem = StoreError(f"session {sid!r}: the log cannot be followed to its leaf: "
                                 f"{exc}", session_id=sid)
            problem.__cause__ = exc
            out.problems.append(problem)
    return out


def decision_for(session: SessionView, call_id: str, *, approved: bool, reason: str,
                 by: str) -> CustomEntry[ApprovalDecision]:
    """The entry deciding ``call_id``'s pending request, to append at the leaf.

    ``session`` is just reloaded; a call that is not pending gets ``ApprovalError``.
    """
    states = [s for s in call_states(session) if s.call.id == call_id]
    sid = session.session_id
    if not states or states[0].request is None:
        raise ApprovalError(
            f"session {sid!r}: call {call_id!r} {_why_not_pending(session, call_id)}")
    state = states[0]
    request = state.request
    assert request is not None
    if state.decision is not None:
        raise ApprovalError(f"session {sid!r}: call {call_id!r} was already "
                            f"{_verdict(state.decision)} (entry {state.decision.id})")
    if state.status == "answered":
        raise ApprovalError(f"session {sid!r}: call {call_id!r} already has a result")
    return CustomEntry(kind=APPROVAL_DECIDED, data=ApprovalDecision(
        call_id=call_id, request_id=request.id, approved=approved, reason=reason, by=by))


def check_first(session: SessionView, mine: Entry) -> None:
    """``DecisionConflict`` unless ``mine``, a stored decision, is its request's first.

    ``session`` is reloaded after ``mine`` was stored: another process may
    have decided between the load and the append, and the log's order is
    the same for every reader.
    """
    assert isinstance(mine, CustomEntry)
    data: ApprovalDecision = mine.data
    winner = _Index(session.tree).decisions[data.request_id]
    if winner.id != mine.id:
        raise DecisionConflict(
            f"session {session.session_id!r}: call {data.call_id!r} was {_verdict(winner)} "
            f"first (entry {winner.id}); this decision is recorded as entry {mine.id} but "
            "has no effect",
            winner,
        )


def _why_not_pending(session: SessionView, call_id: str) -> str:
    """Why a call outside the turn at the leaf cannot be decided, for the error."""
    request = next((e for e in reversed(session.path())
                    if (r := _record(e, APPROVAL_REQUESTED)) is not None
                    and r.call_id == call_id), None)
    if request is None:
        return "has no approval request at the leaf"
    decision = _Index(session.tree).decisions.get(request.id)
    settled = f"was already {_verdict(decision)} (entry {decision.id})" if decision else \
        "was answered without a decision"
    return f"{settled}, and the conversation has moved on"


def _verdict(decision: CustomEntry[Any]) -> str:
    data: ApprovalDecision = decision.data
    who = f" by {data.by}" if data.by else ""
    return ("approved" if data.approved else "denied") + who


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _PlainTurn:
    """A turn at the leaf that tracks none of its calls."""

    __slots__ = ("call_ids", "keys", "turn")

    def __init__(self, turn: _Turn) -> None:
        self.turn = turn
        # A turn the run just stored has nothing after it: no records to read.
        self.keys = turn.keys() if turn.after else {}
        self.call_ids = {p.id for p in turn.message.content if isinstance(p, ToolCall)}

    def key(self, call_id: str) -> str:
        assistant = self.turn.assistant
        return self.keys.get(call_id) or idempotency_key(
            assistant.origin_id or assistant.id, call_id)


def nothing_to_track(tools: dict[str, Tool], rule: ApprovalRule | None) -> bool:
    """Whether a fresh run of these tools needs no ledger, only a ``PlainGate``.

    True when no call can be tracked (no agent-wide rule; no tool with side
    effects or an approval rule) and no tool can see its ``ToolContext``
    (none declares one, none overrides ``execute``): the ledger would write
    no record and compute idempotency keys nobody reads. A resumed run always
    has its ledger, since the stored turn may hold records of other tools.
    """
    return rule is None and all(
        not tool.side_effects and not tool.approval and not _sees_context(tool)
        for tool in tools.values())


def _sees_context(tool: Tool) -> bool:
    """Whether ``tool`` can read the ``ToolContext`` it is given (else nobody can)."""
    return tool._context_param is not None or type(tool).execute is not Tool.execute


class PlainGate:
    """The gate of a run with nothing to track: every call runs, unrecorded.

    A gate all the same: the loop then validates every call of a message
    before running any, right after the message's receipt is put, so (as
    under the ledger) the consumer, which runs only once the pump waits, does
    not get to change the arguments a tool runs with. Once the run's tools
    change so that a call can be tracked, the pump gives it a ``ledger``
    before the message is stored, and every call from then on goes through it.
    """

    __slots__ = ("ledger",)

    def __init__(self) -> None:
        self.ledger: Ledger | None = None

    @property
    def passive(self) -> bool:
        """True until the run takes its ledger: the loop then only validates (ToolGate)."""
        return self.ledger is None

    async def admit(self, call: ToolCall, tool: Tool,
                    arguments: dict[str, Any]) -> ToolResult | ToolResultMessage | Pause | None:
        if self.ledger is not None:
            return await self.ledger.admit(call, tool, arguments)
        return None

    async def begin(self, call: ToolCall, tool: Tool) -> ToolContext:
        if self.ledger is not None:
            return await self.ledger.begin(call, tool)
        # No tool of the run reads it (nothing_to_track).
        return ToolContext(call_id=call.id, tool_name=call.name, idempotency_key=call.id)


class Ledger:
    """The ``ToolGate`` a durable run gives its loop: writes and reads the records."""

    def __init__(self, session: SessionView, append: Append, tools: dict[str, Tool],
                 rule: ApprovalRule | None) -> None:
        self._session = session
        self._append = append
        self._tools = tools
        self._rule = rule
        self._index: _Index | None = None
        self.notices: list[RunEvent] = []
        """Events for the run to forward after the one in progress (``drain``)."""
        self._lock = asyncio.Lock()
        self._plain: tuple[str | None, _PlainTurn | None] | None = None
        """(leaf id, the untracked turn at that leaf or None), for ``_untracked_turn``."""

    def drain(self) -> list[RunEvent]:
        out, self.notices = self.notices, []
        return out

    async def records_for(self, message: Message) -> list[Entry]:
        """Ledger entries stored in the same append as an assistant message."""
        if not isinstance(message, AssistantMessage) or message.stop_reason in (
            "error", "aborted"
        ):
            return []
        tracked: list[str] = []
        requests: list[Entry] = []
        for call in message.tool_calls:
            tool = self._tools.get(call.name)
            if tool is None or self._never_tracked(tool):
                continue
            try:
                kwargs = tool.validate(call.arguments)
            except msgspec.ValidationError:
                continue  # answered as invalid; it never runs
            reason = await self._needs_approval(call, tool, kwargs)
            if reason is not None:
                requests.append(CustomEntry(kind=APPROVAL_REQUESTED, data=ApprovalRequest(
                    call_id=call.id, tool_name=call.name, arguments=dict(call.arguments),
                    reason=reason)))
            if tool.side_effects or reason is not None:
                tracked.append(call.id)
        if not tracked:
            return []
        return [CustomEntry(kind=TOOL_PLAN, data=ToolPlan(calls=tuple(tracked))), *requests]

    def _never_tracked(self, tool: Tool) -> bool:
        """No side effects and no approval rule: no record, whatever its arguments."""
        return (self._rule is None and not tool.side_effects and not callable(tool.approval)
                and not tool.approval)

    def stored(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            request = _record(entry, APPROVAL_REQUESTED)
            if request is not None:
                assert isinstance(entry, CustomEntry)
                self.notices.append(ApprovalRequested(
                    session_id=self._session.session_id, call_id=request.call_id,
                    tool_name=request.tool_name, arguments=dict(request.arguments),
                    reason=request.reason, entry=entry))

    async def _needs_approval(self, call: ToolCall, tool: Tool,
                              kwargs: dict[str, Any]) -> str | None:
        verdicts: list[Any] = []
        try:
            if callable(tool.approval):
                verdicts.append(await _resolve(tool.approval(kwargs)))
            else:
                verdicts.append(tool.approval)
            if self._rule is not None:
                verdicts.append(await _resolve(self._rule(call)))
        except Exception as exc:  # a broken rule holds the call rather than let it through
            return f"the approval rule failed ({type(exc).__name__}: {exc})"
        for verdict in verdicts:
            if isinstance(verdict, str) and verdict:
                return verdict
            if verdict:
                return f"{call.name} needs approval"
        return None

    def _state(self, call: ToolCall) -> CallState | None:
        turn = _tip(self._session.tree)
        if turn is None:
            return None
        made = next((c for c in turn.message.tool_calls if c.id == call.id), None)
        if made is None:
            return None
        tables = _Tables(turn)
        if self._index is None and (tables.tracked or tables.requests):
            self._index = _Index(self._session.tree)
        return _call_state(turn, made, self._index or _NO_INDEX, tables)

    def _untracked_turn(self) -> _PlainTurn | None:
        """The turn at the leaf if nothing in it is tracked (no plan, no request).

        Its calls just run, unrecorded: the ledger need not classify them (most
        calls), only give them their keys. Worked out once per leaf: such a
        turn writes nothing, so its calls all find the same leaf.
        """
        leaf = self._session.leaf_id
        cached = self._plain
        if cached is not None and cached[0] == leaf:
            return cached[1]
        turn = _tip(self._session.tree)
        plain = None
        # Nothing after its message (the turn the run just stored): no plan, no request.
        if turn is not None and (not turn.after or not (turn.tracked() or turn.requests())):
            plain = _PlainTurn(turn)
        self._plain = (leaf, plain)
        return plain

    async def admit(self, call: ToolCall, tool: Tool,
                    arguments: dict[str, Any]) -> ToolResult | ToolResultMessage | Pause | None:
        if self._untracked_turn() is not None:
            return None
        state = self._state(call)
        if state is None or not state.tracked:
            return None
        if state.status == "awaiting_approval":
            return Pause()
        if state.status == "denied":
            assert state.decision is not None
            data: ApprovalDecision = state.decision.data
            return ToolResult.error(DENIED_TEXT.format(reason=data.reason or "none given"),
                                    details={"approval": "denied", "by": data.by})
        if state.status != "in_doubt":
            return None
        key = state.idempotency_key
        if tool.replay == "safe":
            self._notice(state, "rerun")
            return None
        if tool.reconcile is not None:
            try:
                found = await _resolve(tool.reconcile(key))
            except Exception as exc:
                self._notice(state, "unknown")
                return self._unknown(call, key, f"reconcile failed: {type(exc).__name__}: {exc}")
            if found is None:
                self._notice(state, "not_happened")
                return None  # reconcile says no effect: running it now is still at most once
            self._notice(state, "reconciled")
            result = ToolResult.of(found)
            return ToolResult(result.content, {"outcome": "reconciled",
                                               "idempotency_key": key}, result.is_error)
        self._notice(state, "unknown")
        return self._unknown(call, key, None)

    def _unknown(self, call: ToolCall, key: str, note: str | None) -> ToolResultMessage:
        text = UNKNOWN_TEXT.format(key=key)
        details: dict[str, Any] = {"outcome": "unknown", "idempotency_key": key}
        if note:
            details["note"] = note
        return ToolResultMessage(tool_call_id=call.id, tool_name=call.name,
                                 content=(TextPart(text=text),), is_error=True,
                                 details=details, synthesized="interrupted")

    def _notice(self, state: CallState, outcome: Any) -> None:
        self.notices.append(ToolCallInDoubt(
            session_id=self._session.session_id, call_id=state.call.id,
            tool_name=state.call.name, idempotency_key=state.idempotency_key, outcome=outcome))

    async def begin(self, call: ToolCall, tool: Tool) -> ToolContext:
        sid = self._session.session_id
        plain = self._untracked_turn()
        if plain is not None and self._index is None and call.id in plain.call_ids:
            # Nothing is recorded for it, and no started record can name its key;
            # a tool that cannot read the key does not need it worked out.
            key = plain.key(call.id) if _sees_context(tool) else call.id
            return ToolContext(call_id=call.id, tool_name=call.name,
                               idempotency_key=key, session_id=sid, attempt=1)
        state = self._state(call)
        if state is None:
            return ToolContext(call_id=call.id, tool_name=call.name, idempotency_key=call.id,
                               session_id=sid)
        attempt = state.attempts + 1
        if state.tracked:
            record = CustomEntry(kind=TOOL_STARTED, data=ToolStarted(
                call_id=call.id, tool_name=call.name, idempotency_key=state.idempotency_key,
                attempt=attempt))
            # Parallel calls append one at a time, each after the last: the
            # records must stay on one path. The run holds the agent's lock,
            # so the ledger's appends are the only ones in flight.
            async with self._lock:
                written = await self._append([record])
            if self._index is not None:
                for entry in written:
                    self._index.add(entry)
        return ToolContext(call_id=call.id, tool_name=call.name,
                           idempotency_key=state.idempotency_key, session_id=sid,
                           attempt=attempt)


def resume_plan(session: SessionView) -> tuple[list[Message], ResumeTurn | None] | None:
    """What ``continue_run`` continues from: (context, turn to finish), or None if nothing.

    The context leaves out the synthesized results ``build_context`` would put
    in for the calls still to be answered; the loop appends their real ones.
    """
    path = session.path()
    turn = _tip(session.tree)
    context = build_context(path)
    if turn is None:
        last = next((e for e in reversed(path) if isinstance(e, MessageEntry)), None)
        if last is not None and isinstance(last.message, UserMessage):
            return context, None  # the input is stored; the model never answered
        return None
    message = turn.message
    if message.stop_reason in ("error", "aborted") or not message.tool_calls:
        return None
    states = call_states(session)
    open_calls = [s.call for s in states if s.status != "answered"]
    if not open_calls:
        return context, None  # every call answered: the model's next turn is due
    ids = {c.id for c in open_calls}
    trimmed = [m for m in context if not (isinstance(m, ToolResultMessage)
                                         and m.synthesized and m.tool_call_id in ids)]
    return trimmed, ResumeTurn(message, open_calls)


def describe_record(entry: Entry) -> str | None:
    """One line for a ledger entry (for ``show`` and ``tree``), or None if not one."""
    if not isinstance(entry, CustomEntry):
        return None
    data = entry.data
    if entry.kind == TOOL_PLAN and isinstance(data, ToolPlan):
        return "tracked calls: " + ", ".join(data.calls)
    if entry.kind == TOOL_STARTED and isinstance(data, ToolStarted):
        return (f"started {data.tool_name} call {data.call_id} (attempt {data.attempt}, "
                f"key {data.idempotency_key})")
    if entry.kind == APPROVAL_REQUESTED and isinstance(data, ApprovalRequest):
        args = msgspec.json.encode(data.arguments).decode()
        return f"approval requested for {data.tool_name} call {data.call_id} {args}: {data.reason}"
    if entry.kind == APPROVAL_DECIDED and isinstance(data, ApprovalDecision):
        verdict = "approved" if data.approved else "denied"
        who = f" by {data.by}" if data.by else ""
        why = f": {data.reason}" if data.reason else ""
        return f"{verdict} call {data.call_id}{who}{why}"
    return None
