"""The durable agent: a session that survives crashes, with receipts for every event."""

from __future__ import annotations

from threadline.durable.agent import DurableAgent, Factory, PublishError, Run, RunInput, open
from threadline.durable.events import (
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
)
from threadline.durable.factory import ModelFactory, model
from threadline.durable.repair import orphaned_results
from threadline.durable.subprocess_loop import SubprocessLoop, subprocess

__all__ = [
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
    "SessionForked",
    "SessionInit",
    "StoredMessageEnd",
    "SubprocessLoop",
    "model",
    "open",
    "orphaned_results",
    "subprocess",
]
