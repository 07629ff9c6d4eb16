"""The one shape of every result file, bench/results/<name>.json, checked on write and read.

A result is one run of one benchmark: when, on what machine, from which tree,
and its rows. A row is one figure (``value`` in ``unit``) set against the
floor or the peer measured in the same run (``versus``), their ratio, and,
where the project has one, the goal and whether the run met it.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec

Verdict = Literal["met", "missed", "no goal"]


class Goal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
           omit_defaults=True):
    """A bound on the row's ratio (or on its value): exactly one of the two."""

    at_most: float | None = None
    at_least: float | None = None
    on: Literal["ratio", "value"] = "ratio"

    def __post_init__(self) -> None:
        if (self.at_most is None) == (self.at_least is None):
            raise ValueError("a goal has exactly one of at_most and at_least")

    def judge(self, value: float, ratio: float | None) -> Verdict:
        x = value if self.on == "value" else ratio
        if x is None:
            raise ValueError("a goal on the ratio needs a row with a ratio")
        ok = x <= self.at_most if self.at_most is not None else x >= (self.at_least or 0.0)
        return "met" if ok else "missed"

    def text(self) -> str:
        unit = "×" if self.on == "ratio" else ""
        return f"≤ {self.at_most:g}{unit}" if self.at_most is not None \
            else f"≥ {self.at_least:g}{unit}"


class Row(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
          omit_defaults=True):
    """One figure of a run, against its floor or peer."""

    metric: str
    value: float
    unit: str
    versus: str | None = None
    """The floor or the peer, in words; measured in the same run."""
    versus_kind: Literal["floor", "peer"] | None = None
    versus_value: float | None = None
    ratio: float | None = None
    """``value / versus_value`` unless ``detail`` says how it was taken (a median of
    paired ratios, a rate against a rate)."""
    goal: Goal | None = None
    verdict: Verdict = "no goal"
    detail: str = ""

    def __post_init__(self) -> None:
        if not self.metric or not self.unit:
            raise ValueError("a row names its metric and unit")
        if not math.isfinite(self.value):
            raise ValueError(f"{self.metric}: value {self.value} is not a number")
        if (self.versus is None) != (self.versus_kind is None):
            raise ValueError(f"{self.metric}: versus and versus_kind go together")
        if self.versus is None and (self.ratio is not None or self.versus_value is not None):
            raise ValueError(f"{self.metric}: a ratio needs the floor or peer it is to")
        if self.ratio is not None and not math.isfinite(self.ratio):
            raise ValueError(f"{self.metric}: ratio {self.ratio} is not a number")
        want: Verdict = "no goal" if self.goal is None else self.goal.judge(self.value,
                                                                             self.ratio)
        if self.verdict != want:
            raise ValueError(f"{self.metric}: verdict {self.verdict!r}, the goal says {want!r}")


class Machine(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    cpu: str
    cores: int
    kernel: str
    python: str
    packages: dict[str, str]
    """Versions of what the run used: threadline, msgspec, SQLite, the PostgreSQL
    server, the peers."""

    def label(self) -> str:
        return f"{self.cpu}, {self.cores} cores"


class Result(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
             omit_defaults=True):
    name: str
    script: str
    date: str
    """When the run ended, ISO 8601 in UTC."""
    machine: Machine
    rows: list[Row]
    quick: bool = False
    """A smoke run (``--quick``): too few samples to quote."""
    commit: str | None = None
    origin: Literal["run", "converted"] = "run"
    """``converted``: carried over from a file of the old ad-hoc shapes, not re-run
    with this package's harness; ``date`` is then that file's commit date."""
    load: float | None = None
    """The 1-minute load average when the run started."""
    seconds: float | None = None

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError(f"{self.name}: a result has rows")
        datetime.fromisoformat(self.date)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Result)


def write(result: Result, directory: Path) -> Path:
    """Write ``result`` to ``directory/<name>.json``, checked by decoding it back."""
    data = msgspec.json.format(_encoder.encode(result), indent=2) + b"\n"
    _decoder.decode(data)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_bytes(data)
    return path


def read(path: Path) -> Result:
    """One result file; ``msgspec.ValidationError`` naming the file if it is not one."""
    try:
        return _decoder.decode(path.read_bytes())
    except msgspec.ValidationError as exc:
        raise msgspec.ValidationError(f"{path}: {exc}") from exc


def read_all(directory: Path) -> list[Result]:
    return [read(p) for p in sorted(directory.glob("*.json"))]


def machine(packages: dict[str, str]) -> Machine:
    """This machine's facts, with the versions of ``packages`` and of the usual ones."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str] = {}
    for dist in ("threadline", "msgspec", "psycopg", "psycopg-pool"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import sqlite3

    versions["sqlite"] = sqlite3.sqlite_version
    versions.update(packages)
    return Machine(cpu=cpu, cores=os.cpu_count() or 0, kernel=platform.release(),
                   python=platform.python_version(), packages=versions)


def commit() -> str | None:
    """The tree's commit, ``+`` when it has uncommitted changes; None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src",
                                "bench", ":(exclude)bench/results"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
