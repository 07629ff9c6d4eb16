"""A store wrapper that fails on purpose, to prove what callers do on failure.

``FaultyStore(inner, fail_append_on=3)`` lets the first two ``append_entries``
calls through and fails the third, before anything reaches ``inner`` (so the
failed batch is not stored). ``when="after"`` stores the batch first and then
raises: the caller sees an error for data that is in fact stored, as after a
lost acknowledgement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Literal

from threadline.errors import StoreError
from threadline.session._entries import Entry, SessionRecord
from threadline.stores._contract import Store

__all__ = ["FaultyStore"]

Calls = int | Collection[int] | None


def _hits(spec: Calls, n: int) -> bool:
    if spec is None:
        return False
    if isinstance(spec, int):
        return spec == n
    return n in spec


class FaultyStore:
    """Wraps ``inner``; fails the k-th call (1-based) of the chosen methods.

    Each ``fail_*_on`` takes a call number, a collection of call numbers, or
    ``None``. ``error`` is the exception raised (a fresh ``StoreError`` by
    default). Methods beyond the three of the protocol pass through to
    ``inner`` unchanged. The ``*_calls`` counters count every call, failed
    ones included.
    """

    def __init__(
        self,
        inner: Store,
        *,
        fail_append_on: Calls = None,
        fail_create_on: Calls = None,
        fail_load_on: Calls = None,
        error: BaseException | None = None,
        when: Literal["before", "after"] = "before",
    ) -> None:
        self.inner = inner
        self.fail_append_on = fail_append_on
        self.fail_create_on = fail_create_on
        self.fail_load_on = fail_load_on
        self.error = error
        self.when = when
        self.append_calls = 0
        self.create_calls = 0
        self.load_calls = 0
        self.appended: list[Entry] = []
        """Entries ``inner`` accepted through this wrapper, in order."""

    def _error(self, what: str, session_id: str) -> BaseException:
        if self.error is not None:
            return self.error
        return StoreError(f"injected fault: {what} of session {session_id!r}",
                          session_id=session_id)

    async def create_session(self, record: SessionRecord) -> None:
        self.create_calls += 1
        fail = _hits(self.fail_create_on, self.create_calls)
        if fail and self.when == "before":
            raise self._error(f"create_session call {self.create_calls}", record.id)
        await self.inner.create_session(record)
        if fail:
            raise self._error(f"create_session call {self.create_calls}", record.id)

    async def load_entries(self, session_id: str) -> list[Entry]:
        self.load_calls += 1
        if _hits(self.fail_load_on, self.load_calls):
            raise self._error(f"load_entries call {self.load_calls}", session_id)
        return await self.inner.load_entries(session_id)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        self.append_calls += 1
        fail = _hits(self.fail_append_on, self.append_calls)
        if fail and self.when == "before":
            raise self._error(f"append_entries call {self.append_calls}", session_id)
        await self.inner.append_entries(session_id, entries)
        self.appended.extend(entries)
        if fail:
            raise self._error(f"append_entries call {self.append_calls}", session_id)

    def __getattr__(self, name: str) -> Any:
        # load_session, list_sessions, delete_session, close, ...: unchanged.
        return getattr(self.inner, name)
