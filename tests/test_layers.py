"""Imports point one way (DESIGN.md, Layers): checked on the source with ``ast``.

``ai`` <- ``agent`` <- ``durable`` and ``ai`` <- ``session`` <- ``durable``;
``stores`` and ``testing`` sit on ``session``; ``viewer`` and ``cli`` are on
top (``cli`` may use ``viewer``); ``errors``
is the root everyone may use. Imports under ``TYPE_CHECKING`` count too: an
upward type reference is still an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import threadline

PACKAGE = Path(threadline.__file__).parent

# Top-level part of threadline -> the other parts it may import from.
ALLOWED: dict[str, frozenset[str]] = {
    "__init__": frozenset({"errors"}),
    "errors": frozenset(),
    "ai": frozenset({"errors"}),
    "agent": frozenset({"ai", "errors"}),
    "session": frozenset({"ai", "errors"}),
    "durable": frozenset({"agent", "session", "ai", "errors"}),
    "stores": frozenset({"session", "errors"}),
    "testing": frozenset({"agent", "session", "ai", "errors"}),
    "viewer": frozenset({"durable", "stores", "agent", "session", "ai", "errors"}),
    "cli": frozenset({"durable", "stores", "testing", "viewer", "agent", "session", "ai",
                      "errors"}),
    "integrations": frozenset({"durable", "stores", "agent", "session", "ai", "errors"}),
}


def _part(module: str) -> str:
    """``threadline.session._file`` -> ``session``; ``threadline`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool) -> set[str]:
    """Every ``threadline`` module ``source`` (the text of ``module``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # A relative import counts from the package the module is in.
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "threadline":  # ``from threadline import durable, ThreadlineError``
                found.update(f"threadline.{alias.name}" if alias.name in ALLOWED
                             else "threadline" for alias in node.names)
            else:
                found.add(target)
    return {m for m in found if m == "threadline" or m.startswith("threadline.")}


def upward_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    own = _part(module)
    allowed = ALLOWED[own] | {own, "__init__"}
    return sorted(
        f"{module} imports {target}"
        for target in imported_modules(source, module, is_package=is_package)
        if _part(target) not in allowed
    )


def test_every_part_of_the_package_has_a_place_in_the_layers() -> None:
    parts = {_part(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert parts == set(ALLOWED)


def test_no_module_imports_upward() -> None:
    problems: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        problems += upward_imports(path.read_text(encoding="utf-8"), _module_name(path),
                                   is_package=path.name == "__init__.py")
    assert problems == []


def test_the_check_catches_upward_imports_of_every_form() -> None:
    sources = [
        "from threadline.durable import open",
        "import threadline.cli",
        "from threadline import durable",
        "from ..durable import agent",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from threadline import durable",
        "def late():\n    from threadline.durable._agent import DurableAgent",
    ]
    for source in sources:
        assert upward_imports(source, "threadline.session._tree"), source
    assert upward_imports("from threadline.session import tree", "threadline.agent._loop")
    assert not upward_imports("from threadline.ai import messages", "threadline.session._tree")
    assert not upward_imports("from . import tree", "threadline.session._context")
    assert not upward_imports("from threadline import ThreadlineError", "threadline.ai._model")
    assert not upward_imports("from .file import FileStore", "threadline.session",
                              is_package=True)
