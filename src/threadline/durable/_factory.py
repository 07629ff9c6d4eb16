"""Factories: how a durable agent gets its inner loop for each run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

from threadline.agent._events import Loop
from threadline.agent._loop import AgentLoop
from threadline.ai._model import LanguageModel
from threadline.ai._tools import Tool

__all__ = ["Factory", "model"]

Factory: TypeAlias = Callable[[], Loop]
"""Builds the inner loop for one run."""


def model(
    lm: LanguageModel,
    tools: Iterable[Tool | Callable[..., Any]] = (),
    *,
    system: str | None = None,
    **options: Any,
) -> Factory:
    """The factory for the ordinary case: one model, its tools, a system prompt.

    ``options`` go to ``AgentLoop`` (``max_turns``, ``parallel_tools``,
    ``before_tool_call``, ``after_tool_call``, ``max_tokens``, ``temperature``,
    ``reasoning_effort``). A bad tool or option fails here, not at the first run.
    """
    return _ModelFactory(lm, list(tools), system, options)


class _ModelFactory:
    # ``lm`` is read by automatic compaction: the run's own model writes the summary.
    __slots__ = ("lm", "options", "system", "tools")

    def __init__(self, lm: LanguageModel, tools: list[Tool | Callable[..., Any]],
                 system: str | None, options: dict[str, Any]) -> None:
        self.lm = lm
        self.tools = tools
        self.system = system
        self.options = options
        self()

    def __call__(self) -> AgentLoop:
        return AgentLoop(self.lm, self.tools, system=self.system, **self.options)

    def __repr__(self) -> str:
        return f"durable.model({self.lm.info.provider}:{self.lm.info.id})"
