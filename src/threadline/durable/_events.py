"""What the durable agent reports: run receipts and lifecycle events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from threadline.agent._events import MessageEnd, PassedThrough
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
    "SessionCreated",
    "SessionForked",
    "StoredMessageEnd",
    "ToolCallInDoubt",
]


class _Event(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type"):
    pass


class RunStarted(_Event, frozen=True, tag="run_started"):
    """First event of every durable run: the input is already stored."""

    type: ClassVar[Literal["run_started"]] = "run_started"
    session_id: str
    entries: tuple[Entry, ...]


class StoredMessageEnd(MessageEnd, frozen=True, tag="message_end"):
    """A ``MessageEnd`` whose message is already in the store, as ``entries``.

    A durable run yields only these for ``message_end``, never a plain
    ``MessageEnd``, so ``event.type == "message_end"`` narrows to this class.
    """

    entries: tuple[Entry, ...] = ()


class ApprovalRequested(_Event, frozen=True, tag="approval_requested"):
    """A call is held for a human decision; ``entry`` (the request) is already stored.

    The run ends after this turn: its ``AgentEnd.stop_reason`` is
    ``"awaiting_approval"``. Decide with ``approve`` / ``deny`` from any process,
    then continue with ``continue_run()``.
    """

    type: ClassVar[Literal["approval_requested"]] = "approval_requested"
    session_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    entry: CustomEntry[Any]


class ToolCallInDoubt(_Event, frozen=True, tag="tool_call_in_doubt"):
    """``continue_run`` met a call that started but has no result, and dealt with it.

    ``outcome``: ``rerun`` (replay="safe"), ``reconciled`` (``reconcile`` found
    the effect), ``not_happened`` (``reconcile`` found none; the call runs),
    ``unknown`` (it got the "outcome unknown" result).
    """

    type: ClassVar[Literal["tool_call_in_doubt"]] = "tool_call_in_doubt"
    session_id: str
    call_id: str
    tool_name: str
    idempotency_key: str
    outcome: Literal["rerun", "reconciled", "not_happened", "unknown"]


RunEvent: TypeAlias = (
    PassedThrough | StoredMessageEnd | RunStarted | ApprovalRequested | ToolCallInDoubt
)
"""What a durable run yields: the loop's events, each ``MessageEnd`` as a receipt,
and the tool ledger's notices."""


class SessionCreated(_Event, frozen=True, tag="session_init"):
    """A session was created (by ``open``, or as a fork's child).

    Published as ``session_init``, the lifecycle name DESIGN.md gives it.
    """

    type: ClassVar[Literal["session_init"]] = "session_init"
    session_id: str
    parent_id: str | None


class SessionBranched(_Event, frozen=True, tag="session_branched"):
    """The in-memory leaf moved; the next append continues from ``to_id``."""

    type: ClassVar[Literal["session_branched"]] = "session_branched"
    session_id: str
    from_id: str | None
    to_id: str | None


class SessionForked(_Event, frozen=True, tag="session_forked"):
    """``session_id``'s active path was copied into the new session ``child_id``."""

    type: ClassVar[Literal["session_forked"]] = "session_forked"
    session_id: str
    child_id: str
    leaf_id: str | None
    entries_copied: int


class SessionCompacted(_Event, frozen=True, tag="session_compacted"):
    type: ClassVar[Literal["session_compacted"]] = "session_compacted"
    session_id: str
    entry: CompactionEntry


LifecycleEvent: TypeAlias = SessionCreated | SessionBranched | SessionForked | SessionCompacted


@runtime_checkable
class Publisher(Protocol):
    """Receives lifecycle events after their effect is stored.

    Called synchronously on the mutating call's path, outside the agent's lock:
    keep it fast, hand slow work to a queue.
    """

    def publish(self, event: LifecycleEvent) -> None: ...


PublisherLike: TypeAlias = Publisher | Callable[[LifecycleEvent], None]
