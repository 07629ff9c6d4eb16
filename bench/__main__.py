"""The benchmark runner: ``python -m bench [NAME ...] [--quick] [--list] [--docs]``."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType

from bench import BENCHMARKS
from bench._harness import Run, postgres_version
from bench._schema import Result, commit, machine, now, write

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
QUICK = Path(tempfile.gettempdir()) / "threadline-bench-quick"


def module(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


def summary(mod: ModuleType) -> str:
    return (mod.__doc__ or "").strip().split("\n", 1)[0]


def missing(mod: ModuleType, pg_url: str) -> list[str]:
    """What of the module's ``NEEDS`` this machine lacks, in words."""
    lacks = []
    for need in getattr(mod, "NEEDS", ()):
        if need == "postgres" and postgres_version(pg_url) is None:
            lacks.append(f"a PostgreSQL server at {pg_url} (THREADLINE_TEST_PG_URL)")
        elif need == "pgbouncer" and shutil.which("pgbouncer") is None:
            lacks.append("pgbouncer on the PATH")
        elif need.startswith("import:"):
            for name in need.removeprefix("import:").split(","):
                try:
                    importlib.import_module(name)
                except ImportError:
                    lacks.append(f"the {name} package (pip install -r "
                                 "bench/requirements-peers.txt)")
    return lacks


def run_one(name: str, *, quick: bool, results: Path, pg_url: str) -> str | None:
    """Run one benchmark and write its result; what went wrong, or None."""
    mod = module(name)
    lacks = missing(mod, pg_url)
    if lacks:
        return f"skipped, needs {', '.join(lacks)}"
    print(f"{name}: {summary(mod)}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"tl-bench-{name}-",
                                     dir=os.environ.get("BENCH_DIR")) as tmp:
        run = Run(name=name, quick=quick, tmp=Path(tmp), pg_url=pg_url)
        try:
            mod.main(run)
        except Exception:
            traceback.print_exc()
            return "failed (traceback above)"
    if "postgres" in getattr(mod, "NEEDS", ()):
        run.uses("postgresql", postgres_version(pg_url))
    result = Result(name=name, script=f"bench/{name}.py", date=now(),
                    machine=machine(run.packages), rows=run.rows, quick=quick,
                    commit=commit(), load=round(load, 2),
                    seconds=round(time.perf_counter() - started, 1))
    path = write(result, results)
    print(f"{name}: {len(run.rows)} rows in {result.seconds:.0f} s, wrote {path}",
          file=sys.stderr, flush=True)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--list", action="store_true", help="name every benchmark and stop")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: seconds per benchmark, figures not worth quoting")
    ap.add_argument("--results", type=Path, default=None,
                    help=f"where result files go (default {RESULTS.relative_to(ROOT)}; "
                    "with --quick, a folder in the system's temporary directory)")
    ap.add_argument("--docs", nargs="?", type=Path, const=DOCS, default=None,
                    metavar="PATH", help="write the results page from --results "
                    f"(default {DOCS.relative_to(ROOT)}), after any run")
    ap.add_argument("--pg-url", default=None, help="PostgreSQL server "
                    "(default THREADLINE_TEST_PG_URL or postgresql://postgres@127.0.0.1/test)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"no benchmark named {', '.join(unknown)}; --list names them")
    if args.list:
        for name in BENCHMARKS:
            mod = module(name)
            needs = ", ".join(getattr(mod, "NEEDS", ())) or "nothing"
            print(f"{name:10} ~{getattr(mod, 'MINUTES', '?')} min  {summary(mod)}  "
                  f"[needs: {needs}]")
        return 0
    from bench._harness import PG_URL

    pg_url = args.pg_url or PG_URL
    if args.results is None:  # a smoke run never replaces a real result
        args.results = QUICK if args.quick else RESULTS
    names = args.names or ([] if args.docs else list(BENCHMARKS))
    problems = {}
    for name in names:
        problem = run_one(name, quick=args.quick, results=args.results, pg_url=pg_url)
        if problem is not None:
            problems[name] = problem
            print(f"{name}: {problem}", file=sys.stderr, flush=True)
    if args.docs is not None:
        from bench._docs import render

        args.docs.write_text(render(args.results))
        print(f"wrote {args.docs}", file=sys.stderr)
    for name, problem in problems.items():
        print(f"  {name}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
