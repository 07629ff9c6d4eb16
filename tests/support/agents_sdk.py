"""An OpenAI Agents SDK agent on the wire server, for tests and their child processes."""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def make_agent(url: str) -> Agent[Any]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
    return Agent(name="helper", instructions="Be brief.", tools=[weather],
                 model=OpenAIChatCompletionsModel(model="m", openai_client=client))
