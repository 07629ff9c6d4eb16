"""threadline conversation turns as DBOS workflow steps.

A ``DBOSConversation`` registers two workflows with DBOS, ``exchange`` (one
user message answered) and ``conversation`` (several, in order), whose
steps are threadline's: the model turn, each tool call, each recorded
decision. DBOS checkpoints each step's small result (the new leaf id and
the calls' ids) in its system database; the transcript stays in the
threadline store. A step's entries get ids derived from the workflow id and
the step's id, so a step that DBOS runs again after recovering a workflow
whose process died finds what it stored before and stores nothing twice.

Calls held for approval wait for a message on the topic ``decide:<call id>``
(``decide`` sends one); the ids of the calls waiting are the workflow's
``awaiting_approval`` event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dbos import DBOS

from threadline.ai import LanguageModel, Tool
from threadline.durable._effects import ApprovalRule
from threadline.integrations._steps import FINAL_ERRORS, Steps, Turn
from threadline.stores import Store

__all__ = ["AWAITING_APPROVAL", "DBOSConversation", "Decision", "decide"]

AWAITING_APPROVAL = "awaiting_approval"
"""The workflow event naming the calls that wait for a decision."""


@dataclass(frozen=True)
class Decision:
    """What ``decide`` sends a workflow: a human's verdict on a held call."""

    approved: bool
    reason: str = ""
    by: str = ""


def _worth_retrying(exc: BaseException) -> bool:
    return not isinstance(exc, FINAL_ERRORS)


def _step_key() -> str:
    return f"dbos\0{DBOS.workflow_id}\0{DBOS.step_id}"


class DBOSConversation:
    """The workflows and steps of a threadline conversation, registered with DBOS.

    Built like ``durable.model``: a model, its tools, a system prompt, plus the
    store that keeps the transcripts and an optional agent-wide approval rule;
    ``options`` go to the agent loop. Make it before ``DBOS.launch()``, in every
    process that runs or recovers these workflows, with the same ``name``.
    """

    def __init__(self, store: Store, lm: LanguageModel,
                 tools: Iterable[Tool | Callable[..., Any]] = (), *, system: str | None = None,
                 approval: ApprovalRule | None = None, name: str = "threadline",
                 max_model_turns: int = 50, **options: Any) -> None:
        steps = Steps(store, lm, tools, system=system, approval=approval, **options)

        retried: dict[str, Any] = {"retries_allowed": True, "max_attempts": 6,
                                   "should_retry": _worth_retrying}

        @DBOS.step(name=f"{name}.model_turn", **retried)
        async def model_turn(session_id: str, leaf_id: str | None, text: str | None) -> Turn:
            return await steps.model_turn(_step_key(), session_id, leaf_id, text)

        @DBOS.step(name=f"{name}.tool_call", **retried)
        async def tool_call(session_id: str, leaf_id: str, call_id: str,
                            idempotency_key: str) -> str:
            return await steps.tool_call(_step_key(), session_id, leaf_id, call_id,
                                         idempotency_key)

        @DBOS.step(name=f"{name}.decide", **retried)
        async def decide(session_id: str, leaf_id: str, call_id: str,
                         decision: Decision) -> str:
            return await steps.decide(_step_key(), session_id, leaf_id, call_id,
                                      approved=decision.approved, reason=decision.reason,
                                      by=decision.by)

        flow = _Flow(model_turn, tool_call, decide, max_model_turns)

        @DBOS.workflow(name=f"{name}.exchange")
        async def exchange(session_id: str, leaf_id: str | None, text: str) -> str:
            """Answer one user message after ``leaf_id``; the new leaf."""
            return await flow.answer(session_id, leaf_id, text)

        @DBOS.workflow(name=f"{name}.conversation")
        async def conversation(session_id: str, leaf_id: str | None,
                               messages: Sequence[str]) -> str | None:
            """Answer ``messages`` in order after ``leaf_id``; the new leaf."""
            for text in messages:
                leaf_id = await flow.answer(session_id, leaf_id, text)
            return leaf_id

        self.exchange = exchange
        self.conversation = conversation


class _Flow:
    """One exchange: model turns and their calls, until a reply asks for nothing."""

    def __init__(self, model_turn: Callable[..., Any], tool_call: Callable[..., Any],
                 decide: Callable[..., Any], max_model_turns: int) -> None:
        self.model_turn, self.tool_call, self.decide = model_turn, tool_call, decide
        self.max_model_turns = max_model_turns

    async def answer(self, session_id: str, leaf_id: str | None, text: str) -> str:
        leaf = leaf_id
        said: str | None = text
        for _ in range(self.max_model_turns):
            turn: Turn = await self.model_turn(session_id, leaf, said)
            leaf, said = turn.leaf_id, None
            for call in (c for c in turn.calls if not c.needs_approval):
                leaf = await self.tool_call(session_id, leaf, call.call_id, call.idempotency_key)
            held = [c for c in turn.calls if c.needs_approval]
            for i, call in enumerate(held):
                await DBOS.set_event_async(AWAITING_APPROVAL, [c.call_id for c in held[i:]])
                decision = None
                while not isinstance(decision, Decision):  # recv gives None on its timeout
                    decision = await DBOS.recv_async(f"decide:{call.call_id}", 3600)
                leaf = await self.decide(session_id, leaf, call.call_id, decision)
                leaf = await self.tool_call(session_id, leaf, call.call_id, call.idempotency_key)
            if held:
                await DBOS.set_event_async(AWAITING_APPROVAL, [])
            if not turn.calls:
                break
        assert leaf is not None
        return leaf


async def decide(workflow_id: str, call_id: str, *, approved: bool, reason: str = "",
                 by: str = "") -> None:
    """Approve or deny a call that the workflow ``workflow_id`` holds for a decision."""
    await DBOS.send_async(workflow_id, Decision(approved, reason, by), f"decide:{call_id}")
