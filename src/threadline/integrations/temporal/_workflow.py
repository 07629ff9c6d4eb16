"""The conversation workflow: two strings of state, the transcript in threadline.

The workflow holds the session id and the leaf id. Each user message it is
given becomes an exchange: a model activity, then one activity per tool call
the reply asked for, then the model again, until a reply asks for nothing.
Calls held for approval wait for a ``decide`` signal, recorded in the log by
an activity before the call runs. What the workflow's history records per
step is those ids, so it does not grow with the conversation.

This module imports nothing but ``temporalio`` and the standard library, so
the workflow sandbox loads it cheaply and no threadline code runs inside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

__all__ = [
    "CallInfo",
    "ConversationInput",
    "ConversationState",
    "ConversationWorkflow",
    "Decision",
    "DecisionInput",
    "ModelTurnInput",
    "ToolCallInput",
    "TurnResult",
]

MODEL_TURN = "threadline.model_turn"
TOOL_CALL = "threadline.tool_call"
DECIDE = "threadline.decide"

T = TypeVar("T")


@dataclass
class ConversationInput:
    """How a conversation workflow starts (and how continue-as-new restarts it)."""

    session_id: str
    leaf_id: str | None = None
    """The entry to continue after; None for a new session or the first message."""
    messages: list[str] = field(default_factory=list)
    """User messages to answer, in order, before those sent with ``say``."""
    until_idle: bool = False
    """Finish when no message is waiting (else wait for ``say`` until ``close``)."""
    exchanges_per_run: int = 100
    """Continue as new after this many exchanges (sooner if the server suggests it)."""
    max_model_turns: int = 50
    """Model calls per exchange before it stops asking for tools' results."""
    step_timeout: float = 300.0
    """Seconds one activity attempt may take (``start_to_close_timeout``)."""
    retry_interval: float = 1.0
    """Seconds before the first retry of a failed activity; doubled each time, up to 60."""


@dataclass
class ConversationState:
    session_id: str
    leaf_id: str | None


@dataclass
class Decision:
    """The ``decide`` signal's payload: a human's verdict on a held call."""

    call_id: str
    approved: bool
    reason: str = ""
    by: str = ""


@dataclass
class ModelTurnInput:
    session_id: str
    leaf_id: str | None
    text: str | None = None


@dataclass
class CallInfo:
    call_id: str
    tool_name: str
    idempotency_key: str
    needs_approval: bool = False


@dataclass
class TurnResult:
    leaf_id: str
    calls: list[CallInfo] = field(default_factory=list)
    stop_reason: str = "stop"


@dataclass
class ToolCallInput:
    session_id: str
    leaf_id: str
    call_id: str
    tool_name: str
    idempotency_key: str


@dataclass
class DecisionInput:
    session_id: str
    leaf_id: str
    call_id: str
    approved: bool
    reason: str = ""
    by: str = ""


@workflow.defn(name="threadline.Conversation")
class ConversationWorkflow:
    """A threadline conversation run turn by turn (activities: ``ConversationActivities``)."""

    def __init__(self) -> None:
        self._inbox: list[str] = []
        self._decisions: dict[str, Decision] = {}
        self._awaiting: list[str] = []
        self._closing = False
        self._state = ConversationState("", None)

    @workflow.run
    async def run(self, params: ConversationInput) -> ConversationState:
        self._inbox[:0] = params.messages  # before any ``say`` that came with the start
        self._state = ConversationState(params.session_id, params.leaf_id)
        for _ in range(params.exchanges_per_run):
            await workflow.wait_condition(
                lambda: bool(self._inbox) or self._closing or params.until_idle)
            if not self._inbox:
                return self._state
            await self._exchange(params, self._inbox.pop(0))
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(dataclasses.replace(
            params, leaf_id=self._state.leaf_id, messages=list(self._inbox)))

    @workflow.signal
    def say(self, text: str) -> None:
        """A user message, answered after those before it."""
        self._inbox.append(text)

    @workflow.signal
    def decide(self, decision: Decision) -> None:
        """Approve or deny a held call (see ``awaiting_approval``)."""
        self._decisions.setdefault(decision.call_id, decision)

    @workflow.signal
    def close(self) -> None:
        """Finish once the messages already sent are answered."""
        self._closing = True

    @workflow.query
    def state(self) -> ConversationState:
        return self._state

    @workflow.query
    def awaiting_approval(self) -> list[str]:
        """Ids of the calls waiting for a ``decide`` signal."""
        return list(self._awaiting)

    async def _exchange(self, params: ConversationInput, text: str | None) -> None:
        sid = self._state.session_id
        for _ in range(params.max_model_turns):
            turn = await self._step(params, MODEL_TURN, ModelTurnInput(
                sid, self._state.leaf_id, text), TurnResult, "model")
            text = None
            self._state.leaf_id = turn.leaf_id
            if not turn.calls:
                return
            held = [c for c in turn.calls if c.needs_approval]
            for call in (c for c in turn.calls if not c.needs_approval):
                await self._call(params, call)
            for call in held:
                await self._decided(params, call)
                await self._call(params, call)

    async def _decided(self, params: ConversationInput, call: CallInfo) -> None:
        self._awaiting.append(call.call_id)
        await workflow.wait_condition(lambda: call.call_id in self._decisions)
        self._awaiting.remove(call.call_id)
        d = self._decisions.pop(call.call_id)
        assert self._state.leaf_id is not None
        self._state.leaf_id = await self._step(params, DECIDE, DecisionInput(
            self._state.session_id, self._state.leaf_id, call.call_id, d.approved, d.reason,
            d.by), str, f"{'approve' if d.approved else 'deny'} {call.tool_name}")

    async def _call(self, params: ConversationInput, call: CallInfo) -> None:
        assert self._state.leaf_id is not None
        self._state.leaf_id = await self._step(params, TOOL_CALL, ToolCallInput(
            self._state.session_id, self._state.leaf_id, call.call_id, call.tool_name,
            call.idempotency_key), str, f"{call.tool_name} key {call.idempotency_key}")

    async def _step(self, params: ConversationInput, name: str, arg: object,
                       result_type: type[T], summary: str) -> T:
        result: T = await workflow.execute_activity(
            name, arg, result_type=result_type, summary=summary,
            start_to_close_timeout=timedelta(seconds=params.step_timeout),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=params.retry_interval),
                                     maximum_interval=timedelta(seconds=60)))
        return result
