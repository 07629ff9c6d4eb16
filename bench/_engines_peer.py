"""The peer of bench/engines.py: pydantic-ai's Temporal integration holding the conversation.

A workflow keeps the message history and passes it to ``agent.run`` each
turn, so every model activity carries the conversation so far. Imported
only when the benchmark runs: it needs pydantic-ai and temporalio.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import AgentPlugin, TemporalDurability
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio import workflow

# The workflow sandbox imports this module afresh; the benchmark's own module
# (the tools both sides share) is used from outside it as it is.
with workflow.unsafe.imports_passed_through():
    from bench.engines import answer, lookup, pay


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    parts = messages[-1].parts
    returns = [p for p in parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(answer([str(p.content) for p in returns]))])
    order = str(next(p for p in parts if isinstance(p, UserPromptPart)).content)
    return ModelResponse(parts=[
        ToolCallPart("pay", {"order": order}, tool_call_id=f"pay-{order}"),
        ToolCallPart("lookup", {"order": order}, tool_call_id=f"lookup-{order}")])


AGENT: Agent[None, str] = Agent(
    FunctionModel(_reply), name="bench", tools=[pay, lookup],
    capabilities=[TemporalDurability(activity_config=workflow.ActivityConfig(
        start_to_close_timeout=timedelta(seconds=60)))])


def agent_plugin() -> Any:
    return AgentPlugin(AGENT)


@workflow.defn(name="PydanticAIConversation")
class Conversation:
    @workflow.run
    async def run(self, prompts: list[str]) -> str:
        history: list[ModelMessage] = []
        output = ""
        for prompt in prompts:
            result = await AGENT.run(prompt, message_history=history)
            history, output = result.all_messages(), result.output
        return output
