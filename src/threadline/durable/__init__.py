"""The durable agent: a session that survives crashes, with receipts for every event."""

from __future__ import annotations

from threadline.agent._subprocess import subprocess
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
from threadline.durable._events import (
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
)
from threadline.durable._factory import ModelFactory, model
from threadline.durable._repair import orphaned_results

__all__ = [
    "CompactionPlan",
    "CompactionPolicy",
    "DurableAgent",
    "Factory",
    "LifecycleEvent",
    "ModelFactory",
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
    "estimate_context_tokens",
    "estimate_path",
    "estimate_tokens",
    "find_cut_point",
    "model",
    "open",
    "orphaned_results",
    "plan_compaction",
    "subprocess",
    "summarize",
]
