"""The conversation workflow's activities: each a threadline step on a worker's store.

An activity's entries get ids derived from its workflow id, run id and
activity id, the same in every attempt, so an attempt that follows one the
worker's death cut short finds what that one stored and stores nothing
twice. Errors that another attempt cannot fix (a leaf that is not in the
session, a decision for a call that is not held) fail the activity for good.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from threadline.ai import LanguageModel, Tool
from threadline.durable._effects import ApprovalRule
from threadline.integrations._steps import FINAL_ERRORS, Steps
from threadline.integrations.temporal._workflow import (
    DECIDE,
    MODEL_TURN,
    TOOL_CALL,
    CallInfo,
    DecisionInput,
    ModelTurnInput,
    ToolCallInput,
    TurnResult,
)
from threadline.stores import Store

__all__ = ["ConversationActivities"]


def _step_key() -> str:
    info = activity.info()
    return (f"temporal\0{info.workflow_namespace}\0{info.workflow_id}\0"
            f"{info.workflow_run_id}\0{info.activity_id}")


class ConversationActivities:
    """The activities a worker registers for ``ConversationWorkflow``.

    Built like ``durable.model``: a model, its tools, a system prompt, plus
    the store that keeps the transcripts and an optional agent-wide approval
    rule. ``options`` go to the agent loop (``max_tokens``, ``temperature``,
    ``before_tool_call``, ...). Pass ``activities`` to the ``Worker``.
    """

    def __init__(self, store: Store, lm: LanguageModel,
                 tools: Iterable[Tool | Callable[..., Any]] = (), *, system: str | None = None,
                 approval: ApprovalRule | None = None, **options: Any) -> None:
        self._steps = Steps(store, lm, tools, system=system, approval=approval, **options)

    @property
    def activities(self) -> list[Callable[..., Any]]:
        return [self.model_turn, self.tool_call, self.decide]

    @activity.defn(name=MODEL_TURN)
    async def model_turn(self, args: ModelTurnInput) -> TurnResult:
        """Context from the leaf, one model call, and its reply stored with its ledger records."""
        try:
            turn = await self._steps.model_turn(_step_key(), args.session_id, args.leaf_id,
                                                args.text)
        except FINAL_ERRORS as exc:
            raise _final(exc) from exc
        return TurnResult(turn.leaf_id, [CallInfo(c.call_id, c.tool_name, c.idempotency_key,
                                                  c.needs_approval) for c in turn.calls],
                          turn.stop_reason)

    @activity.defn(name=TOOL_CALL)
    async def tool_call(self, args: ToolCallInput) -> str:
        """One call through the effect ledger, its result stored; the new leaf."""
        try:
            return await self._steps.tool_call(_step_key(), args.session_id, args.leaf_id,
                                               args.call_id, args.idempotency_key)
        except FINAL_ERRORS as exc:
            raise _final(exc) from exc

    @activity.defn(name=DECIDE)
    async def decide(self, args: DecisionInput) -> str:
        """A decision on a held call, recorded after the leaf; the new leaf."""
        try:
            return await self._steps.decide(_step_key(), args.session_id, args.leaf_id,
                                            args.call_id, approved=args.approved,
                                            reason=args.reason, by=args.by)
        except FINAL_ERRORS as exc:
            raise _final(exc) from exc


def _final(exc: Exception) -> ApplicationError:
    return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)
