"""Timing and alternation for every benchmark, and the run context they report into.

Variants are sampled in turns: sample k runs every variant once, starting
from variant ``k mod n``, so each one goes first as often as any other and
a change of load (or a worker thread still settling) hits them alike.
Figures are medians or percentiles over the samples, and a ratio is taken
against a floor or a peer measured in the same turns.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._schema import Goal, Row

PG_URL = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TESTS = Path(__file__).resolve().parent.parent / "tests"

Way = Callable[[], Awaitable[object] | object]


@dataclass(frozen=True)
class Measured:
    """What a way returns when it times its own work (leaving its setup out)."""

    wall: float
    cpu: float = 0.0


async def measured(work: Awaitable[object], cpu: Callable[[], float] = time.thread_time
                   ) -> Measured:
    """Time ``work`` on the wall and a CPU clock."""
    c0, t0 = cpu(), time.perf_counter()
    await work
    return Measured(time.perf_counter() - t0, cpu() - c0)


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1): with 100 samples p99 is the 99th."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def paired(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of ``a[i] / b[i]``: samples taken in the same turn, divided first."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def rotated(names: Sequence[str], k: int) -> list[str]:
    """The order of turn ``k``: every name first in turn."""
    i = k % len(names)
    return [*names[i:], *names[:i]]


@dataclass
class Samples:
    """Seconds per call of each variant, one value per turn (wall, and CPU if asked)."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.wall[name])

    def pct(self, name: str, q: float) -> float:
        return pct(self.wall[name], q)

    def least(self, name: str) -> float:
        return min(self.wall[name])

    def paired(self, a: str, b: str, *, cpu: bool = False) -> float:
        got = self.cpu if cpu else self.wall
        return paired(got[a], got[b])


async def alternate(
    ways: Mapping[str, Way],
    turns: int,
    *,
    block: int = 1,
    before: Callable[[int], Awaitable[object] | object] | None = None,
    cpu: Callable[[], float] | None = None,
    collect: bool = False,
    warm: bool = True,
) -> Samples:
    """Run every way ``block`` times per turn, ``turns`` turns, each way first in turn.

    ``before(k)`` runs untimed at the start of turn ``k`` (to make that turn's
    entries); ``cpu`` is a CPU clock (``time.thread_time``, ``time.process_time``)
    read beside the wall clock; ``collect`` runs the garbage collector before
    each timed block; ``warm`` runs each way once, untimed, first.
    """
    names = list(ways)
    wall: dict[str, list[float]] = {n: [] for n in names}
    spent: dict[str, list[float]] = {n: [] for n in names}

    async def call(way: Way) -> object:
        got = way()
        if inspect.isawaitable(got):
            return await got
        return got

    async def timed(way: Way) -> Measured:
        if collect:
            gc.collect()
        c0 = cpu() if cpu is not None else 0.0
        t0 = time.perf_counter()
        for _ in range(block):
            got = await call(way)
        if isinstance(got, Measured):  # the way timed itself
            return got
        return Measured((time.perf_counter() - t0) / block,
                        (cpu() - c0) / block if cpu is not None else 0.0)

    for k in range(-1 if warm else 0, turns):
        if before is not None:
            await call(lambda k=k: before(k))  # type: ignore[misc]
        for name in rotated(names, k):
            got = await timed(ways[name])
            if k >= 0:
                wall[name].append(got.wall)
                spent[name].append(got.cpu)
    return Samples(wall, spent)


def alternate_sync(ways: Mapping[str, Callable[[], object]], turns: int, **kw: Any) -> Samples:
    """``alternate`` for plain functions, in an event loop of its own."""
    return asyncio.run(alternate(ways, turns, **kw))


@dataclass
class Run:
    """What one benchmark reports into: its rows, the versions it used, where it works."""

    name: str
    quick: bool
    tmp: Path
    rows: list[Row] = field(default_factory=list)
    packages: dict[str, str] = field(default_factory=dict)
    pg_url: str = PG_URL

    def pick(self, full: Any, quick: Any) -> Any:
        """``full`` for a real run, ``quick`` for a smoke run."""
        return quick if self.quick else full

    def say(self, text: str) -> None:
        print(f"  {self.name}: {text}", file=sys.stderr, flush=True)

    def postgres(self) -> bool:
        """Whether the PostgreSQL server answers (noting its version if it does)."""
        version = postgres_version(self.pg_url)
        self.uses("postgresql", version)
        if version is None:
            self.say(f"no PostgreSQL at {self.pg_url}: its rows are left out")
        return version is not None

    def uses(self, package: str, version: str | None) -> None:
        if version:
            self.packages[package] = version

    def row(self, metric: str, value: float, unit: str, *, versus: str | None = None,
            versus_value: float | None = None, ratio: float | None = None,
            peer: bool = False, goal: Goal | None = None, detail: str = "") -> Row:
        """Add a row. The ratio is ``value / versus_value`` unless given."""
        if ratio is None and versus_value:
            ratio = value / versus_value
        verdict = "no goal" if goal is None else goal.judge(value, ratio)
        row = Row(metric=metric, value=value, unit=unit, versus=versus,
                  versus_kind=None if versus is None else ("peer" if peer else "floor"),
                  versus_value=versus_value, ratio=ratio, goal=goal, verdict=verdict,
                  detail=detail)
        self.rows.append(row)
        shown = f"{value:.4g} {unit}"
        if ratio is not None:
            shown += f"  {ratio:.2f}× {versus}"
        if goal is not None:
            shown += f"  (goal {goal.text()}: {verdict})"
        self.say(f"{metric}: {shown}")
        return row


def at_most(x: float, *, on: str = "ratio") -> Goal:
    return Goal(at_most=x, on=on)  # type: ignore[arg-type]


def at_least(x: float, *, on: str = "ratio") -> Goal:
    return Goal(at_least=x, on=on)  # type: ignore[arg-type]


def postgres_version(url: str) -> str | None:
    """The server's version, or None when it cannot be reached."""
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            return str(conn.info.server_version)
    except Exception:
        return None


def test_helper(module: str) -> Any:
    """One of the test suite's helpers in ``tests/support/`` (PgBouncer, wire server)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(f"support.{module}")


def ms(seconds: float) -> float:
    return seconds * 1e3


def us(seconds: float) -> float:
    return seconds * 1e6
