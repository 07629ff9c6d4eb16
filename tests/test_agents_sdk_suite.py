"""The OpenAI Agents SDK's own session tests, run against ``ThreadlineSession`` on every store.

Adapted from openai/openai-agents-python (MIT licence), tests/memory/test_session.py
and tests/memory/test_session_limit.py at commit 7f7a44f8dc06. The test bodies
are the SDK's; ``SQLiteSession(session_id, db_path, session_settings=...)`` is
replaced by ``threadline_session``, which opens a ``ThreadlineSession`` with that
id on one store per ``db_path`` (so two sessions of one database share a
store, as they do there), and ``get_text_message`` is copied from the SDK's
tests/test_responses.py.

Left out, because they test SQLiteSession's own machinery rather than the
Session protocol: ``_await_mutation``, worker-thread connections, the
process-wide file lock, rows of invalid JSON written behind the session's
back, rollbacks after a dropped table, and cancellation after a commit. Two
assertions are adapted: a closed ThreadlineSession refuses with ``StoreError``
(threadline's error for it) where SQLiteSession raises ``RuntimeError``, and
a threadline store keeps an item that is not JSON out with ``AgentError``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SessionSettings, TResponseInputItem
from agents.testing import ScriptedModel
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from threadline.errors import StoreError
from threadline.integrations.openai_agents import ThreadlineSession
from threadline.integrations.openai_agents._loop import on_home
from threadline.stores import FileStore, MemoryStore, Store

_stores: dict[str, Store] = {}
_kind: list[Any] = []


@pytest.fixture(autouse=True, params=["memory", "file", "sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    _kind[:] = [request.param, tmp_path]
    if request.param == "postgres":
        _kind.append((request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")))
    try:
        yield request.param
    finally:
        for store in _stores.values():
            closer = getattr(store, "close", None)
            if closer is not None:
                on_home(closer()).result(30)  # where the sessions used it
        _stores.clear()


def _store(db_path: str) -> Store:
    kind, tmp = _kind[0], _kind[1]
    if db_path not in _stores:
        n = len(_stores)
        if kind == "memory":
            _stores[db_path] = MemoryStore()
        elif kind == "file":
            _stores[db_path] = FileStore(tmp / f"files-{n}")
        elif kind == "sqlite":
            from threadline.stores import SQLiteStore

            _stores[db_path] = SQLiteStore(tmp / f"db-{n}.sqlite")
        else:
            from threadline.stores import PostgresStore

            url, schema = _kind[2]
            # One schema per test (the fixture drops it): a test's databases
            # never share a session id.
            _stores[db_path] = PostgresStore(url, schema=schema, min_size=0, max_size=2)
    return _stores[db_path]


def threadline_session(session_id: str, db_path: str | Path = ":memory:",
                       session_settings: Any = None) -> ThreadlineSession:
    return ThreadlineSession(session_id, _store(str(db_path)), session_settings=session_settings)


SQLiteSession = threadline_session  # the name the SDK's tests use


def get_text_message(content: str) -> Any:
    return ResponseOutputMessage(
        id="1", type="message", role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[],
                                    logprobs=[])],
        status="completed",
    )


# --- from tests/memory/test_session.py ------------------------------------------------


def _run_sync_wrapper(agent, input_data, **kwargs):  # type: ignore[no-untyped-def]
    """Wrapper for run_sync that properly sets up an event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent_async(runner_method: str, agent, input_data, **kwargs):  # type: ignore[no-untyped-def]
    """Helper function to run agent with different methods."""
    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    elif runner_method == "run_sync":
        return await asyncio.to_thread(_run_sync_wrapper, agent, input_data, **kwargs)
    elif runner_method == "run_streamed":
        result = Runner.run_streamed(agent, input_data, **kwargs)
        async for _event in result.stream_events():
            pass
        return result
    else:
        raise ValueError(f"Unknown runner method: {runner_method}")


RUNNERS = pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])


