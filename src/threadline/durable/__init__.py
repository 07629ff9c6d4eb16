"""The durable agent: a session that survives crashes, with receipts for every event."""

from __future__ import annotations

from threadline.durable._agent import DurableAgent, Factory, PublishError, Run, RunInput, open
from threadline.durable._compaction import (
    CompactionPlan,
    CompactionPolicy,
    TokenEstimate,
    estimate_context_tokens,
    estimate_path,
    estimate_tokens,
    find_cut_point,
    plan_compaction,
    summarize,
)
from threadline.durable._effects import (
    ApprovalDecision,
    ApprovalRequest,
    CallState,
    PendingApproval,
    ToolPlan,
    ToolStarted,
    pending_approvals,
)
from threadline.durable._events import (
    ApprovalRequested,
    LifecycleEvent,
    Publisher,
    PublisherLike,
    RunEvent,
    RunStarted,
    SessionBranched,
    SessionCompacted,
    SessionForked,
    SessionInit,
    StoredMessageEnd,
    ToolCallInDoubt,
)
from threadline.durable._factory import ModelFactory, model
from threadline.durable._repair import orphaned_results
from threadline.durable._subprocess_loop import SubprocessFactory, SubprocessLoop, subprocess

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalRequested",
    "CallState",
    "CompactionPlan",
    "CompactionPolicy",
    "DurableAgent",
    "Factory",
    "LifecycleEvent",
    "ModelFactory",
    "PendingApproval",
    "PublishError",
    "Publisher",
    "PublisherLike",
    "Run",
    "RunEvent",
    "RunInput",
    "RunStarted",
    "SessionBranched",
    "SessionCompacted",
    "SessionForked",
    "SessionInit",
    "StoredMessageEnd",
    "SubprocessFactory",
    "SubprocessLoop",
    "TokenEstimate",
    "ToolCallInDoubt",
    "ToolPlan",
    "ToolStarted",
    "estimate_context_tokens",
    "estimate_path",
    "estimate_tokens",
    "find_cut_point",
    "model",
    "open",
    "orphaned_results",
    "pending_approvals",
    "plan_compaction",
    "subprocess",
    "summarize",
]
