"""The public surface is stated once, in docs/api.md, and matches ``__all__``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def documented() -> dict[str, set[str]]:
    sections: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in API_DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"### `([\w.]+)`", line)
        if heading:
            current = sections.setdefault(heading.group(1), set())
            continue
        if current is None:
            continue
        if line.startswith("- `"):  # "- `Name`, `Other`: what they are"
            names = line.split(": ", 1)[0]
        elif line.startswith("- "):  # "- Group: `Name`, `Other`"
            names = line.split(": ", 1)[-1]
        elif line.startswith("  "):  # continuation of a list item
            names = line
        else:
            continue
        current.update(re.findall(r"`(\w+)`", names))
    return sections


DOCUMENTED = documented()


def test_every_public_module_is_documented() -> None:
    assert set(DOCUMENTED) == {
        "threadline", "threadline.errors", "threadline.ai", "threadline.agent",
        "threadline.session", "threadline.stores", "threadline.durable", "threadline.testing",
        "threadline.viewer",
    }


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_all_is_exactly_the_documented_api(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == DOCUMENTED[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None or name == "__version__"