@RUNNERS
async def test_session_memory_basic_functionality_parametrized(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        session = SQLiteSession("test_session_123", db_path)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([get_text_message("San Francisco")])
        result1 = await run_agent_async(runner_method, agent,
                                        "What city is the Golden Gate Bridge in?",
                                        session=session)
        assert result1.final_output == "San Francisco"
        model.enqueue([get_text_message("California")])
        result2 = await run_agent_async(runner_method, agent, "What state is it in?",
                                        session=session)
        assert result2.final_output == "California"
        last_input = model.calls[-1].input
        assert len(last_input) > 1
        session.close()


@RUNNERS
async def test_session_memory_with_explicit_instance_parametrized(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        session = SQLiteSession("test_session_456", db_path)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([get_text_message("Hello")])
        result1 = await run_agent_async(runner_method, agent, "Hi there", session=session)
        assert result1.final_output == "Hello"
        model.enqueue([get_text_message("I remember you said hi")])
        result2 = await run_agent_async(runner_method, agent, "Do you remember what I said?",
                                        session=session)
        assert result2.final_output == "I remember you said hi"
        session.close()


@RUNNERS
async def test_session_memory_disabled_parametrized(runner_method):  # type: ignore[no-untyped-def]
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("Hello")])
    result1 = await run_agent_async(runner_method, agent, "Hi there")
    assert result1.final_output == "Hello"
    model.enqueue([get_text_message("I don't remember")])
    result2 = await run_agent_async(runner_method, agent, "Do you remember what I said?")
    assert result2.final_output == "I don't remember"
    assert len(model.calls[-1].input) == 1


