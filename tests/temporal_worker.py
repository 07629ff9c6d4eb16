"""A Temporal worker for the kill tests, run as a fork server (tests/support/engines.py).

Each job is one worker process on a task queue. It reports every activity
it enters (with the task token, so the test can fail the attempts a killed
worker held instead of waiting for their timeouts) and counts the kill
points it passes: entering and leaving each activity, and optionally the
pay tool's own steps. At the job's ``kill_at``-th point it says so and
stops dead, for the test to kill it there. It takes one activity at a time
and keeps no workflow in its cache, so it holds no task it did not report.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from fork_server import say, serve
from support.effects import Counter
from support.engines import model, tools
from threadline.integrations.temporal import ConversationActivities, ConversationWorkflow
from threadline.stores import open_store


class _Points:
    def __init__(self, job: dict[str, Any]) -> None:
        self.tag = job["tag"]
        self.kill_at = int(job.get("kill_at", 0))
        self.points = set(job.get("points", ("enter", "exit")))
        self.seen = 0

    def reached(self, phase: str, **fields: Any) -> None:
        if phase not in self.points:
            return
        self.seen += 1
        if self.seen == self.kill_at:
            say(tag=self.tag, at=self.seen, phase=phase, **fields)
            time.sleep(3600)  # everything stops here until the kill


def _interceptor(points: _Points) -> Interceptor:
    class Inbound(ActivityInboundInterceptor):
        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            info = activity.info()
            say(tag=points.tag, entered=info.task_token.hex())
            points.reached("enter", activity=info.activity_type)
            result = await self.next.execute_activity(input)
            points.reached("exit", activity=info.activity_type)
            return result

    class Points(Interceptor):
        def intercept_activity(self, next: ActivityInboundInterceptor
                               ) -> ActivityInboundInterceptor:
            return Inbound(next)

    return Points()


async def _work(job: dict[str, Any]) -> None:
    points = _Points(job)
    client = await Client.connect(job["address"])
    store = open_store(job["store"])
    counter = Counter(Path(job["counter"]))
    activities = ConversationActivities(
        store, model(), tools(counter, job.get("replay", "never"),
                              hooks=lambda phase, key: points.reached(phase, key=key)))
    worker = Worker(client, task_queue=job["queue"], workflows=[ConversationWorkflow],
                    activities=activities.activities, interceptors=[_interceptor(points)],
                    max_cached_workflows=0, max_concurrent_activities=1)
    say(tag=points.tag, ready=True)
    await worker.run()


def _run(job: dict[str, Any]) -> None:
    asyncio.run(_work(job))


if __name__ == "__main__":
    import threadline.stores.postgres  # noqa: F401  (imported once, before the forks)

    serve(_run)
