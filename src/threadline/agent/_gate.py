"""The seam through which a durable agent watches each tool call of the loop.

The loop knows nothing about storage; a ``ToolGate`` passed to
``AgentLoop.run`` is asked about every valid call before it runs (``admit``)
and just before its function is called (``begin``). The durable agent's
effect ledger (``threadline.durable``) is the gate that matters; without one
the loop runs every call directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from threadline.ai._messages import AssistantMessage, ToolCall, ToolResultMessage
from threadline.ai._model import ModelInfo, Request
from threadline.ai._tools import Tool, ToolContext, ToolResult

__all__ = ["BeforeModelCall", "Pause", "ResumeTurn", "ToolGate"]

BeforeModelCall: TypeAlias = Callable[[Request, ModelInfo], Awaitable[BaseException | None]]
"""Asked before each model call of a run (the durable agent's budget): an
exception ends the run there, as ``AgentEnd.error``, with no call made."""


@dataclass(frozen=True, slots=True)
class Pause:
    """``admit``'s answer for a call that must wait (for a human decision)."""

    reason: str = "awaiting approval"


@dataclass(frozen=True, slots=True)
class ResumeTurn:
    """A turn cut short: its stored assistant message and the calls still to answer.

    ``AgentLoop.run(..., resume=...)`` starts with this turn's tool phase
    instead of a model call; the context already holds the message and the
    results it has.
    """

    message: AssistantMessage
    calls: Sequence[ToolCall]


class ToolGate(Protocol):
    """Watches each tool call of a run.

    The loop puts every call of an assistant message to ``admit`` before it
    runs any of them (the arguments validated first), and calls ``begin``
    for each right before its function. A gate may also have a ``passive``
    attribute: while it is true the gate has nothing to do, and the loop
    validates the message's calls up front as for any gate but calls
    neither method (each is a coroutine per call).
    """

    async def admit(
        self, call: ToolCall, tool: Tool, arguments: dict[str, Any]
    ) -> ToolResult | ToolResultMessage | Pause | None:
        """None runs the call; a result answers it without running; Pause holds it."""
        ...

    async def begin(self, call: ToolCall, tool: Tool) -> ToolContext:
        """Called right before the tool's function; its errors end the run."""
        ...
