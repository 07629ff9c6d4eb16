"""Factories: how a durable agent gets its inner loop for each run (S3)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from threadline.agent._loop import AgentLoop
from threadline.ai._model import LanguageModel
from threadline.ai._tools import Tool

__all__ = ["ModelFactory", "model"]


class ModelFactory:
    """Builds an ``AgentLoop`` over one model, its tools and system prompt per run."""

    def __init__(
        self,
        lm: LanguageModel,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        system: str | None = None,
        **options: Any,
    ) -> None:
        self.lm = lm
        self.tools = list(tools)
        self.system = system
        self.options = options
        self()  # fail now, not at the first run, on a bad tool or option

    def __call__(self) -> AgentLoop:
        return AgentLoop(self.lm, self.tools, system=self.system, **self.options)

    def __repr__(self) -> str:
        return f"durable.model({self.lm.info.provider}:{self.lm.info.id})"


def model(
    lm: LanguageModel,
    tools: Iterable[Tool | Callable[..., Any]] = (),
    *,
    system: str | None = None,
    **options: Any,
) -> ModelFactory:
    """The factory for the ordinary case: one model, its tools, a system prompt.

    ``options`` go to ``AgentLoop`` (``max_turns``, ``parallel_tools``,
    ``before_tool_call``, ``after_tool_call``, ``max_tokens``, ``temperature``,
    ``reasoning_effort``).
    """
    return ModelFactory(lm, tools, system=system, **options)
