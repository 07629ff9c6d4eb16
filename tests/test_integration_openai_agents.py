"""threadline as an OpenAI Agents SDK session, against the real SDK.

The SDK's documented session behaviour runs over all four stores; writers
are threads with their own event loops and child processes; a real
``Runner.run`` with a tool call talks to the wire-format server on
127.0.0.1; a child process runs a turn and is killed with SIGKILL before the
next, which another process then takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agents import Runner
from agents.memory import Session, SessionSettings

from support.agents_sdk import make_agent
from support.cli import tl
from support.stores import StoreSpec, assert_one_order, close, race, run_threads
from support.wire_server import WireServer, json_reply
from threadline import durable
from threadline.ai import AssistantMessage, ToolResultMessage, UserMessage
from threadline.errors import AgentError, StoreError
from threadline.integrations.openai_agents import ThreadlineSession
from threadline.session import MessageEntry
from threadline.stores import FileStore, MemoryStore, Store

HERE = Path(__file__).resolve().parent


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


CALL = {"type": "function_call", "call_id": "call_1", "name": "weather",
        "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
# No threadline message says this; it must come back all the same.
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
             "text": "think"}], "encrypted_content": "gAAAA\u202e\x00", "n": 1.5}


async def test_is_a_session_and_items_come_back_exactly(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    session = ThreadlineSession("sdk-1", store)
    assert isinstance(session, Session)
    items = [user("weather in Paris?"), CALL, OUTPUT, REASONING, assistant("sunny, 21°C")]
    await session.add_items(items[:2])
    await session.add_items(items[2:])
    assert await session.get_items() == items
    assert await session.get_items(limit=2) == items[-2:]
    assert await session.get_items(limit=0) == []
    got = await session.get_items()
    got[0]["content"] = "changed"  # the caller's copy, not the history
    assert (await session.get_items())[0] == items[0]
    # Another store object, as another process would see it.
    again = ThreadlineSession("sdk-1", store_spec.open(), session_settings=SessionSettings(limit=3))
    assert await again.get_items() == items[-3:]
    assert await again.get_items(limit=1) == items[-1:]
    # Mapped items read as threadline messages too.
    agent = await again.agent()
    messages = agent.messages()
    assert isinstance(messages[0], UserMessage) and messages[0].text == "weather in Paris?"
    assert isinstance(messages[1], AssistantMessage)
    assert messages[1].tool_calls[0].arguments == {"city": "Paris"}
    assert isinstance(messages[2], ToolResultMessage) and messages[2].tool_name == "weather"
    assert messages[-1].text == "sunny, 21°C"  # type: ignore[union-attr]
    assert ThreadlineSession("other", store) is not None
    assert await ThreadlineSession("other", store).get_items() == []  # sessions are apart
    await close(store)


async def test_pop_and_clear_keep_the_log(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    session = ThreadlineSession("sdk-pop", store)
    assert await session.pop_item() is None
    await session.add_items([user("a"), assistant("b"), user("c")])
    assert await session.pop_item() == user("c")
    assert await session.get_items() == [user("a"), assistant("b")]
    await session.add_items([user("d")])
    reopened = ThreadlineSession("sdk-pop", store_spec.open())
    assert await reopened.get_items() == [user("a"), assistant("b"), user("d")]
    await reopened.clear_session()
    assert await reopened.get_items() == []
    assert await session.get_items() == []  # the first object sees the clear too
    await session.add_items([user("e")])
    assert await ThreadlineSession("sdk-pop", store_spec.open()).get_items() == [user("e")]
    # Everything is still in the log: the popped "c" included.
    agent = await durable.open(None, store=store, session_id="sdk-pop", repair=False)
    stored = [e.message.text for e in agent.entries if isinstance(e, MessageEntry)]
    assert stored == ["a", "b", "c", "d", "e"]
    await close(store)


def test_popped_item_is_recoverable_in_another_process_and_shown_by_tree(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"

    async def write() -> None:
        session = ThreadlineSession("sdk-tree", FileStore(root))
        await session.add_items([user("keep me"), user("pop me")])
        await session.pop_item()

    asyncio.run(write())
    code = ("import asyncio, sys; from threadline.integrations.openai_agents import "
            "ThreadlineSession; from threadline.session import FileStore\n"
            "s = ThreadlineSession('sdk-tree', FileStore(sys.argv[1]))\n"
            "print(asyncio.run(s.get_items()))")
    import subprocess

    child = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                           text=True, timeout=120, check=True)
    assert child.stdout.strip() == repr([user("keep me")])
    tree = tl("tree", "sdk-tree", "--store", str(root)).stdout
    assert "pop me" in tree and "keep me" in tree
    shown = tl("show", "sdk-tree", "--store", str(root)).stdout
    assert "keep me" in shown


async def test_bad_items_are_refused_whole() -> None:
    session = ThreadlineSession("sdk-bad", MemoryStore())
    await session.add_items([user("ok")])
    with pytest.raises(AgentError, match="item 1 of add_items"):
        await session.add_items([user("x"), {"role": "user", "content": object()}])  # type: ignore[list-item]
    assert await session.get_items() == [user("ok")]


async def test_a_call_without_output_is_never_answered_by_repair(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await ThreadlineSession("sdk-open-call", store).add_items([user("hi"), CALL])
    session = ThreadlineSession("sdk-open-call", FileStore(tmp_path))
    assert await session.get_items() == [user("hi"), CALL]
    agent = await session.agent()
    assert agent.repaired == ()
    stored = await FileStore(tmp_path).load_entries("sdk-open-call")
    assert not any(isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)
                   for e in stored)


def test_s33_one_session_object_from_five_threads_with_their_own_loops(
    store_spec: StoreSpec,
) -> None:
    store = store_spec.open()
    session = ThreadlineSession("sdk-threads", store)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for n in range(5):
                asyncio.run(session.add_items([user(f"t{t}-{n}")]))
        except BaseException as exc:
            errors.append(exc)

    run_threads(worker, 5)
    assert not errors, errors
    items = asyncio.run(session.get_items())
    assert_one_order([i["content"] for i in items], [f"t{t}" for t in range(5)], 5)
    asyncio.run(session.close())
    asyncio.run(close(store))  # the session's store stays its owner's to close


CHILD_ADD = """
import asyncio, sys
sys.path.insert(0, {here!r})
from support.stores import StoreSpec, close
from threadline.integrations.openai_agents import ThreadlineSession

