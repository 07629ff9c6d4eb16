"""Entry ids: unique, time-ordered, RFC 9562 UUID version 7."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from threadline.session import _ids as ids
from threadline.session._ids import new_id


def _ms(entry_id: str) -> int:
    return uuid.UUID(entry_id).int >> 80


def test_ids_are_valid_uuid_version_7() -> None:
    for _ in range(1000):
        s = new_id()
        u = uuid.UUID(s)
        assert str(u) == s  # canonical lower-case 8-4-4-4-12 form
        assert u.version == 7
        assert u.variant == uuid.RFC_4122


def test_ids_from_many_threads_are_unique_and_time_ordered() -> None:
    per_thread, n_threads = 5_000, 8
    shared: list[str] = []
    shared_lock = threading.Lock()
    per: list[list[str]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads)

    def work(k: int) -> None:
        start.wait()
        mine = per[k]
        for i in range(per_thread):
            mine.append(new_id())
            if i % 10 == 0:
                # Generated and recorded under one lock: the shared list is in
                # generation order across threads.
                with shared_lock:
                    shared.append(new_id())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for mine in per for i in mine] + shared
    assert len(set(everything)) == len(everything)
    for mine in per:
        assert mine == sorted(mine)
        assert len(set(mine)) == len(mine)
    assert shared == sorted(shared)


class _Clock:
    """A controllable ``time`` stand-in: the id generator reads only ``time_ns``."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def time_ns(self) -> int:
        return self.ms * 1_000_000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    c = _Clock(time.time_ns() // 1_000_000 + 10_000)
    # Undone after the test, so later ids carry the real time again.
    monkeypatch.setattr(ids, "_clock", ids._Clock())
    monkeypatch.setattr(ids, "time", c)
    yield c


def test_ids_within_one_millisecond_keep_increasing(clock: _Clock) -> None:
    # 4096 counter values per millisecond at most: this burst overflows and
    # borrows from the next millisecond rather than repeating or going back.
    burst = [new_id() for _ in range(10_000)]
    assert burst == sorted(burst)
    assert len(set(burst)) == len(burst)
    assert _ms(burst[0]) == clock.ms
    assert _ms(burst[-1]) > clock.ms


def test_ids_within_one_millisecond_differ_in_their_random_tail(clock: _Clock) -> None:
    # The CLI shows an entry by the end of its id (``short``): ids made in
    # one millisecond differ there too, not only in their counter.
    burst = [new_id() for _ in range(1000)]
    assert len({i[-12:] for i in burst}) == len(burst)
    assert len({_ms(i) for i in burst}) == 1


def test_ids_keep_increasing_when_the_clock_steps_back(clock: _Clock) -> None:
    a = new_id()
    clock.ms -= 5_000
    b = new_id()
    clock.ms += 5_000 + 1_000
    c = new_id()
    assert a < b < c
    assert _ms(c) == clock.ms


def test_ids_carry_the_creation_time_in_milliseconds() -> None:
    # Runs after the fake-clock tests: their fixture must leave real time behind.
    before = time.time_ns() // 1_000_000
    s = new_id()
    after = time.time_ns() // 1_000_000
    assert before <= _ms(s) <= after + 1  # +1: a counter overflow may borrow a millisecond


def test_ids_differ_in_a_forked_child_and_ignore_random_seed() -> None:
    # The random part comes from a generator of the module's own, reseeded
    # in a forked child: a parent and child drawing at once never repeat
    # each other, whatever the application did to the global random module.
    random.seed(0)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        os.write(write_end, "\n".join(new_id() for _ in range(200)).encode())
        os._exit(0)
    os.close(write_end)
    mine = [new_id() for _ in range(200)]
    with os.fdopen(read_end, "rb") as pipe:
        theirs = pipe.read().decode().split("\n")
    os.waitpid(pid, 0)
    assert len(theirs) == 200
    assert not set(mine) & set(theirs)
    random.seed(0)
    again = new_id()
    random.seed(0)
    assert new_id() != again
