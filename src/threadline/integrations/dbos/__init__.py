"""threadline conversations as DBOS workflows (extra ``[dbos]``).

DBOS checkpoints each step's leaf id in its system database; the transcript
stays in a threadline store.
"""

from __future__ import annotations

try:
    import dbos  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "threadline.integrations.dbos needs DBOS Transact: pip install 'threadline[dbos]'"
    ) from exc

from threadline.integrations.dbos._conversation import (
    AWAITING_APPROVAL,
    DBOSConversation,
    Decision,
    decide,
)

__all__ = ["AWAITING_APPROVAL", "DBOSConversation", "Decision", "decide"]
