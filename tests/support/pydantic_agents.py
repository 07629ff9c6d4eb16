"""A Pydantic AI agent on a function model, for tests and their child processes."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def remembering_agent() -> Agent[None, str]:
    """Calls a tool on the first prompt; later says how many prompts it has seen."""
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [p.content for m in messages for p in m.parts
                   if getattr(p, "part_kind", "") == "user-prompt"]
        returned = any(getattr(p, "part_kind", "") == "tool-return" for p in messages[-1].parts)
        if len(prompts) == 1 and not returned:
            return ModelResponse(parts=[ToolCallPart("weather", {"city": "Oslo"}, "c1")])
        return ModelResponse(parts=[TextPart(f"seen: {' | '.join(map(str, prompts))}")])

    agent = Agent(FunctionModel(respond))

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"snow in {city}"

    return agent