@RUNNERS
async def test_session_memory_different_sessions_parametrized(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        session_1 = SQLiteSession("session_1", db_path)
        model.enqueue([get_text_message("I like cats")])
        result1 = await run_agent_async(runner_method, agent, "I like cats", session=session_1)
        assert result1.final_output == "I like cats"
        session_2 = SQLiteSession("session_2", db_path)
        model.enqueue([get_text_message("I like dogs")])
        result2 = await run_agent_async(runner_method, agent, "I like dogs", session=session_2)
        assert result2.final_output == "I like dogs"
        model.enqueue([get_text_message("Yes, you mentioned cats")])
        result3 = await run_agent_async(runner_method, agent, "What did I say I like?",
                                        session=session_1)
        assert result3.final_output == "Yes, you mentioned cats"
        session_1.close()
        session_2.close()


async def test_sqlite_session_memory_direct() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("direct_test", Path(temp_dir) / "test_direct.db")
        items: list[TResponseInputItem] = [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there!"},
        ]
        await session.add_items(items)
        retrieved = await session.get_items()
        assert len(retrieved) == 2
        assert retrieved[0].get("role") == "user"
        assert retrieved[0].get("content") == "Hello"
        assert retrieved[1].get("role") == "assistant"
        assert retrieved[1].get("content") == "Hi there!"
        await session.clear_session()
        assert len(await session.get_items()) == 0
        session.close()


async def test_sqlite_session_closed_rejects_empty_add_items() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("closed_empty_add_test", Path(temp_dir) / "closed.db")
        session.close()
        with pytest.raises(StoreError, match="ThreadlineSession is closed"):  # adapted
            await session.add_items([])


async def test_sqlite_session_memory_pop_item() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("pop_test", Path(temp_dir) / "test_pop.db")
        assert await session.pop_item() is None
        items: list[TResponseInputItem] = [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there!"},
            {"role": "user", "content": "How are you?"},
        ]
        await session.add_items(items)
        assert len(await session.get_items()) == 3
        popped = await session.pop_item()
        assert popped is not None
        assert popped.get("role") == "user"
        assert popped.get("content") == "How are you?"
        retrieved_after_pop = await session.get_items()
        assert len(retrieved_after_pop) == 2
        assert retrieved_after_pop[-1].get("content") == "Hi there!"
        popped2 = await session.pop_item()
        assert popped2 is not None
        assert popped2.get("role") == "assistant"
        assert popped2.get("content") == "Hi there!"
        popped3 = await session.pop_item()
        assert popped3 is not None
        assert popped3.get("role") == "user"
        assert popped3.get("content") == "Hello"
        assert await session.pop_item() is None
        assert len(await session.get_items()) == 0
        session.close()


async def test_session_memory_pop_different_sessions() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_pop_sessions.db"
        session_1 = SQLiteSession("session_1", db_path)
        session_2 = SQLiteSession("session_2", db_path)
        await session_1.add_items([{"role": "user", "content": "Session 1 message"}])
        await session_2.add_items([{"role": "user", "content": "Session 2 message 1"},
                                   {"role": "user", "content": "Session 2 message 2"}])
        popped = await session_2.pop_item()
        assert popped is not None
        assert popped.get("content") == "Session 2 message 2"
        session_1_items = await session_1.get_items()
        assert len(session_1_items) == 1
        assert session_1_items[0].get("content") == "Session 1 message"
        session_2_items = await session_2.get_items()
        assert len(session_2_items) == 1
        assert session_2_items[0].get("content") == "Session 2 message 1"
        session_1.close()
        session_2.close()


async def test_sqlite_session_get_items_with_limit() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("count_test", Path(temp_dir) / "test_count.db")
        items: list[TResponseInputItem] = [
            {"role": "user", "content": "Message 1"},
            {"role": "assistant", "content": "Response 1"},
            {"role": "user", "content": "Message 2"},
            {"role": "assistant", "content": "Response 2"},
            {"role": "user", "content": "Message 3"},
            {"role": "assistant", "content": "Response 3"},
        ]
        await session.add_items(items)
        assert len(await session.get_items()) == 6
        latest_2 = await session.get_items(limit=2)
        assert len(latest_2) == 2
        assert latest_2[0].get("content") == "Message 3"
        assert latest_2[1].get("content") == "Response 3"
        latest_4 = await session.get_items(limit=4)
        assert len(latest_4) == 4
        assert latest_4[0].get("content") == "Message 2"
        assert latest_4[1].get("content") == "Response 2"
        assert latest_4[2].get("content") == "Message 3"
        assert latest_4[3].get("content") == "Response 3"
        latest_10 = await session.get_items(limit=10)
        assert len(latest_10) == 6
        assert latest_10[0].get("content") == "Message 1"
        assert latest_10[-1].get("content") == "Response 3"
        assert len(await session.get_items(limit=0)) == 0
        session.close()


@RUNNERS
async def test_session_memory_appends_list_input_by_default(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("test_validation_parametrized", Path(temp_dir) / "v.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        initial_history: list[TResponseInputItem] = [
            {"role": "user", "content": "Earlier message"},
            {"role": "assistant", "content": "Saved reply"},
        ]
        await session.add_items(initial_history)
        list_input = [{"role": "user", "content": "Test message"}]
        model.enqueue([get_text_message("This should run")])
        await run_agent_async(runner_method, agent, list_input, session=session)
        assert model.calls[-1].input == initial_history + list_input
        session.close()


@RUNNERS
async def test_session_callback_prepared_input(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        session = SQLiteSession("session_1", Path(temp_dir) / "test_memory.db")
        initial_history: list[TResponseInputItem] = [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hi, I'm here to assist you."},
        ]
        try:
            await session.add_items(initial_history)

            def filter_assistant_messages(history, new_input):  # type: ignore[no-untyped-def]
                return [item for item in history if item["role"] == "user"] + new_input

            new_turn_input = [{"role": "user", "content": "What your name?"}]
            model.enqueue([get_text_message("I'm gpt-4o")])
            await run_agent_async(
                runner_method, agent, new_turn_input, session=session,
                run_config=RunConfig(session_input_callback=filter_assistant_messages))
            assert len(model.calls[-1].input) == 2
            assert model.calls[-1].input == [initial_history[0], new_turn_input[0]]
        finally:
            session.close()


@RUNNERS
async def test_session_callback_repeating_history_does_not_grow_session(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        session = SQLiteSession("session_repeat", Path(temp_dir) / "test_memory.db")

        def repeat_first(history, new_input):  # type: ignore[no-untyped-def]
            if not history:
                return new_input
            return [*history, history[0], *new_input]

        try:
            for turn in range(3):
                model.enqueue([get_text_message(f"assistant {turn}")])
                await run_agent_async(runner_method, agent, f"user {turn}", session=session,
                                      run_config=RunConfig(session_input_callback=repeat_first))
            stored = await session.get_items()
            user_messages = [item for item in stored if item.get("role") == "user"]
            assert [item.get("content") for item in user_messages] == ["user 0", "user 1",
                                                                       "user 2"]
            assert len(stored) == 6
        finally:
            session.close()


async def test_sqlite_session_unicode_content() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("unicode_test", Path(temp_dir) / "test_unicode.db")
        items: list[TResponseInputItem] = [
            {"role": "user", "content": "こんにちは"},
            {"role": "assistant", "content": "😊👍"},
            {"role": "user", "content": "Привет"},
        ]
        await session.add_items(items)
        retrieved = await session.get_items()
        assert retrieved[0].get("content") == "こんにちは"
        assert retrieved[1].get("content") == "😊👍"
        assert retrieved[2].get("content") == "Привет"
        session.close()


async def test_sqlite_session_special_characters_and_sql_injection() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("special_chars_test", Path(temp_dir) / "special.db")
        items: list[TResponseInputItem] = [
            {"role": "user", "content": "O'Reilly"},
            {"role": "assistant", "content": "DROP TABLE sessions;"},
            {"role": "user", "content": ('"SELECT * FROM users WHERE name = "admin";"')},
            {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
            {"role": "user", "content": "Normal message"},
        ]
        await session.add_items(items)
        retrieved = await session.get_items()
        assert len(retrieved) == len(items)
        assert retrieved[0].get("content") == "O'Reilly"
        assert retrieved[1].get("content") == "DROP TABLE sessions;"
        assert retrieved[2].get("content") == '"SELECT * FROM users WHERE name = "admin";"'
        assert retrieved[3].get("content") == "Robert'); DROP TABLE students;--"
        assert retrieved[4].get("content") == "Normal message"
        session.close()


async def test_sqlite_session_concurrent_access() -> None:
    import concurrent.futures

    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("concurrent_test", Path(temp_dir) / "test_concurrent.db")
        items: list[TResponseInputItem] = [
            {"role": "user", "content": f"Message {i}"} for i in range(10)
        ]

        def add_item(item):  # type: ignore[no-untyped-def]
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(session.add_items([item]))
            loop.close()

        with concurrent.futures.ThreadPoolExecutor(max_workers=5) as executor:
            list(executor.map(add_item, items))
        retrieved = await session.get_items()
        contents = {c for item in retrieved for c in [item.get("content")] if isinstance(c, str)}
        assert contents == {f"Message {i}" for i in range(10)}
        session.close()


async def test_session_add_items_exception_propagates_in_streamed() -> None:
    session = SQLiteSession("test_exception_session")

    async def _failing_add_items(_items):  # type: ignore[no-untyped-def]
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = _failing_add_items  # type: ignore[method-assign]
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("This should not be reached")])
    result = Runner.run_streamed(agent, "Hello", session=session)

    async def consume_stream() -> None:
        async for _event in result.stream_events():
            pass

    with pytest.raises(RuntimeError, match=r"Simulated session\.add_items failure"):
        await asyncio.wait_for(consume_stream(), timeout=5.0)
    session.close()


async def test_session_settings_default() -> None:
    session = SQLiteSession("default_settings_test")
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None
    session.close()


async def test_session_settings_constructor() -> None:
    session = SQLiteSession("constructor_settings_test", session_settings=SessionSettings(limit=5))
    assert session.session_settings is not None
    assert session.session_settings.limit == 5
    session.close()


async def test_session_settings_constructor_normalizes_dictionary() -> None:
    session = SQLiteSession("dictionary_settings_test", session_settings={"limit": 0})
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit == 0
    assert session.session_settings.resolve({"limit": 4}).limit == 4
    session.close()


def test_session_settings_rejects_unknown_dictionary_fields() -> None:
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        SQLiteSession("invalid_settings_test", session_settings={"limitt": 1})


async def test_get_items_uses_session_settings_limit() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("uses_settings_limit_test", Path(temp_dir) / "limit.db",
                                session_settings=SessionSettings(limit=3))
        items: list[TResponseInputItem] = [
            {"role": "user", "content": f"Message {i}"} for i in range(5)
        ]
        await session.add_items(items)
        retrieved = await session.get_items()
        assert len(retrieved) == 3
        assert retrieved[0].get("content") == "Message 2"
        assert retrieved[1].get("content") == "Message 3"
        assert retrieved[2].get("content") == "Message 4"
        session.close()


async def test_get_items_explicit_limit_overrides_session_settings() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("explicit_override_test", Path(temp_dir) / "override.db",
                                session_settings=SessionSettings(limit=5))
        items: list[TResponseInputItem] = [
            {"role": "user", "content": f"Message {i}"} for i in range(10)
        ]
        await session.add_items(items)
        retrieved = await session.get_items(limit=2)
        assert len(retrieved) == 2
        assert retrieved[0].get("content") == "Message 8"
        assert retrieved[1].get("content") == "Message 9"
        session.close()


async def test_runner_with_session_settings_override() -> None:
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("runner_override_test", Path(temp_dir) / "runner.db",
                                session_settings=SessionSettings(limit=100))
        items: list[TResponseInputItem] = [
            {"role": "user", "content": f"Turn {i}"} for i in range(10)
        ]
        await session.add_items(items)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([get_text_message("Got it")])
        await Runner.run(agent, "New question", session=session,
                         run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        last_input = model.calls[-1].input
        history_items = [item for item in last_input if item.get("content") != "New question"]
        assert len(history_items) == 2
        session.close()


async def test_runner_with_dict_session_settings_and_a_run_config_override() -> None:
    """The case the SDK's settings tests stand for: a dict on the session, settings in the
    run's config. (Not one of the SDK's tests; it raised AttributeError before.)"""
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("dict_override", Path(temp_dir) / "dict.db",
                                session_settings={"limit": 2})
        await session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(5)])
        model = ScriptedModel()
        model.enqueue([get_text_message("Got it")])
        await Runner.run(Agent(name="test", model=model), "New question", session=session,
                         run_config=RunConfig(session_settings=SessionSettings(limit=1)))
        assert [i.get("content") for i in model.calls[-1].input] == ["Turn 4", "New question"]
        session.close()


# --- from tests/memory/test_session_limit.py -------------------------------------------


@RUNNERS
async def test_session_limit_parameter(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("limit_test", Path(temp_dir) / "test_limit.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for n in (1, 2, 3):
            model.enqueue([get_text_message(f"Reply {n}")])
            await run_agent_async(runner_method, agent, f"Message {n}", session=session)
        assert len(await session.get_items()) == 6
        model.enqueue([get_text_message("Reply 4")])
        await run_agent_async(runner_method, agent, "Message 4", session=session,
                              run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0].get("content") == "Message 3"
        assert last_input[1].get("content")[0]["text"] == "Reply 3"
        assert last_input[2].get("content") == "Message 4"
        session.close()


@RUNNERS
async def test_session_limit_drops_unmatched_history_function_call_output(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("limit_tool_pair", Path(temp_dir) / "test_limit_tool_pair.db")
        history: list[Any] = [
            {"role": "user", "content": "What is the weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "It is sunny.", "annotations": []}]},
        ]
        await session.add_items(history)
        assert await session.get_items(limit=2) == history[-2:]
        model = ScriptedModel()
        model.enqueue([get_text_message("Tomorrow is sunny too.")])
        agent = Agent(name="test", model=model)
        await run_agent_async(runner_method, agent, "What about tomorrow?", session=session,
                              run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        assert model.calls[-1].input == [history[-1],
                                         {"role": "user", "content": "What about tomorrow?"}]
        session.close()


@RUNNERS
async def test_session_limit_zero(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("limit_zero_test", Path(temp_dir) / "test_limit_zero.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for n in (1, 2):
            model.enqueue([get_text_message(f"Reply {n}")])
            await run_agent_async(runner_method, agent, f"Message {n}", session=session)
        model.enqueue([get_text_message("Reply 3")])
        await run_agent_async(runner_method, agent, "Message 3", session=session,
                              run_config=RunConfig(session_settings=SessionSettings(limit=0)))
        last_input = model.calls[-1].input
        assert len(last_input) == 1
        assert last_input[0].get("content") == "Message 3"
        session.close()


@RUNNERS
async def test_session_limit_none_gets_all_history(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("limit_none_test", Path(temp_dir) / "test_limit_none.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for i in range(1, 6):
            model.enqueue([get_text_message(f"Reply {i}")])
            await run_agent_async(runner_method, agent, f"Message {i}", session=session)
        assert len(await session.get_items()) == 10
        model.enqueue([get_text_message("Reply 6")])
        await run_agent_async(runner_method, agent, "Message 6", session=session,
                              run_config=RunConfig(session_settings=SessionSettings(limit=None)))
        last_input = model.calls[-1].input
        assert len(last_input) == 11
        assert last_input[0].get("content") == "Message 1"
        assert last_input[-1].get("content") == "Message 6"
        session.close()


@RUNNERS
async def test_session_limit_larger_than_history(runner_method):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temp_dir:
        session = SQLiteSession("limit_large_test", Path(temp_dir) / "test_limit_large.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([get_text_message("Reply 1")])
        await run_agent_async(runner_method, agent, "Message 1", session=session)
        model.enqueue([get_text_message("Reply 2")])
        await run_agent_async(runner_method, agent, "Message 2", session=session,
                              run_config=RunConfig(session_settings=SessionSettings(limit=100)))
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0].get("content") == "Message 1"
        assert last_input[1].get("content")[0]["text"] == "Reply 1"
        assert last_input[2].get("content") == "Message 2"
        session.close()