async def main():
    store = StoreSpec(*sys.argv[2:5]).open()
    session = ThreadlineSession("sdk-many", store)
    for n in range(10):
        await session.add_items([{{"role": "user", "content": sys.argv[1] + "-" + str(n)}}])
    await close(store)

asyncio.run(main())
"""


def test_s32_five_threads_and_two_processes_add_at_once(shared_store_spec: StoreSpec) -> None:
    store_spec = shared_store_spec
    async def body(store: Store, t: int) -> None:
        session = ThreadlineSession("sdk-many", store)
        for n in range(10):
            await session.add_items([user(f"t{t}-{n}")])

    race(store_spec, body, threads=5, children=[
        [sys.executable, "-c", CHILD_ADD.format(here=str(HERE)), f"p{p}", *store_spec.as_argv()]
        for p in range(2)])

    async def read() -> list[Any]:
        store = store_spec.open()
        items = await ThreadlineSession("sdk-many", store).get_items()
        await close(store)
        return items

    items = asyncio.run(read())
    assert_one_order([i["content"] for i in items], [f"t{t}" for t in range(5)] + ["p0", "p1"],
                     10)


# -- Runner.run against the wire-format server ------------------------------------


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}


def tool_call_reply() -> Any:
    return json_reply(200, completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_w", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}, "tool_calls"))


def text_reply(text: str) -> Any:
    return json_reply(200, completion({"role": "assistant", "content": text}, "stop"))


async def test_runner_run_with_a_tool_call_persists_through_threadline(tmp_path: Path) -> None:
    async with WireServer() as srv:
        srv.reply(tool_call_reply(), text_reply("It is sunny in Paris."),
                  text_reply("You asked about Paris."))
        session = ThreadlineSession("run-1", FileStore(tmp_path))
        agent = make_agent(srv.url)
        result = await Runner.run(agent, "Weather in Paris?", session=session)
        assert result.final_output == "It is sunny in Paris."
        # run_sync runs its own event loop, here on another thread (S33); the
        # session is the same object, the openai client a new one (it is bound
        # to the loop it first ran on).
        result = await asyncio.to_thread(lambda: Runner.run_sync(
            make_agent(srv.url), "What did I ask?", session=session))
        assert result.final_output == "You asked about Paris."
        # The second turn's request carried the first turn from the session.
        sent = json.dumps(srv.received[-1].body)
        assert "Weather in Paris?" in sent and "sunny in Paris" in sent
    items = await ThreadlineSession("run-1", FileStore(tmp_path)).get_items()
    kinds = [item.get("type", "message") for item in items]
    assert kinds.count("function_call") == 1 and kinds.count("function_call_output") == 1
    reopened = await durable.open(None, store=FileStore(tmp_path), session_id="run-1",
                                  repair=False)
    texts = [m.text for m in reopened.messages()
             if isinstance(m, UserMessage | AssistantMessage | ToolResultMessage)]
    assert texts == ["Weather in Paris?", "", "sunny in Paris", "It is sunny in Paris.",
                     "What did I ask?", "You asked about Paris."]


CHILD_TURN = """
import asyncio, os, sys
sys.path.insert(0, {here!r})
from support.agents_sdk import make_agent
from agents import Runner
from threadline.integrations.openai_agents import ThreadlineSession
from threadline.stores import FileStore

