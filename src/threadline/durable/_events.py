"""What the durable agent reports: run receipts (S11) and lifecycle events (S13)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from threadline.agent._events import AgentEvent, MessageEnd
from threadline.session._entries import CompactionEntry, CustomEntry, Entry

__all__ = [
    "ApprovalRequested",
    "LifecycleEvent",
    "Publisher",
    "PublisherLike",
    "RunEvent",
    "RunStarted",
    "SessionBranched",
    "SessionCompacted",
    "SessionForked",
    "SessionInit",
    "StoredMessageEnd",
    "ToolCallInDoubt",
]


@dataclass(frozen=True, slots=True)
class RunStarted:
    """First event of every durable run: the input is already stored."""

    session_id: str
    entries: tuple[Entry, ...]
    type: Literal["run_started"] = "run_started"


@dataclass(frozen=True, slots=True)
class StoredMessageEnd(MessageEnd):
    """A ``MessageEnd`` whose message is already in the store, as ``entries``."""

    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """A call is held for a human decision; ``entry`` (the request) is already stored.

    The run ends after this turn: its ``AgentEnd.stop_reason`` is
    ``"awaiting_approval"``. Decide with ``approve`` / ``deny`` from any process,
    then continue with ``continue_run()``.
    """

    session_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    entry: CustomEntry[Any]
    type: Literal["approval_requested"] = "approval_requested"


@dataclass(frozen=True, slots=True)
class ToolCallInDoubt:
    """``continue_run`` met a call that started but has no result, and dealt with it.

    ``outcome``: ``rerun`` (replay="safe"), ``reconciled`` (``reconcile`` found
    the effect), ``not_happened`` (``reconcile`` found none; the call runs),
    ``unknown`` (it got the "outcome unknown" result).
    """

    session_id: str
    call_id: str
    tool_name: str
    idempotency_key: str
    outcome: Literal["rerun", "reconciled", "not_happened", "unknown"]
    type: Literal["tool_call_in_doubt"] = "tool_call_in_doubt"


RunEvent: TypeAlias = (
    AgentEvent | RunStarted | StoredMessageEnd | ApprovalRequested | ToolCallInDoubt
)


@dataclass(frozen=True, slots=True)
class SessionInit:
    """A session was created (by ``open``, or as a fork's child)."""

    session_id: str
    parent_id: str | None
    type: Literal["session_init"] = "session_init"


@dataclass(frozen=True, slots=True)
class SessionBranched:
    """The in-memory leaf moved; the next append continues from ``to_id``."""

    session_id: str
    from_id: str | None
    to_id: str | None
    type: Literal["session_branched"] = "session_branched"


@dataclass(frozen=True, slots=True)
class SessionForked:
    """``session_id``'s active path was copied into the new session ``child_id``."""

    session_id: str
    child_id: str
    leaf_id: str | None
    entries_copied: int
    type: Literal["session_forked"] = "session_forked"


@dataclass(frozen=True, slots=True)
class SessionCompacted:
    session_id: str
    entry: CompactionEntry
    type: Literal["session_compacted"] = "session_compacted"


LifecycleEvent: TypeAlias = SessionInit | SessionBranched | SessionForked | SessionCompacted


@runtime_checkable
class Publisher(Protocol):
    """Receives lifecycle events after their effect is stored.

    Called synchronously on the mutating call's path, outside the agent's lock:
    keep it fast, hand slow work to a queue.
    """

    def publish(self, event: LifecycleEvent) -> None: ...


PublisherLike: TypeAlias = Publisher | Callable[[LifecycleEvent], None]
