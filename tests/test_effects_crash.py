"""Durable tool execution across real processes killed with SIGKILL (S19-S24).

A fork server (this file run as a script) imports threadline once and forks a
child per job, so hundreds of kills stay cheap. Children report what they
reached on stdout, one JSON line per report, written before they go on; the
test kills them at chosen points and then judges only what the store and the
effect counter (a real SQLite file) say.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fork_server import ForkServer, kill, say, serve
from support.effects import (
    PROCESS_STORE_KINDS,
    Counter,
    assert_one_result_each,
    pay_tool,
    store_url,
)
from support.stores import import_every_store
from threadline import durable
from threadline.ai import AssistantMessage, ToolContext, ToolResultMessage, UserMessage, tool
from threadline.ai._model import Request
from threadline.errors import ApprovalError, DecisionConflict
from threadline.session import CustomEntry, Entry, MessageEntry
from threadline.stores import CatalogStore, open_store
from threadline.testing import Call, ScriptedModel, Turn, assert_valid_for_providers

# -- the child side ----------------------------------------------------------------


def _pay_script(tag: str) -> Any:
    """Two pay calls for a fresh conversation, then a closing text."""

    def reply(request: Request) -> Turn:
        last = request.messages[-1]
        if isinstance(last, UserMessage):
            return Turn(Call("pay", {"order": f"{tag}-1"}, id="p1"),
                        Call("pay", {"order": f"{tag}-2"}, id="p2"))
        return Turn.text("all paid")

    return [reply, reply, reply]


async def _child(job: dict[str, Any]) -> None:
    tag = job["tag"]
    counter = Counter(Path(job["counter"]))
    store = open_store(job["store"])
    try:
        await _MODES[job["mode"]](job, counter, store)
    finally:
        await store.close()
    say(tag=tag, done=True)


async def _run_pay(job: dict[str, Any], counter: Counter, store: CatalogStore) -> None:
    tag = job["tag"]
    rng = random.Random(job["seed"])

    async def pause() -> None:
        await asyncio.sleep(rng.uniform(0, 0.003))

    def hooks(phase: str, key: str) -> None:
        say(tag=tag, phase=phase, key=key)

    pay = pay_tool(counter, replay=job["replay"], hooks=hooks, pause=pause)
    agent = await durable.open(durable.model(ScriptedModel(_pay_script(tag)), [pay]),
                               store=store, session_id=job["session"])
    async for ev in agent.run("pay both"):
        _report(tag, ev)


async def _run_approval_a(job: dict[str, Any], counter: Counter, store: CatalogStore) -> None:
    agent = await durable.open(
        durable.model(ScriptedModel(_refund_script()), [_refund(counter, None)]),
        store=store, session_id=job["session"])
    async for ev in agent.run("refund it"):
        _report(job["tag"], ev)


async def _run_approve(job: dict[str, Any], counter: Counter, store: CatalogStore) -> None:
    tag = job["tag"]
    agent = await durable.open(None, store=store, session_id=job["session"])
    go = Path(job["go"]) if job.get("go") else None
    say(tag=tag, ready=True)
    while go is not None and not go.exists():  # noqa: ASYNC110
        await asyncio.sleep(0.0005)
    try:
        if job["approve"]:
            await agent.approve("big", by=tag)
        else:
            await agent.deny("big", f"denied by {tag}", by=tag)
        say(tag=tag, outcome="ok")
    except DecisionConflict:
        say(tag=tag, outcome="conflict")
    except ApprovalError:
        say(tag=tag, outcome="refused")


async def _run_approval_c(job: dict[str, Any], counter: Counter, store: CatalogStore) -> None:
    tag = job["tag"]
    hang = asyncio.Event()
    lm = ScriptedModel([Turn.text("refunded")])
    agent = await durable.open(durable.model(lm, [_refund(counter, hang, f"{tag}-tool")]),
                               store=store, session_id=job["session"])
    async for ev in agent.continue_run():
        _report(tag, ev)


_MODES = {"pay": _run_pay, "approval_a": _run_approval_a, "approve": _run_approve,
          "approval_c": _run_approval_c}


def _report(tag: str, ev: Any) -> None:
    entries = getattr(ev, "entries", ())
    for e in entries:
        if isinstance(e, MessageEntry):
            kind = type(e.message).__name__
            say(tag=tag, stored=kind)


def _refund(counter: Counter, hang: asyncio.Event | None, tag: str | None = None) -> Any:
    def reconcile(key: str) -> str | None:
        return "refund found by reconcile" if counter.applied(key) else None

    @tool(side_effects=True, reconcile=reconcile,
          approval=lambda a: "over 100" if a["amount"] > 100 else None)
    async def refund(amount: int, ctx: ToolContext) -> str:
        """Refund."""
        counter.hit(ctx.idempotency_key, dedupe=False)
        if tag is not None:  # in a child: tell the test
            say(tag=tag, effect=ctx.idempotency_key)
        if hang is not None:
            await hang.wait()
        return f"refunded {amount}"

    return refund


def _refund_script() -> list[Turn]:
    return [Turn(Call("refund", {"amount": 500}, id="big")), Turn.text("done")]


def _zygote() -> None:
    import_every_store()
    serve(lambda job: asyncio.run(_child(job)))


# -- the test side -----------------------------------------------------------------


@pytest.fixture(scope="module")
def zygote() -> Iterator[ForkServer]:
    z = ForkServer(Path(__file__), Path(__file__).parent)
    yield z
    z.close()


@pytest.fixture(params=PROCESS_STORE_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "postgres":
        return store_url(kind, tmp_path, request.getfixturevalue("pg_url"),
                         request.getfixturevalue("pg_schema"))
    return store_url(kind, tmp_path)


PHASES = ("before_started", "after_started", "mid_tool", "after_effect", "after_result")
WAIT_POINTS = [("stored", "AssistantMessage"), ("phase", "entered"), ("phase", "effect"),
               ("stored", "ToolResultMessage"), (None, None)]


def _phases(entries: list[Entry], counter: Counter, marks: list[dict[str, Any]]) -> list[str]:
    """Where the kill left each call of the killed turn, judged from the store."""
    from threadline.durable._effects import TOOL_STARTED

    started = {e.data.idempotency_key for e in entries
               if isinstance(e, CustomEntry) and e.kind == TOOL_STARTED}
    answered = {e.message.tool_call_id for e in entries
                if isinstance(e, MessageEntry) and isinstance(e.message, ToolResultMessage)}
    entered = {m["key"] for m in marks if m.get("phase") == "entered"}
    assistant = next((e for e in entries if isinstance(e, MessageEntry)
                      and isinstance(e.message, AssistantMessage)), None)
    if assistant is None:
        return []
    from threadline.durable._effects import idempotency_key

    out = []
    for call in assistant.message.tool_calls:  # type: ignore[union-attr]
        key = idempotency_key(assistant.id, call.id)
        if call.id in answered:
            out.append("after_result")
        elif counter.applied(key):
            out.append("after_effect")
        elif key in entered:
            out.append("mid_tool")
        elif key in started:
            out.append("after_started")
        else:
            out.append("before_started")
    return out


async def _settle(url: str, session: str, counter: Counter, replay: str) -> list[Entry]:
    store = open_store(url)
    try:
        pay = pay_tool(counter, replay=replay)  # type: ignore[arg-type]
        agent = await durable.open(durable.model(ScriptedModel(_pay_script(session)), [pay]),
                                   store=store, session_id=session)
        await agent.continue_run().collect()
        assert_valid_for_providers(agent.messages())
        return agent.path()
    finally:
        await store.close()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("replay", ["never", "safe"])
def test_s21_double_payment_200_kills_at_every_phase(
    zygote: ForkServer, url: str, tmp_path: Path, replay: str
) -> None:
    counter = Counter(tmp_path / "effects.db")
    rng = random.Random(20261201)
    hit = dict.fromkeys(PHASES, 0)
    kills = 0
    for i in range(210):
        tag = f"{replay}-{i}-{tmp_path.name}"
        session = f"pay-{i}"
        pid = zygote.start(tag=tag, mode="pay", store=url, session=session, seed=i,
                           counter=str(counter.path), replay=replay)
        key, value = WAIT_POINTS[i % len(WAIT_POINTS)]
        if key is not None:
            try:
                zygote.wait_for(tag, key, value=value, timeout=30)
            except AssertionError:
                if not any("done" in m for m in zygote.lines.get(tag, ())):
                    raise
        time.sleep(rng.uniform(0, 0.004))
        kill(pid)
        kills += 1
        entries = asyncio.run(_load(url, session))
        for phase in _phases(entries, counter, zygote.lines.get(tag, [])):
            hit[phase] += 1
        path = asyncio.run(_settle(url, session, counter, replay))
        results = assert_one_result_each(path)
        assistant = [e for e in path if isinstance(e, MessageEntry)
                     and isinstance(e.message, AssistantMessage) and e.message.tool_calls]
        if not assistant:  # killed before its input was stored: nothing to continue
            assert not path, f"kill {i}: {path}"
            continue
        assert len(assistant) == 1, f"kill {i}: the conversation asked twice"
        from threadline.durable._effects import idempotency_key

        for call in assistant[0].message.tool_calls:  # type: ignore[union-attr]
            k = idempotency_key(assistant[0].id, call.id)
            hits, applied = counter.table().get(k, (0, 0))
            result = results[call.id]
            outcome = (result.details or {}).get("outcome") if isinstance(
                result.details, dict) else None
            if replay == "never":
                assert hits <= 1 and applied <= 1, f"kill {i}: {call.id} ran {hits} times"
                if applied:
                    assert result.text.startswith("paid") or outcome == "unknown", result
                else:
                    assert outcome == "unknown", f"kill {i}: {result} without an effect"
            else:
                assert applied == 1, f"kill {i}: {call.id} applied {applied} times"
                assert result.text.startswith("paid"), result
    assert kills >= 200
    kind = url.split(":", maxsplit=1)[0]
    print(f"{replay} on {kind}: calls left in each phase by the kills: {hit}")
    assert all(n >= 3 for n in hit.values()), hit  # every phase really was hit
    if replay == "safe":
        assert any(h > 1 for h, _ in counter.table().values())  # reruns, deduplicated


async def _load(url: str, session: str) -> list[Entry]:
    from threadline.errors import SessionNotFound

    store = open_store(url)
    try:
        return list(await store.load_entries(session))
    except SessionNotFound:
        return []
    finally:
        await store.close()


@pytest.mark.timeout(120)
def test_s23_approval_across_processes_with_a_kill_during_the_last(
    zygote: ForkServer, url: str, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "effects.db")
    common = {"store": url, "session": "refund", "counter": str(counter.path)}
    a, b, c = (f"{p}-{tmp_path.name}" for p in "ABC")
    zygote.start(tag=a, mode="approval_a", **common)
    zygote.wait_for(a, "done")
    zygote.start(tag=b, mode="approve", approve=True, **common)
    assert zygote.wait_for(b, "outcome")["outcome"] == "ok"
    pid = zygote.start(tag=c, mode="approval_c", **common)
    zygote.wait_for(f"{c}-tool", "effect")  # C refunded and hangs before its result
    kill(pid)

    async def finish() -> list[Entry]:
        store = open_store(url)
        try:
            lm = ScriptedModel([Turn.text("refunded, confirmed")])
            agent = await durable.open(durable.model(lm, [_refund(counter, None)]),
                                       store=store, session_id="refund")
            assert [s.status for s in agent.tool_calls()] == ["in_doubt"]
            await agent.continue_run().collect()
            assert_valid_for_providers(lm.requests[0].messages)
            return agent.path()
        finally:
            await store.close()

    path = asyncio.run(finish())
    result = assert_one_result_each(path)["big"]
    assert result.text == "refund found by reconcile"
    assert [a for _, a in counter.table().values()] == [1]  # at most once, despite the kill


@pytest.mark.timeout(180)
def test_s24_two_processes_decide_at_once(zygote: ForkServer, url: str, tmp_path: Path) -> None:
    counter = Counter(tmp_path / "effects.db")
    outcomes: dict[str, int] = {}
    for round_ in range(8):
        session = f"race-{round_}"
        common = {"store": url, "session": session, "counter": str(counter.path)}
        asker = f"A{round_}-{tmp_path.name}"
        zygote.start(tag=asker, mode="approval_a", **common)
        zygote.wait_for(asker, "done")
        go = tmp_path / f"go-{round_}"
        tags = [f"yes{round_}-{tmp_path.name}", f"no{round_}-{tmp_path.name}"]
        for t, approve in zip(tags, (True, False), strict=True):
            zygote.start(tag=t, mode="approve", approve=approve, go=str(go), **common)
        for t in tags:
            zygote.wait_for(t, "ready")
        go.touch()
        got = {t: zygote.wait_for(t, "outcome")["outcome"] for t in tags}
        for o in got.values():
            outcomes[o] = outcomes.get(o, 0) + 1
        assert sorted(got.values()) in (["ok", "refused"], ["conflict", "ok"]), got
        winner = next(t for t, o in got.items() if o == "ok")

        async def check(session: str = session, winner: str = winner) -> None:
            store = open_store(url)
            try:
                lm = ScriptedModel([Turn.text("ok")])
                agent = await durable.open(durable.model(lm, [_refund(counter, None)]),
                                           store=store, session_id=session)
                (state,) = agent.tool_calls()
                assert state.decision is not None and state.decision.data.by == winner
                await agent.continue_run().collect()
                result = assert_one_result_each(agent.path())["big"]
                assert ("denied" in result.text) == winner.startswith("no")
            finally:
                await store.close()

        asyncio.run(check())
    assert outcomes["ok"] == 8


if __name__ == "__main__":
    _zygote()
