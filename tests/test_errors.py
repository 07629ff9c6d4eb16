"""The error tree: one root, messages that say what and where, safe to pickle."""

from __future__ import annotations

import pickle

import pytest

from threadline import errors
from threadline.errors import (
    CorruptLog,
    RateLimitError,
    SessionExists,
    SessionNotFound,
    StoreError,
    ThreadlineError,
)


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
