"""The benchmark runner as its users call it: a smoke run writes results the docs render.

Runs ``python -m bench --quick`` on a few cheap benchmarks into a temporary
folder, then checks every file against the results schema and renders the
page from them. No figure is judged here: speed is proven in bench/ runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a package at the top of the tree, not installed
    sys.path.insert(0, str(ROOT))

from bench._docs import render  # noqa: E402
from bench._schema import Goal, Result, Row, read  # noqa: E402

CHEAP = ("loop", "importers", "disk", "wire")


def _bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def test_quick_run_writes_results_that_validate_and_render(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _bench("--quick", "--results", str(out), "--docs", str(tmp_path / "page.md"),
                  *CHEAP)
    assert done.returncode == 0, done.stderr
    files = sorted(p.stem for p in out.glob("*.json"))
    assert files == sorted(CHEAP)
    for name in CHEAP:
        result = read(out / f"{name}.json")
        assert result.name == name and result.script == f"bench/{name}.py"
        assert result.quick and result.origin == "run" and result.machine.cores >= 1
        assert "threadline" in result.machine.packages
        assert all(row.versus is not None for row in result.rows), name
    page = (tmp_path / "page.md").read_text()
    assert page == render(out)
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`bench/" in line]
    assert len(rows) == sum(len(read(out / f"{n}.json").rows) for n in CHEAP)
    assert all(", quick |" in line for line in rows)
    assert len(page.splitlines()) <= 300


def test_list_names_every_benchmark() -> None:
    done = _bench("--list")
    assert done.returncode == 0, done.stderr
    from bench import BENCHMARKS

    assert [line.split()[0] for line in done.stdout.splitlines()] == list(BENCHMARKS)


def test_unknown_benchmark_is_refused() -> None:
    done = _bench("--quick", "nosuch")
    assert done.returncode == 2 and "no benchmark named nosuch" in done.stderr


def test_schema_refuses_a_verdict_its_goal_contradicts(tmp_path: Path) -> None:
    row = Row(metric="m", value=2.0, unit="ms", versus="floor", versus_kind="floor",
              versus_value=1.0, ratio=2.0, goal=Goal(at_most=1.5), verdict="missed")
    data = json.loads(msgspec.json.encode(Result(
        name="x", script="bench/x.py", date="2026-01-01T00:00:00+00:00",
        machine={"cpu": "c", "cores": 1, "kernel": "k", "python": "3", "packages": {}},
        rows=[row])))
    data["rows"][0]["verdict"] = "met"
    path = tmp_path / "x.json"
    path.write_text(json.dumps(data))
    with pytest.raises(msgspec.ValidationError, match=r"x\.json.*the goal says 'missed'"):
        read(path)
    data["rows"][0]["verdict"] = "missed"
    data["rows"][0]["speed"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(msgspec.ValidationError, match="speed"):
        read(path)


def test_committed_results_validate_and_the_page_is_current() -> None:
    results = ROOT / "bench" / "results"
    for path in results.glob("*.json"):
        read(path)
    assert (ROOT / "docs" / "benchmarks.md").read_text() == render(results)
