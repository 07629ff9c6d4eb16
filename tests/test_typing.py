"""The generic parts of the API type-check as documented (mypy --strict on tests/typing/)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parent.parent
CHECKS = Path(__file__).resolve().parent / "typing"


def run_mypy(*paths: Path) -> tuple[str, int]:
    stdout, stderr, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"),
        # The cache .ci/run's mypy of the same environment has just filled
        # (checking the library and its dependencies from nothing took 111 s
        # of the suite); one per environment, as CI runs two mypys at once.
        "--cache-dir", str(ROOT / ".mypy_cache" / ("lowest" if Path(sys.prefix).name
                                                   == ".venv-lowest" else "")),
        "--no-error-summary", "--hide-error-context",
        *map(str, paths),
    ])
    return stdout + stderr, status


def test_s9_custom_entry_types_check_strict() -> None:
    output, status = run_mypy(CHECKS / "check_custom_types.py")
    assert status == 0, output


def test_event_type_narrows_every_event_union() -> None:
    output, status = run_mypy(CHECKS / "check_events.py")
    assert status == 0, output


def test_typing_check_detects_a_wrong_claim(tmp_path: Path) -> None:
    # The same machinery must fail on a false claim, or the test above proves nothing.
    bad = tmp_path / "bad_claim.py"
    bad.write_text(
        "from typing import assert_type\n"
        "import msgspec\n"
        "from threadline.session._entries import CustomEntry\n"
        "from threadline.session._codec import decode_entry\n"
        "class Todo(msgspec.Struct):\n"
        "    title: str\n"
        "e = CustomEntry(kind='todo', data=Todo(title='x'))\n"
        "assert_type(e.data, str)\n"
        "assert_type(decode_entry(b''), CustomEntry[Todo])\n"
    )
    output, status = run_mypy(bad)
    assert status == 1
    assert output.count("assert-type") == 2, output


def test_readme_and_docs_examples_check_strict(tmp_path: Path) -> None:
    # README.md's headline example narrows on ``event.type == "message_end"`` and
    # reads ``event.entries``: that only type-checks if the run's event union
    # has exactly one member with that tag.
    found: dict[str, str] = runpy.run_path(str(CHECKS / "doc_examples.py"))["examples"]()
    assert {"README_1", "subprocess_protocol_1", "subprocess_protocol_2"} <= set(found)
    paths = []
    for name, code in found.items():
        path = tmp_path / f"{name}.py"
        path.write_text(code, encoding="utf-8")
        paths.append(path)
    output, status = run_mypy(*paths)
    assert status == 0, output
