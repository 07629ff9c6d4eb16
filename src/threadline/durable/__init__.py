"""The durable agent: a session that survives crashes, with receipts for every event."""

from __future__ import annotations

from threadline.agent._subprocess import subprocess
from threadline.durable._agent import DurableAgent, PublishError, Run, RunInput, open
from threadline.durable._compaction import (
    CompactionPlan,
    CompactionPolicy,
    TokenEstimate,
    estimate_path,
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
    SessionCreated,
    SessionForked,
    StoredMessageEnd,
    ToolCallInDoubt,
)
from threadline.durable._factory import Factory, model
from threadline.durable._repair import orphaned_results

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
    "SessionCreated",
    "SessionForked",
    "StoredMessageEnd",
    "TokenEstimate",
    "ToolCallInDoubt",
    "ToolPlan",
    "ToolStarted",
    "estimate_path",
    "model",
    "open",
    "orphaned_results",
    "pending_approvals",
    "plan_compaction",
    "subprocess",
    "summarize",
]
