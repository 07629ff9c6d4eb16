"""Time-ordered unique ids (UUID version 7 layout, RFC 9562).

Entry ids sort by creation time, so ids from concurrent writers and from
forks never collide and a log's ids are meaningful to a human skimming it.
Python 3.11 has no ``uuid.uuid7``; this is the RFC's method 1: a 48-bit
millisecond clock, then a 12-bit counter seeded at random each millisecond
(monotonic within one process), then 62 random bits.
"""

from __future__ import annotations

import os
import random
import threading
import time

__all__ = ["new_id"]

_lock = threading.Lock()
# The random bits need to be unique, not secret: a generator of our own,
# seeded from os.urandom and again in every forked child, costs a third of
# an os.urandom call per id, and nobody's random.seed() can repeat its ids.
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)
_bits = _random.getrandbits
_last_ms = 0
_counter = 0


def new_id() -> str:
    global _last_ms, _counter  # noqa: PLW0603 (one process-wide clock keeps ids ordered)
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = _bits(11)
        else:
            # Same millisecond (or the clock stepped back): keep ids increasing.
            _counter += 1
            if _counter > 0xFFF:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        counter = _counter
    rand = _bits(62)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
