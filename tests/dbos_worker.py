"""A DBOS process for the kill tests, run as a fork server (tests/support/engines.py).

Each job is one process: it launches DBOS on the test's system schema
(recovering the workflows a killed process left pending), optionally starts
the job's conversations, and reports each one's final leaf. Its store
counts a kill point before every load and after every append that ends a
step: a step begins with a load, and its last append is its last act before
DBOS checkpoints it. At the job's ``kill_at``-th point the process stops
dead for the test to kill it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from fork_server import say, serve
from support.effects import Counter
from support.engines import model, tools
from threadline.durable._effects import TOOL_STARTED
from threadline.integrations.dbos import DBOSConversation
from threadline.session import CustomEntry, Entry, SessionRecord
from threadline.stores import Store, open_store


class _Points:
    def __init__(self, job: dict[str, Any]) -> None:
        self.tag = job["tag"]
        self.kill_at = int(job.get("kill_at", 0))
        self.seen = 0

    def reached(self, phase: str) -> None:
        self.seen += 1
        if self.seen == self.kill_at:
            say(tag=self.tag, at=self.seen, phase=phase)
            time.sleep(3600)  # everything stops here until the kill


class _Reporting:
    """The store, with a kill point before each load and after each append."""

    def __init__(self, store: Store, points: _Points) -> None:
        self.store, self.points = store, points

    async def create_session(self, record: SessionRecord) -> None:
        await self.store.create_session(record)

    async def load_entries(self, session_id: str) -> Sequence[Entry]:
        self.points.reached("load")
        return await self.store.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.store.append_entries(session_id, entries)
        # A started record is the middle of a tool step (the tool runs next),
        # where a kill leaves the call in doubt: test_s21 kills there.
        if not all(isinstance(e, CustomEntry) and e.kind == TOOL_STARTED for e in entries):
            self.points.reached("appended")


async def _work(job: dict[str, Any]) -> None:
    points = _Points(job)
    DBOS(config={"name": "threadline-test", "system_database_url": job["system_db"],
                 "dbos_system_schema": job["system_schema"],
                 "application_version": "threadline-test", "log_level": "ERROR",
                 "notification_listener_polling_interval_sec": 0.01})
    store = open_store(job["store"])
    conversation = DBOSConversation(_Reporting(store, points), model(),
                                    tools(Counter(Path(job["counter"]))), name="tl")
    DBOS.launch()
    for wid, session_id, messages in job.get("start", ()):
        with SetWorkflowID(wid):
            await DBOS.start_workflow_async(conversation.conversation, session_id, None,
                                            messages)
    for wid in job["workflows"]:
        handle = await DBOS.retrieve_workflow_async(wid)
        say(tag=points.tag, done=wid, leaf=await handle.get_result())
    say(tag=points.tag, finished=True)


def _run(job: dict[str, Any]) -> None:
    asyncio.run(_work(job))


if __name__ == "__main__":
    import threadline.stores.postgres  # noqa: F401  (imported once, before the forks)

    serve(_run)
