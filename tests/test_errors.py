"""The error tree: one root, messages that say what and where, safe to pickle."""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Sequence

import pytest

from threadline import durable, errors
from threadline.ai import UserMessage
from threadline.errors import (
    CorruptLog,
    RateLimitError,
    SessionExists,
    SessionNotFound,
    StoreError,
    ThreadlineError,
)
from threadline.session import Entry, SessionRecord
from threadline.stores import MemoryStore


def test_every_public_error_derives_from_the_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, ThreadlineError), name


@pytest.mark.parametrize(
    "exc",
    [
        SessionExists("user-42"),
        SessionNotFound("user-42", "sessions/user-42.jsonl"),
        CorruptLog("expected an entry", session_id="user-42", path="s/user-42.jsonl", line=17),
        RateLimitError("slow down", provider="openai", retry_after=2.5, status_code=429),
        StoreError("disk full", session_id="user-42"),
    ],
)
def test_errors_survive_pickling_across_processes(exc: ThreadlineError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.__dict__ == exc.__dict__


def test_messages_name_what_and_where() -> None:
    assert str(SessionNotFound("user-42", "sessions/")) == (
        "session 'user-42' not found in sessions/"
    )
    corrupt = CorruptLog("expected an entry, got 'x'", path="sessions/user-42.jsonl", line=17)
    assert str(corrupt) == "sessions/user-42.jsonl line 17: expected an entry, got 'x'"
    assert corrupt.line == 17 and corrupt.path == "sessions/user-42.jsonl"


class _FailsAfterGate:
    """A memory store whose appends wait for ``release`` and then fail."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> list[Entry]:
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        self.entered.set()
        await self.release.wait()
        raise StoreError("disk went away", session_id=session_id)


async def test_store_error_during_cancelled_append_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _FailsAfterGate()
    agent = await durable.open(None, store=store, session_id="user-42")
    task = asyncio.create_task(agent.append(UserMessage.of("hi")))
    await store.entered.wait()
    task.cancel()
    store.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = [r for r in caplog.records if r.name == "threadline.durable"]
    assert record.levelno == logging.ERROR
    assert "session user-42" in record.getMessage() and "1 entries" in record.getMessage()
    assert record.exc_info is not None and str(record.exc_info[1]) == "disk went away"
    assert agent.entries == []  # memory does not claim what the store may not have
