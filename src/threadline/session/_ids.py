"""Time-ordered unique ids (UUID version 7 layout, RFC 9562).

Entry ids sort by creation time, so ids from concurrent writers and from
forks never collide and a log's ids are meaningful to a human skimming it.
Python 3.11 has no ``uuid.uuid7``; this is the RFC's method 1: a 48-bit
millisecond clock, then a 12-bit counter seeded at random each millisecond
(monotonic within one process), then 62 random bits: 14 drawn once per
process, and the last 48 (the tail the CLI shows as a short id) for every
id. Two processes' ids still differ in 62 random bits.

An id is made for every stored entry, and formatting a 128-bit number into
the 8-4-4-4-12 form costs more than the rest of an append's bookkeeping. So
each millisecond gets a template (its clock, the version, the process's 14
random bits) once, and a second id in the same millisecond starts a C
iterator that formats the counter and fresh random bits into it: ``next``
is one step the GIL keeps whole, so threads need no lock until the
millisecond changes.
"""

from __future__ import annotations

import functools
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
_tails: Iterator[int] = iter(functools.partial(_bits, 48), None)  # never None: endless

_COUNTER_END = 0x1000  # 12 bits
_NOT_YET: Iterator[str] = iter(())


class _Clock:
    """Where the ids have got to. Attributes rather than globals: storing a
    module global makes every function of the module look its globals up
    afresh."""

    __slots__ = ("counter", "ids", "ms", "template", "variant")

    def __init__(self) -> None:
        self.ms = -1
        """The millisecond of the last id (ahead of the clock after a burst, never behind)."""
        self.template = ""
        """The ids of ``ms``: its clock, the version, ``%03x`` for the counter, the
        process's random bits (``variant``), ``%012x`` for the tail."""
        self.counter = 0
        """The counter of the last id ``template`` made itself."""
        self.ids: Iterator[str] = _NOT_YET
        """The rest of ``ms``'s ids, in increasing order, made once a second one is asked for."""
        self.variant = (0x8000 | _bits(14)).to_bytes(2, "big").hex()  # variant bits 10


_clock = _Clock()


def _forked() -> None:
    global _clock  # noqa: PLW0603 (the child draws its own random bits)
    _random.seed()
    _clock = _Clock()


os.register_at_fork(after_in_child=_forked)


def new_id() -> str:
    now = time.time_ns() // 1_000_000
    clock = _clock
    if now == clock.ms:
        made = next(clock.ids, None)
        if made is not None:
            return made
    return _next_id(clock, now)


def _next_id(clock: _Clock, now: int) -> str:
    """The id when the clock moved on or stepped back, or ``ids`` ran out or is not made yet."""
    _lock.acquire()  # not ``with``: this runs for nearly every id a real run makes
    try:
        if now > clock.ms:
            ms, counter = now, _bits(11)
        else:
            # The same millisecond (its second id, or another thread moved on
            # first), or the clock stepped back: keep ids increasing.
            made = next(clock.ids, None)
            if made is not None:
                return made
            if clock.ids is _NOT_YET and clock.counter < _COUNTER_END - 1:
                counter = clock.counter = clock.counter + 1
                clock.ids = map(clock.template.__mod__,
                                zip(range(counter + 1, _COUNTER_END), _tails, strict=False))
                return clock.template % (counter, _bits(48))
            ms, counter = clock.ms + 1, 0  # the counter ran out: borrow the next millisecond
        # ``ids`` first and ``ms`` last: a thread reading them without the
        # lock never pairs the new millisecond with the old one's ids.
        clock.ids = _NOT_YET
        clock.template = template = (f"{ms.to_bytes(6, 'big').hex('-', -4)}-7%03x-"
                                     f"{clock.variant}-%012x")
        clock.counter = counter
        clock.ms = ms
        return template % (counter, _bits(48))
    finally:
        _lock.release()
