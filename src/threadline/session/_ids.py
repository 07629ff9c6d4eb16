"""Time-ordered unique ids (UUID version 7 layout, RFC 9562).

Entry ids sort by creation time, so ids from concurrent writers and from
forks never collide and a log's ids are meaningful to a human skimming it.
Python 3.11 has no ``uuid.uuid7``; this is the RFC's method 1: a 48-bit
millisecond clock, then a 12-bit counter seeded at random each millisecond
(monotonic within one process), then 62 random bits.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["new_id"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> str:
    global _last_ms, _counter  # noqa: PLW0603 (one process-wide clock keeps ids ordered)
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2)) & 0x7FF
        else:
            # Same millisecond (or the clock stepped back): keep ids increasing.
            _counter += 1
            if _counter > 0xFFF:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        counter = _counter
    rand = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
