"""Odd arguments for the probes each level makes of its methods.

Each call must raise the documented typed error before it touches storage,
and leave the store as it was: ``InvalidSessionId`` for a session id that
breaks the rule, ``ConfigError`` for an entry-id argument that could name no
entry, an ``entries`` argument that is not a list or tuple, a bad ``limit``
or cursor, and ``InvalidEntry`` for a list holding something that is not an
entry. A test collects every wrong answer before it fails, so one run names
them all.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from threadline.errors import ConfigError, InvalidEntry
from threadline.session._entries import Entry
from threadline.stores._contract import Store
from threadline.testing._conformance._base import SuiteBase
from threadline.testing._conformance._children import aclose
from threadline.testing._conformance._data import chain_entry

__all__ = [
    "BAD_CURSORS",
    "BAD_ENTRY_IDS",
    "BAD_LIMITS",
    "BAD_SESSION_IDS",
    "Probes",
    "first_entry",
    "session_with_one_entry",
]

BAD_SESSION_IDS: tuple[Any, ...] = (1, "", ["x"], "\ud800", "a\x00b", None)
BAD_ENTRY_IDS: tuple[Any, ...] = (1, ["x"], "\ud800", "", "a\x00b", "é" * 513)
BAD_LIMITS: tuple[Any, ...] = (0, -1, True, "3", 1.5, None)
BAD_CURSORS: tuple[Any, ...] = ("", "not a cursor", 5, ["x"], "\ud800")
NOT_ENTRIES: tuple[Any, ...] = (None, "x", 1, {"type": "message"})

# A call that waits instead of answering would hold the test: give up on it,
# and report it as a wrong answer (a hang guard, not a measure).
_GUARD = 20.0


def _bad_batches(entry: Entry) -> dict[str, Callable[[], object]]:
    """Arguments that are not a list or tuple of entries, each made afresh."""
    return {
        "a generator": lambda: (e for e in [entry]),
        "a single entry": lambda: entry,
        "None": lambda: None,
        "a dict": lambda: {entry.id: entry},
    }


async def _made(append: Callable[[str, Any], Awaitable[Any]], session_id: str,
                make: Callable[[], object]) -> None:
    await append(session_id, make())


async def first_entry(watch: Callable[..., AsyncIterator[Entry]], *args: object) -> Entry:
    iterator = watch(*args)
    try:
        return await anext(iterator)
    finally:
        await aclose(iterator)


class Probes:
    """Calls that must each raise one error type; every other answer is noted."""

    def __init__(self) -> None:
        self.wrong: list[str] = []

    async def expect(self, error: type[Exception], label: str,
                     call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await asyncio.wait_for(call(), _GUARD)
        except error:
            return
        except TimeoutError:
            self.wrong.append(f"{label}: still waiting after {_GUARD:.0f} s, "
                              f"not {error.__name__}")
        except Exception as exc:
            text = str(exc).splitlines()[0][:120] if str(exc) else ""
            self.wrong.append(f"{label}: {type(exc).__name__}({text!r}), not {error.__name__}")
        else:
            self.wrong.append(f"{label}: returned, not {error.__name__}")

    async def entries(self, append: Callable[[str, Any], Awaitable[Any]], name: str,
                      session_id: str, entry: Entry) -> None:
        """The ``entries`` argument of an append: not a sequence, or holding a non-entry."""
        for label, make in _bad_batches(entry).items():
            await self.expect(ConfigError, f"{name}({session_id!r}, {label})",
                              functools.partial(_made, append, session_id, make))
        for item in NOT_ENTRIES:
            for batch, shown in (([entry, item], f"[entry, {item!r}]"), ([item], f"[{item!r}]")):
                await self.expect(InvalidEntry, f"{name}({session_id!r}, {shown})",
                                  functools.partial(append, session_id, batch))

    def check(self, store: Store) -> None:
        if self.wrong:
            pytest.fail(f"{type(store).__name__} answered {len(self.wrong)} odd "
                        f"argument(s) wrongly:\n  " + "\n  ".join(self.wrong))


async def session_with_one_entry(suite: SuiteBase, store: Store) -> tuple[str, list[Entry]]:
    sid = await suite.new_session(store)
    kept: list[Entry] = [chain_entry(None, 0, 0)]
    await store.append_entries(sid, kept)
    return sid, kept
