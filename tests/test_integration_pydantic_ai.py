"""pydantic-ai history in a threadline session, with pydantic-ai's offline models.

Runs use ``TestModel`` and ``FunctionModel`` (no network); histories cross
a process restart and every store; what loads back is compared with what
pydantic-ai produced.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
)
from pydantic_ai.models.test import TestModel

from support.cli import tl
from support.stores import StoreSpec, close
from threadline.ai import AssistantMessage, ToolResultMessage, UserMessage
from threadline.errors import AgentError
from threadline.integrations.pydantic_ai import PydanticAIHistory
from threadline.stores import FileStore, MemoryStore

HERE = Path(__file__).resolve().parent


def weather_agent() -> Agent[None, str]:
    agent = Agent(TestModel())

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"sunny in {city}"

    return agent


def dumped(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def test_history_round_trips_losslessly_on_every_store(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    history = await PydanticAIHistory.open(store, "pai-1")
    agent = weather_agent()
    first = await agent.run("weather?", message_history=history.messages())
    await history.save(first.new_messages())
    second = await agent.run("again", message_history=history.messages())
    await history.save(second.new_messages())
    again = await PydanticAIHistory.open(store_spec.open(), "pai-1")
    assert dumped(again.messages()) == dumped(second.all_messages())
    assert again.messages() == second.all_messages()
    # The readable messages: prompt, tool call, tool return, answer; then the second turn.
    kinds = [type(m).__name__ for m in again.agent.messages()]
    assert kinds[:5] == ["UserMessage", "AssistantMessage", "ToolResultMessage",
                         "AssistantMessage", "UserMessage"]
    assert kinds[-1] == "AssistantMessage"
    await close(store)


CHILD = """
import asyncio, sys
sys.path.insert(0, {here!r})
from support.pydantic_agents import remembering_agent
from threadline.integrations.pydantic_ai import PydanticAIHistory
from threadline.stores import FileStore

async def main():
    history = await PydanticAIHistory.open(FileStore(sys.argv[1]), "pai-restart")
    result = await remembering_agent().run(sys.argv[2], message_history=history.messages())
    await history.save(result.new_messages())
    print(result.output)

asyncio.run(main())
"""


def test_history_survives_a_process_restart(tmp_path: Path) -> None:
    def turn(prompt: str) -> str:
        done = subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE)),
                               str(tmp_path), prompt], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert turn("weather in Oslo?") == "seen: weather in Oslo?"
    assert turn("and now?") == "seen: weather in Oslo? | and now?"
    shown = tl("show", "pai-restart", "--store", str(tmp_path)).stdout
    assert "weather in Oslo?" in shown and "snow in Oslo" in shown

    async def check() -> None:
        history = await PydanticAIHistory.open(FileStore(tmp_path), "pai-restart")
        messages = history.agent.messages()
        assert isinstance(messages[1], AssistantMessage)
        assert messages[1].tool_calls[0].arguments == {"city": "Oslo"}
        assert isinstance(messages[2], ToolResultMessage)
        assert messages[2].tool_name == "weather"
        assert len(history.messages()) == 6

    asyncio.run(check())


async def test_rewind_and_fork_keep_every_message() -> None:
    store = MemoryStore()
    history = await PydanticAIHistory.open(store, "pai-branch")
    agent = Agent(TestModel(custom_output_text="ok"))
    for prompt in ("one", "two"):
        result = await agent.run(prompt, message_history=history.messages())
        await history.save(result.new_messages())
    assert len(history.messages()) == 4
    await history.rewind(2)  # back to after "one"'s answer
    reopened = await PydanticAIHistory.open(store, "pai-branch")
    assert len(reopened.messages()) == 2
    result = await agent.run("three", message_history=reopened.messages())
    await reopened.save(result.new_messages())
    texts = [m.text for m in reopened.agent.messages() if isinstance(m, UserMessage)]
    assert texts == ["one", "three"]
    child = await reopened.fork("pai-child")
    assert child.messages() == reopened.messages()
    assert len(reopened.agent.tree.leaves()) == 2  # "two" is still there, on its branch
    with pytest.raises(AgentError, match="cannot keep 9"):
        await reopened.rewind(9)


async def test_what_is_not_a_message_is_refused_whole() -> None:
    history = await PydanticAIHistory.open(MemoryStore(), "pai-bad")
    with pytest.raises(AgentError, match="not pydantic-ai messages"):
        await history.save([object()])  # type: ignore[list-item]
    assert history.agent.entries == []
