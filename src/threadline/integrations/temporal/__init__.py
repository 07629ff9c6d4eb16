"""threadline conversations as Temporal workflows (extra ``[temporal]``).

The workflow keeps a session id and a leaf id; the transcript stays in a
threadline store. A worker registers ``ConversationWorkflow`` and the
activities of a ``ConversationActivities``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import temporalio  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "threadline.integrations.temporal needs the Temporal SDK: "
        "pip install 'threadline[temporal]'"
    ) from exc

from threadline.integrations.temporal._workflow import (
    ConversationInput,
    ConversationState,
    ConversationWorkflow,
    Decision,
)

if TYPE_CHECKING:
    from threadline.integrations.temporal._activities import ConversationActivities

__all__ = [
    "ConversationActivities",
    "ConversationInput",
    "ConversationState",
    "ConversationWorkflow",
    "Decision",
]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the workflow sandbox, which imports this
    # package to reach the workflow, loads no threadline code beyond it.
    if name == "ConversationActivities":
        from threadline.integrations.temporal._activities import ConversationActivities

        return ConversationActivities
    raise AttributeError(f"module 'threadline.integrations.temporal' has no attribute {name!r}")
