"""Usage, cost and budgets (S66, S67): totals from the stored usage, forks counted once.

The provider test runs the official SDKs against the local wire server, so
the token counts compared are the ones the server sent on the wire.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support.providers import block_start, chunk, delta, message_end, message_start, stop
from support.stores import StoreSpec, close
from support.wire_server import Reply, WireServer, sse_data, sse_named, sse_reply
from threadline import durable
from threadline.ai import ModelInfo, Usage
from threadline.ai.providers import AnthropicModel, OpenAIChatModel
from threadline.durable import Budget, BudgetStop, Price, UsageRecord, read_prices, usage
from threadline.errors import BudgetExceeded, ConfigError
from threadline.session import CustomEntry
from threadline.stores import MemoryStore
from threadline.testing import ScriptedModel, Turn

# -- what the wire servers send -------------------------------------------------


def openai_text(text: str, prompt: int, completion: int, cached: int) -> tuple[Reply, int]:
    used = {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}
    reply = sse_reply(sse_data([chunk({"content": text}), chunk({}, finish="stop"),
                                chunk(usage=used)]))
    return reply, prompt + completion  # OpenAI's prompt_tokens include the cached ones


def anthropic_text(text: str, inp: int, out: int, read: int, write: int) -> tuple[Reply, int]:
    start = message_start({"input_tokens": inp, "output_tokens": 1,
                           "cache_read_input_tokens": read,
                           "cache_creation_input_tokens": write})
    reply = sse_reply(sse_named([
        start, block_start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": text}), stop(0),
        *message_end("end_turn", output_tokens=out)]))
    return reply, inp + out + read + write


async def test_s66_fork_tree_totals_equal_what_the_providers_sent(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    try:
        async with WireServer() as srv:
            openai = OpenAIChatModel(ModelInfo(provider="openai", id="gpt-test"), api_key="k",
                                     base_url=srv.url + "/v1", max_retries=0)
            claude = AnthropicModel(ModelInfo(provider="anthropic", id="claude-test"),
                                    api_key="k", base_url=srv.url, max_retries=0)
            replies = [openai_text("one", 100, 20, 60), openai_text("two", 130, 7, 0),
                       anthropic_text("three", 12, 50, 300, 40),
                       anthropic_text("Goal: a summary.", 9, 31, 0, 0),
                       openai_text("four", 170, 3, 100)]
            srv.reply(*(r for r, _ in replies))
            sent = [n for _, n in replies]

            parent = await durable.open(durable.model(openai), store=store, session_id="p")
            await parent.run("first").collect()
            await parent.fork("c")
            await parent.run("second").collect()
            child = await durable.open(durable.model(claude), store=store, session_id="c")
            await child.run("third").collect()
            assert await child.compact_with(claude, keep_recent_tokens=0) is not None
            await child.fork("g")
            grandchild = await durable.open(durable.model(openai), store=store, session_id="g")
            await grandchild.run("fourth").collect()
            await openai.aclose()
            await claude.aclose()

        tree = await usage(store, "p", scope="with_forks")
        assert tree.total.total_tokens == sum(sent)
        assert tree.sessions == ("p", "c", "g")
        assert tree.calls == 5
        # Each session's own spending, summed over the tree, is the same total.
        own = [(await usage(store, s, scope="session")).total.total_tokens for s in "pcg"]
        assert own == [sent[0] + sent[1], sent[2] + sent[3], sent[4]]
        # The path counts what the conversation as it reads cost, the parent's part too.
        path = await usage(grandchild, scope="path")
        assert path.total.total_tokens == sent[0] + sent[2] + sent[3] + sent[4]
        assert [i.copied for i in path.items] == [True, True, True, False]
        assert (await usage(grandchild, scope="branch")).total.total_tokens == sent[4]
        # The summary call is counted from the compaction entry.
        by_source = (await usage(store, "c", scope="session")).by("source")
        assert by_source["compaction"].total_tokens == sent[3]
        assert tree.by("model").keys() == {"openai:gpt-test", "anthropic:claude-test"}
        openai_sum = tree.by("model")["openai:gpt-test"]
        assert openai_sum == Usage(input_tokens=40 + 130 + 70, cache_read_tokens=160,
                                   output_tokens=30)
    finally:
        await close(store)


async def test_s66_a_generated_titles_call_is_counted() -> None:
    """The title call's provider-reported usage is stored as a record, and
    counted once: by the session, not again by a fork of it."""
    store = MemoryStore()
    async with WireServer() as srv:
        chat = OpenAIChatModel(ModelInfo(provider="openai", id="gpt-chat"), api_key="k",
                               base_url=srv.url + "/v1", max_retries=0)
        titler = OpenAIChatModel(ModelInfo(provider="openai", id="gpt-title"), api_key="k",
                                 base_url=srv.url + "/v1", max_retries=0)
        replies = [openai_text("hello", 40, 5, 0), openai_text("A greeting", 90, 4, 30)]
        srv.reply(*(r for r, _ in replies))
        agent = await durable.open(durable.model(chat), store=store, session_id="t",
                                   title=durable.GeneratedTitle(titler))
        await agent.run("hi").collect()
        await chat.aclose()
        await titler.aclose()
    assert agent.metadata.title == "A greeting"
    report = await usage(store, "t")
    assert report.total.total_tokens == sum(n for _, n in replies)
    [record] = [i for i in report.items if i.source == "record"]
    assert (record.model, record.usage.output_tokens) == ("gpt-title", 4)
    await agent.fork("t2")
    assert (await usage(store, "t", scope="with_forks")).total == report.total


async def scripted_session(store: MemoryStore, session_id: str, *counts: int) -> Any:
    turns = [Turn.text(f"r{n}", usage=Usage(input_tokens=n, output_tokens=1)) for n in counts]
    agent = await durable.open(durable.model(ScriptedModel(turns)), store=store,
                               session_id=session_id)
    for n in counts:
        await agent.run(f"q{n}").collect()
    return agent


async def test_s66_session_scope_counts_every_branch_path_only_the_active_one() -> None:
    store = MemoryStore()
    agent = await scripted_session(store, "s", 10, 20)
    first_reply = agent.path()[1].id
    other = await durable.open(durable.model(ScriptedModel(
        [Turn.text("alt", usage=Usage(input_tokens=300, output_tokens=2))])), store=store,
        session_id="s")
    other.branch(first_reply)
    await other.run("again").collect()
    agent = other
    assert (await usage(agent, scope="session")).total.total_tokens == 11 + 21 + 302
    assert (await usage(agent, scope="path")).total.total_tokens == 11 + 302
    assert (await usage(store, "s", scope="path")).total.total_tokens == 11 + 302
    # A record of a side call (a generated title) counts; the bare agent's view too.
    await agent.append(CustomEntry(kind="threadline.usage", data=UsageRecord(
        provider="scripted", model="titler", usage=Usage(input_tokens=5), purpose="title")))
    report = await usage(store, "s")
    assert report.total.total_tokens == 11 + 21 + 302 + 5
    assert report.by("source")["record"].input_tokens == 5
    assert set(report.by("day")) == {report.items[0].timestamp.date().isoformat()}  # type: ignore[union-attr]


async def test_s66_bad_arguments_are_errors() -> None:
    store = MemoryStore()
    agent = await scripted_session(store, "s", 1)
    with pytest.raises(ConfigError, match="scope"):
        await usage(agent, scope="everything")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="name the session"):
        await usage(store)
    with pytest.raises(ConfigError, match="another session id"):
        await usage(agent, "other")


def test_price_table_shape_and_costs() -> None:
    prices = read_prices(json.dumps({
        "openai": {"gpt-test": {"input": 2.0, "output": 8.0, "cache_read": 0.5},
                   "*": {"input": 1.0, "output": 1.0}},
    }))
    assert prices["openai"]["gpt-test"] == Price(input=2.0, output=8.0, cache_read=0.5)
    with pytest.raises(ConfigError, match="price table"):
        read_prices('{"openai": {"m": {"input": 1}}}')  # no output price
    with pytest.raises(ConfigError, match="price table"):
        read_prices('{"openai": {"m": {"input": 1, "output": 1, "bogus": 2}}}')
    with pytest.raises(ConfigError, match="finite"):
        Price(input=-1, output=1)


async def test_cost_from_the_applications_prices_and_unpriced_models_named() -> None:
    store = MemoryStore()
    await scripted_session(store, "s", 1_000_000)
    report = await usage(store, "s")
    cost = report.cost({"scripted": {"scripted-model": Price(input=3.0, output=1_000_000.0)}})
    assert cost.total == pytest.approx(3.0 + 1.0)
    assert cost.unpriced == ()
    none = report.cost({"openai": {"*": Price(input=1, output=1)}})
    assert none.total == 0 and none.unpriced == ("scripted:scripted-model",)
    wildcard = report.cost({"scripted": {"*": Price(input=1, output=0)}})
    assert wildcard.total == pytest.approx(1.0)
    assert report.cost_by("day", {"scripted": {"*": Price(input=1, output=0)}}) == {
        report.items[0].timestamp.date().isoformat(): pytest.approx(1.0)}  # type: ignore[union-attr]


# -- budgets ---------------------------------------------------------------------


async def test_s67_budget_stops_before_the_call_that_would_exceed_it() -> None:
    store = MemoryStore()
    model = ScriptedModel([Turn.text("a", usage=Usage(input_tokens=60, output_tokens=10)),
                           Turn.text("b", usage=Usage(input_tokens=60, output_tokens=10))])
    # 70 spent plus the estimated input of the next call (a few tokens) exceeds 75.
    agent = await durable.open(durable.model(model), store=store, session_id="b",
                               budget=Budget(max_tokens=75))
    first = await agent.run("hello").collect()
    assert first[-1].stop_reason == "done"  # type: ignore[union-attr]
    second = await agent.run("more").collect()
    end = second[-1]
    assert end.stop_reason == "budget"  # type: ignore[union-attr]
    assert isinstance(end.error, BudgetExceeded)  # type: ignore[union-attr]
    assert "session 'b'" in str(end.error)  # type: ignore[union-attr]
    assert len(model.requests) == 1  # the second call was never made
    records = [e for e in await store.load_entries("b")
               if isinstance(e, CustomEntry) and e.kind == "threadline.budget"]
    assert len(records) == 1 and isinstance(records[0].data, BudgetStop)
    assert records[0].data.limit == "tokens" and records[0].data.spent == 70


async def test_s67_budget_counts_the_next_calls_estimated_input() -> None:
    store = MemoryStore()
    model = ScriptedModel([Turn.text("a")])
    agent = await durable.open(durable.model(model), store=store, session_id="e",
                               budget=Budget(max_tokens=10))
    end = (await agent.run("x" * 400).collect())[-1]  # about 100 tokens of input
    assert end.stop_reason == "budget" and model.requests == []  # type: ignore[union-attr]
    loose = await durable.open(durable.model(ScriptedModel([Turn.text("a")])), store=store,
                               session_id="e2", budget=Budget(max_tokens=10, estimate=False))
    assert (await loose.run("x" * 400).collect())[-1].stop_reason == "done"  # type: ignore[union-attr]


async def test_s67_cost_budget_and_missing_prices() -> None:
    store = MemoryStore()
    prices = {"scripted": {"scripted-model": Price(input=1.0, output=1.0)}}
    turns = [Turn.text("a", usage=Usage(input_tokens=600_000)),
             Turn.text("b", usage=Usage(input_tokens=600_000)),
             Turn.text("c", usage=Usage(input_tokens=600_000))]
    agent = await durable.open(durable.model(ScriptedModel(turns)), store=store,
                               session_id="c", budget=Budget(max_cost=1.0, prices=prices))
    for text in "ab":  # 0.6 spent is under 1.0: the second call is made
        assert (await agent.run(text).collect())[-1].stop_reason == "done"  # type: ignore[union-attr]
    end = (await agent.run("c").collect())[-1]
    assert end.stop_reason == "budget"  # type: ignore[union-attr]
    assert end.error.limit == "cost"  # type: ignore[union-attr]
    unpriced = await durable.open(durable.model(ScriptedModel(turns)), store=store,
                                  session_id="u", budget=Budget(max_cost=1.0, prices={}))
    end = (await unpriced.run("a").collect())[-1]
    assert end.stop_reason == "error" and "no price" in str(end.error)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="prices"):
        Budget(max_cost=1.0)
    with pytest.raises(ConfigError, match="needs"):
        Budget()


async def test_s67_budget_checked_between_the_turns_of_one_run() -> None:
    store = MemoryStore()
    model = ScriptedModel([
        Turn.tool_call("echo", {"text": "hi"}, usage=Usage(input_tokens=80)),
        Turn.text("done", usage=Usage(input_tokens=80)),
    ])

    def echo(text: str) -> str:
        """Echo.

        Args:
            text: The text.
        """
        return text

    agent = await durable.open(durable.model(model, [echo]), store=store, session_id="t",
                               budget=Budget(max_tokens=80, estimate=False))
    events = await agent.run("go").collect()
    assert events[-1].stop_reason == "budget"  # type: ignore[union-attr]
    assert len(model.requests) == 1
    kinds = [type(e).__name__ for e in agent.path()]
    assert kinds[-1] == "CustomEntry"  # the stored record, after the tool's result
    assert [type(m).__name__ for m in agent.messages()] == [
        "UserMessage", "AssistantMessage", "ToolResultMessage"]


CHILD = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, {tests!r})
    from support.stores import StoreSpec
    from threadline import durable
    from threadline.ai import Usage
    from threadline.testing import ScriptedModel, Turn

    async def main() -> None:
        spec = StoreSpec(*sys.argv[1:4])
        store = spec.open()
        model = ScriptedModel([Turn.text("r", usage=Usage(input_tokens=40))] * 10)
        agent = await durable.open(durable.model(model), store=store, session_id="shared",
                                   budget=durable.Budget(max_tokens=100, estimate=False))
        ends = []
        for n in range(int(sys.argv[4])):
            await agent.refresh()
            ends.append((await agent.run(f"q{{n}}").collect())[-1].stop_reason)
        print(json.dumps({{"ends": ends, "calls": len(model.requests)}}))
        close = getattr(store, "close", None)
        if close is not None:
            await close()

    asyncio.run(main())
""")


