"""The DBOS integration on the local PostgreSQL, its processes killed with SIGKILL.

DBOS keeps its system tables in a schema of the test database; the
transcripts go to another schema through threadline's PostgreSQL store.
Processes are children of a fork server (tests/dbos_worker.py), killed at
exact points (before a step's load, after each of its appends), and the next
one recovers the pending workflows when it launches DBOS.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema
from fork_server import ForkServer, kill
from support.effects import Counter
from support.engines import MESSAGES, check_exactly_once
from threadline.session import Entry, TreeIndex
from threadline.stores import open_store

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def workers() -> Iterator[ForkServer]:
    server = ForkServer(HERE / "dbos_worker.py", HERE)
    yield server
    server.close()


@pytest.fixture
def system_schema(pg_url: str, pg_schema: str) -> Iterator[str]:
    schema = f"{pg_schema}_dbos"
    yield schema
    drop_schema(pg_url, schema)


class Runner:
    def __init__(self, workers: ForkServer, **job: Any) -> None:
        self.workers, self.job = workers, job
        self.started = self.kills = 0

    def run(self, conversations: list[tuple[str, str, list[str]]], kill_points: Iterator[int],
            kills: int) -> dict[str, str]:
        """Processes one after another until every conversation is done; the leaves."""
        wids = [wid for wid, _, _ in conversations]
        start: list[Any] = list(conversations)
        while True:
            self.started += 1
            tag = f"{self.job['system_schema']}-p{self.started}"
            kill_at = next(kill_points) if kills > 0 else 0
            pid = self.workers.start(tag=tag, kill_at=kill_at, start=start, workflows=wids,
                                     **self.job)
            start = []  # later processes recover them
            msg = self.workers.wait_for(tag, "at", "finished", timeout=300)
            kill(pid)
            if "finished" in msg:
                return {m["done"]: m["leaf"] for m in self.workers.lines[tag] if "done" in m}
            kills -= 1
            self.kills += 1


def _path(store_url: str, session_id: str, leaf_id: str) -> tuple[list[Entry], list[Entry]]:
    async def load() -> list[Entry]:
        store = open_store(store_url)
        try:
            return list(await store.load_entries(session_id))
        finally:
            await store.close()

    entries = asyncio.run(load())
    tree = TreeIndex(entries, session_id=session_id)
    tree.set_leaf(leaf_id)
    return entries, tree.path()


def _kill_run(workers: ForkServer, pg_url: str, pg_schema: str, system_schema: str, *,
              tmp_path: Path, kills_wanted: int) -> tuple[int, int]:
    counter = Counter(tmp_path / "effects.db")
    store_url = f"{pg_url}?schema={pg_schema}"
    runner = Runner(workers, system_db=pg_url, system_schema=system_schema, store=store_url,
                    counter=str(counter.path))
    leaves = runner.run([("reference", "reference", MESSAGES)], iter(()), 0)
    _, reference = _path(store_url, "reference", leaves["reference"])
    assert len(reference) == 21
    points = itertools.cycle([3, 1, 4, 2, 6, 5, 8, 7, 10, 9])
    batches = 0
    while runner.kills < kills_wanted:
        batches += 1
        sid = f"b{batches}"
        leaves = runner.run([(sid, sid, MESSAGES)], points, kills_wanted - runner.kills)
        entries, path = _path(store_url, sid, leaves[sid])
        check_exactly_once(entries, path, reference, counter)
    return runner.kills, batches


@pytest.mark.timeout(600)
def test_s50_dbos_kills_at_step_boundaries_sample(workers: ForkServer, pg_url: str, pg_schema: str,
                                              system_schema: str, tmp_path: Path) -> None:
    """A deterministic sample of the stress test below, for every run of the suite."""
    kills, _ = _kill_run(workers, pg_url, pg_schema, system_schema, tmp_path=tmp_path,
                         kills_wanted=12)
    assert kills >= 12


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_s50_dbos_100_kills_at_step_boundaries(workers: ForkServer, pg_url: str, pg_schema: str,
                                           system_schema: str, tmp_path: Path) -> None:
    kills, batches = _kill_run(workers, pg_url, pg_schema, system_schema,
                               tmp_path=tmp_path, kills_wanted=100)
    assert kills >= 100
    print(f"{kills} kills over {batches} conversations")


@pytest.mark.timeout(330)
def test_the_dbos_example_runs(pg_url: str, pg_schema: str, system_schema: str) -> None:
    assert system_schema == f"{pg_schema}_dbos"  # the example puts DBOS's tables there
    done = subprocess.run(
        [sys.executable, str(HERE.parent / "examples" / "dbos_conversation.py"), "--pg", pg_url,
         "--schema", pg_schema], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "awaiting approval: ['r-B-2']", "  UserMessage: refund B-2 250",
        "  AssistantMessage: ['refund']", "  threadline.tool_plan",
        "  threadline.approval_requested", "  threadline.approval_decided",
        "  threadline.tool_started", "  ToolResultMessage: refunded 250 on B-2",
        "  AssistantMessage: Done: refunded 250 on B-2."]
