"""The public surface is stated once, in docs/api.md, and matches ``__all__``.

Every entry of the page starts with ``- `` and its names in backticks,
written relative to ``threadline`` (``durable.open(...)`` is
``threadline.durable.open``; ``threadline.X`` is the root package), up to the
first ``: ``. Sub-bullets and prose are not entries.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import threadline

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def documented() -> dict[str, set[str]]:
    sections: dict[str, set[str]] = {}
    for line in API_DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("- `"):
            continue
        head = line.split("`: ", 1)[0]
        for qualified in re.findall(r"`([\w.]+)", head):
            owner, _, name = qualified.rpartition(".")
            module = "threadline" if owner == "threadline" else f"threadline.{owner}"
            sections.setdefault(module, set()).add(name)
    return sections


def public_packages() -> set[str]:
    """Every package of threadline whose name has no leading underscore."""
    found = {"threadline"}
    for info in pkgutil.walk_packages(threadline.__path__, "threadline."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    return found


DOCUMENTED = documented()


def test_every_public_module_is_documented() -> None:
    # cli is a command, not an import surface; its only name is ``main``.
    # integrations only holds one package per framework, each documented.
    assert set(DOCUMENTED) == public_packages() - {"threadline.cli", "threadline.integrations"}


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_all_is_exactly_the_documented_api(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == DOCUMENTED[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None or name == "__version__"


def test_the_page_reads_as_a_reference() -> None:
    # One line per entry, saying what it is; no bare name lists.
    for line in API_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("- `"):
            assert "`: " in line and not line.rstrip().endswith(":"), line
