"""Time-ordered unique ids (UUID version 7 layout, RFC 9562).

Entry ids sort by creation time, so ids from concurrent writers and from
forks never collide and a log's ids are meaningful to a human skimming it.
Python 3.11 has no ``uuid.uuid7``; this is the RFC's method 1: a 48-bit
millisecond clock, then a 12-bit counter seeded at random each millisecond
(monotonic within one process), then 62 random bits, drawn once per
millisecond: the counter already tells apart the ids of one millisecond, and
the random bits the processes that share it.

An id is made on every stored message, and formatting a 128-bit number into
the 8-4-4-4-12 form costs more than the rest of an append's bookkeeping. So
each millisecond gets a template (its clock, random bits and version) once,
and its ids come from one C iterator over the counter: ``next`` formats one
small number into the template, in one step the GIL keeps whole, so threads
need no lock until the millisecond changes.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator

__all__ = ["new_id"]

_lock = threading.Lock()
# The random bits need to be unique, not secret: a generator of our own,
# seeded from os.urandom and again in every forked child, and nobody's
# random.seed() can repeat its ids.
_random = random.Random()
_bits = _random.getrandbits

_COUNTER_END = 0x1000  # 12 bits
_NOT_YET: Iterator[str] = iter(())

_ms = -1
"""The millisecond of the last id (ahead of the clock after a burst, never behind it)."""
_template = ""
"""The ids of ``_ms``: its clock, version and random bits, ``%03x`` for the counter."""
_counter = 0
"""The counter of the last id ``_template`` made itself."""
_ids: Iterator[str] = _NOT_YET
"""The rest of ``_ms``'s ids, in increasing order, made once a second one is asked for."""


def _forked() -> None:
    global _ms, _ids  # the child draws its own random bits
    _random.seed()
    _ms, _ids = -1, _NOT_YET


os.register_at_fork(after_in_child=_forked)


def new_id() -> str:
    now = time.time_ns() // 1_000_000
    if now == _ms:
        made = next(_ids, None)
        if made is not None:
            return made
    return _next_id(now)


def _next_id(now: int) -> str:
    """The id when the clock moved on or stepped back, or ``_ids`` ran out or is not made yet."""
    global _ms, _template, _counter, _ids  # noqa: PLW0603 (one clock keeps ids ordered)
    _lock.acquire()  # not ``with``: this runs for nearly every id a real run makes
    try:
        if now > _ms:
            ms, counter = now, _bits(11)
        else:
            # The same millisecond (its second id, or another thread moved on
            # first), or the clock stepped back: keep ids increasing.
            made = next(_ids, None)
            if made is not None:
                return made
            if _ids is _NOT_YET and _counter < _COUNTER_END - 1:
                _counter += 1
                _ids = map(_template.__mod__, range(_counter + 1, _COUNTER_END))
                return _template % _counter
            ms, counter = _ms + 1, 0  # the counter ran out: borrow the next millisecond
        # ``_ids`` first and ``_ms`` last: a thread reading them without the
        # lock never pairs the new millisecond with the old one's ids.
        _ids = _NOT_YET
        rand = _bits(62) | 0x8000_0000_0000_0000  # the variant's two bits are 10
        _template = (f"{ms.to_bytes(6, 'big').hex('-', -4)}-7%03x-"
                     f"{rand.to_bytes(8, 'big').hex('-', 6)}")
        _counter = counter
        _ms = ms
        return _template % counter
    finally:
        _lock.release()
