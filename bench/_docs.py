"""docs/benchmarks.md, written from the result files: one table, current results only."""

from __future__ import annotations

import importlib
from pathlib import Path

from bench import BENCHMARKS
from bench._schema import Machine, Result, Row, read_all

INTRO = """\
# Benchmarks

Every figure here comes from a script in `bench/` that anyone can rerun, and
each is set against a floor (the same work done bare: a `write` + `fdatasync`
of the same bytes, a bare `INSERT` on the same server, the agent loop with
nothing stored) or a peer (another library doing the same job), measured in
the same run on the same machine. Read the ratios: the milliseconds move with
the machine, the ratios much less. This page is generated from
`bench/results/*.json` by `python -m bench --docs`; do not edit it by hand.
"""

HOWTO = """\
## Running them

```bash
python -m bench --list                 # every benchmark, and what it needs
python -m bench append durable         # run some; writes bench/results/<name>.json
python -m bench                        # run all of them (about {minutes} minutes)
python -m bench --docs                 # rewrite this page from bench/results/
python -m bench --quick append         # a smoke run of the script (seconds; not a result)
```

Run them on a quiet machine: each benchmark alternates its variants sample by
sample, each first in turn, so load hits them alike, but a busy disk or CPU
still widens the spread. The PostgreSQL rows need a server at
`THREADLINE_TEST_PG_URL` (default `postgresql://postgres@127.0.0.1:5432/test`);
`fleet` and `prepared` also need `pgbouncer` (1.21 or later for `prepared`).
The peers live in their own environment, never in threadline's dependencies:

```bash
python3 -m venv bench/.venv
bench/.venv/bin/pip install -e '.[postgres]' -r bench/requirements-peers.txt
bench/.venv/bin/python -m bench peers
```

A `--quick` run writes to a temporary folder unless given `--results`, so it
never replaces a result here. Each result file records its date, the machine
(CPU model, cores, kernel, Python, package versions), the commit and the load
average at the start.
"""


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _value(x: float, unit: str) -> str:
    return f"{_num(x)} {unit}" if unit != "×" else f"{_num(x)}×"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(row: Row, result: Result, machine: str) -> str:
    against = "" if row.versus is None else row.versus
    if row.versus_kind == "peer":
        against = f"peer: {against}"
    if row.versus_value is not None:
        against += f" ({_value(row.versus_value, row.unit)})"
    if row.detail:
        against += f"; {row.detail}"
    ratio = "" if row.ratio is None else f"{_num(row.ratio)}×"
    goal = "" if row.goal is None else f"{row.goal.text()} {row.verdict}"
    when = f"{result.date[:10]}, {machine}"
    if result.origin == "converted":
        when += ", not re-run"
    if result.quick:
        when += ", quick"
    return (f"| {_cell(row.metric)} | {_value(row.value, row.unit)} | {_cell(against)} "
            f"| {ratio} | {goal} | `{result.script}` | {when} |")


def _machine_line(tag: str, m: Machine, results: list[Result]) -> str:
    facts = [f"{m.cpu}, {m.cores} cores, Linux {m.kernel}, Python {m.python}"]
    facts += [", ".join(f"{k} {v}" for k, v in sorted(m.packages.items()))]
    commits = sorted({r.commit for r in results if r.commit})
    facts += [f"commit {', '.join(commits)}" if commits else ""]
    return f"- **{tag}**: " + "; ".join(f for f in facts if f)


def render(results_dir: Path) -> str:
    """The whole page for the result files in ``results_dir``."""
    results = {r.name: r for r in read_all(results_dir)}
    order = [n for n in BENCHMARKS if n in results]
    order += sorted(n for n in results if n not in BENCHMARKS)
    # One tag per distinct machine (its facts without the package versions).
    tags: dict[tuple[str, int, str, str], str] = {}
    for name in order:
        m = results[name].machine
        tags.setdefault((m.cpu, m.cores, m.kernel, m.python), f"M{len(tags) + 1}")
    out = [INTRO, "## Results", "",
           "| what | result | against (same run) | ratio | goal | script | run |",
           "|---|---:|---|---:|---|---|---|"]
    for name in order:
        r = results[name]
        tag = tags[(r.machine.cpu, r.machine.cores, r.machine.kernel, r.machine.python)]
        out += [_row(row, r, tag) for row in r.rows]
    out += ["", "A ratio is the result over the floor or peer unless the row says how it "
            "was taken; for rates (per second) higher is better, for times lower.", ""]
    missed = [(results[n], row) for n in order for row in results[n].rows
              if row.verdict == "missed"]
    if missed:
        out += [f"{len(missed)} row(s) miss their goal: "
                + "; ".join(f"{row.metric} ({_num(row.value if row.ratio is None else row.ratio)}"
                            f"{'' if row.ratio is None else '×'}, goal "
                            f"{row.goal.text() if row.goal else ''})" for _, row in missed)
                + ".", ""]
    absent = [n for n in BENCHMARKS if n not in results]
    stale = [n for n in order if results[n].origin == "converted"]
    if absent or stale:
        out.append("Not yet run with the current harness: "
                   + ", ".join(f"`{n}`" for n in [*stale, *absent])
                   + (" (rows marked *not re-run* were carried over from the scripts they"
                      " replace, with the floors those scripts used)" if stale else "")
                   + ".")
        out.append("")
    out += ["Machines:", ""]
    for (cpu, cores, kernel, python), tag in tags.items():
        mine = [results[n] for n in order
                if (results[n].machine.cpu, results[n].machine.cores, results[n].machine.kernel,
                    results[n].machine.python) == (cpu, cores, kernel, python)]
        out.append(_machine_line(tag, mine[-1].machine, mine))
    minutes = sum(getattr(importlib.import_module(f"bench.{n}"), "MINUTES", 0)
                  for n in BENCHMARKS)
    out += ["", HOWTO.format(minutes=round(minutes))]
    return "\n".join(out).rstrip() + "\n"