def run_child(spec: StoreSpec, runs: int, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    out = subprocess.run([sys.executable, str(script), *spec.as_argv(), str(runs)],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={"PYTHONPATH": str(Path(__file__).parent.parent / "src"),
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_s67_budget_holds_across_processes(shared_store_spec: StoreSpec, tmp_path: Path) -> None:
    # Two processes, one after the other, on one session: the second reads the first's
    # stored usage, not a counter of its own, and stops at the bound.
    first = run_child(shared_store_spec, 2, tmp_path)
    assert first == {"ends": ["done", "done"], "calls": 2}
    second = run_child(shared_store_spec, 2, tmp_path)
    assert second == {"ends": ["done", "budget"], "calls": 1}
    third = run_child(shared_store_spec, 1, tmp_path)
    assert third == {"ends": ["budget"], "calls": 0}


def test_s67_two_processes_at_once_go_over_by_at_most_the_call_in_flight(
        shared_store_spec: StoreSpec, tmp_path: Path) -> None:
    # Both run until the budget stops them. One process alone makes 3 calls (0, 40 and
    # 80 spent, all under 100); two at once may each pass one check before the other's
    # usage is stored, so together they make 3 or 4, never more, and both stop.
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent)))
    env = {"PYTHONPATH": str(Path(__file__).parent.parent / "src"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, str(script), *shared_store_spec.as_argv(), "5"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert 3 <= sum(r["calls"] for r in results) <= 4
    assert all(r["ends"][-1] == "budget" for r in results)


class _OwnLoop:
    """A loop of the application's own (no ``before_model`` hook): one reply per run."""

    runs = 0

    def run(self, context: Any, input: Any, *, abort: Any = None) -> Any:
        return self._run(input)

    async def _run(self, input: Any) -> Any:
        from threadline.agent import AgentEnd, AgentStart, MessageEnd, MessageStart
        from threadline.ai import AssistantMessage, TextPart

        _OwnLoop.runs += 1
        yield AgentStart()
        for message in input:
            yield MessageStart(message)
            yield MessageEnd(message)
        reply = AssistantMessage(content=(TextPart(text="ok"),), model="own", provider="mine",
                                 usage=Usage(input_tokens=50))
        yield MessageStart(reply)
        yield MessageEnd(reply)
        yield AgentEnd((*input, reply))


async def test_s67_a_loop_without_the_hook_is_checked_before_it_starts() -> None:
    store = MemoryStore()
    _OwnLoop.runs = 0
    agent = await durable.open(_OwnLoop, store=store, session_id="own",
                               budget=Budget(max_tokens=50, estimate=False))
    assert (await agent.run("a").collect())[-1].stop_reason == "done"  # type: ignore[union-attr]
    events = await agent.run("b").collect()
    assert events[-1].stop_reason == "budget"  # type: ignore[union-attr]
    assert _OwnLoop.runs == 1  # the second run's loop was never iterated
    kinds = [e.kind for e in await store.load_entries("own") if isinstance(e, CustomEntry)]
    assert kinds == ["threadline.budget"]
    # The input was stored as with any run, and the path stays valid.
    assert [type(m).__name__ for m in agent.messages()] == [
        "UserMessage", "AssistantMessage", "UserMessage"]
    # A fork inherits the budget; its own spending starts at zero (its copies are the parent's).
    child = await agent.fork("own-child")
    assert (await child.run("c").collect())[-1].stop_reason == "done"  # type: ignore[union-attr]
    assert (await child.run("d").collect())[-1].stop_reason == "budget"  # type: ignore[union-attr]