async def main():
    session = ThreadlineSession("run-kill", FileStore(sys.argv[2]))
    result = await Runner.run(make_agent(sys.argv[1]), sys.argv[3], session=session)
    print("turn done:", result.final_output, flush=True)
    if sys.argv[4] == "wait":
        await asyncio.sleep(3600)  # killed here, between turns

asyncio.run(main())
"""


async def test_resume_in_a_second_process_after_kill_9_between_turns(tmp_path: Path) -> None:
    async with WireServer() as srv:
        srv.reply(tool_call_reply(), text_reply("Sunny."), text_reply("Paris, earlier."))

        async def turn(text: str, then: str) -> asyncio.subprocess.Process:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHILD_TURN.format(here=str(HERE)), srv.url,
                str(tmp_path), text, then, stdout=asyncio.subprocess.PIPE)

        first = await turn("Weather in Paris?", "wait")
        assert first.stdout is not None
        line = await asyncio.wait_for(first.stdout.readline(), 120)
        assert line.decode().strip() == "turn done: Sunny."
        os.kill(first.pid, signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        second = await turn("Which city?", "exit")
        out, _ = await asyncio.wait_for(second.communicate(), 120)
        assert second.returncode == 0 and b"turn done: Paris, earlier." in out
        sent = json.dumps(srv.received[-1].body)
        assert "Weather in Paris?" in sent and "sunny in Paris" in sent and "Sunny." in sent
    items = await ThreadlineSession("run-kill", FileStore(tmp_path)).get_items()
    assert [i.get("content") for i in items if i.get("role") == "user"] == [
        "Weather in Paris?", "Which city?"]


CHILD_FOREVER = """
import asyncio, sys
sys.path.insert(0, {here!r})
from support.stores import StoreSpec
from threadline.integrations.openai_agents import ThreadlineSession

async def main():
    session = ThreadlineSession("sdk-cut", StoreSpec(*sys.argv[1:4]).open())
    n = 0
    while True:
        await session.add_items([{{"role": "user", "content": f"{{n}}-a"}},
                                 {{"role": "user", "content": f"{{n}}-b"}}])
        print(n, flush=True)
        n += 1

asyncio.run(main())
"""


async def test_kill_9_in_the_middle_of_adds_leaves_whole_batches(
    shared_store_spec: StoreSpec,
) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD_FOREVER.format(here=str(HERE)),
        *shared_store_spec.as_argv(), stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    acknowledged = -1
    while acknowledged < 20:
        acknowledged = int(await asyncio.wait_for(child.stdout.readline(), 120))
    os.kill(child.pid, signal.SIGKILL)
    await child.wait()
    store = shared_store_spec.open()
    items = await ThreadlineSession("sdk-cut", store).get_items()
    texts = [i["content"] for i in items]
    batches = len(texts) // 2
    assert batches > acknowledged  # every acknowledged batch is there ...
    assert texts == [f"{n}-{x}" for n in range(batches) for x in "ab"]  # ... and whole
    await close(store)


def test_from_url_owns_its_store_and_closes_from_another_loop(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'sdk.db'}"
    session = ThreadlineSession.from_url("sdk-url", url)
    asyncio.run(session.add_items([user("hi")]))
    assert asyncio.run(session.get_items()) == [user("hi")]
    done = threading.Thread(target=asyncio.run, args=(session.close(),))
    done.start()
    done.join(30)
    with pytest.raises(StoreError, match="closed"):
        asyncio.run(session.get_items())
    again = ThreadlineSession.from_url("sdk-url", url)
    assert asyncio.run(again.get_items()) == [user("hi")]
    asyncio.run(again.close())


async def test_a_fork_through_threadline_is_a_session_the_sdk_can_use() -> None:
    store = MemoryStore()
    session = ThreadlineSession("sdk-parent", store)
    await session.add_items([user("a"), assistant("b"), user("dropped")])
    await session.pop_item()
    child = await (await session.agent()).fork("sdk-child")
    assert child.session_id == "sdk-child"
    forked = ThreadlineSession("sdk-child", store)
    assert await forked.get_items() == [user("a"), assistant("b")]
    await forked.add_items([user("only in the child")])
    assert await session.get_items() == [user("a"), assistant("b")]
    assert (await store.load_session("sdk-child")).parent_id == "sdk-parent"
