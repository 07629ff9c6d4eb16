"""Imports point one way (DESIGN.md, Layers): checked on the source with ``ast``.

``ai`` <- ``agent`` <- ``durable`` and ``ai`` <- ``session`` <- ``stores`` <-
``durable``; ``testing`` sits on ``stores`` and ``agent``; ``privacy``,
``integrations``, ``web``, ``viewer`` and ``cli`` are on top (``cli`` may use
the others); ``errors``
is the root everyone may use. Imports under ``TYPE_CHECKING`` count too: an
upward type reference is still an upward dependency.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
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
    "stores": frozenset({"session", "ai", "errors"}),
    "durable": frozenset({"agent", "stores", "session", "ai", "errors"}),
    "testing": frozenset({"agent", "stores", "session", "ai", "errors"}),
    "privacy": frozenset({"stores", "session", "ai", "errors"}),
    "viewer": frozenset({"durable", "stores", "agent", "session", "ai", "errors"}),
    "integrations": frozenset({"durable", "privacy", "stores", "agent", "session", "ai",
                               "errors"}),
    "web": frozenset({"durable", "privacy", "stores", "agent", "session", "ai", "errors"}),
    "cli": frozenset({"durable", "privacy", "stores", "testing", "viewer", "web",
                      "integrations", "agent", "session", "ai", "errors"}),
}


def _part(module: str) -> str:
    """``threadline.stores.file._store`` -> ``stores``; ``threadline`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool,
                     modules: Collection[str] = ()) -> set[str]:
    """Every ``threadline`` module ``source`` (the text of ``module``) imports;
    ``from package import name`` counts as ``package.name`` where that is one
    of ``modules``."""
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
            for alias in node.names:
                # ``from threadline import durable, ThreadlineError``
                part = target == "threadline" and alias.name in ALLOWED
                name = f"{target}.{alias.name}"
                found.add(name if part or name in modules else target)
    return {m for m in found if m == "threadline" or m.startswith("threadline.")}


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports; ``sources`` maps each
    module to its text and whether it is a package."""
    return {module: imported_modules(source, module, is_package=is_package,
                                     modules=sources.keys()) & sources.keys()
            for module, (source, is_package) in sources.items()}


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` back to itself, if there is one."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target == start:
                    chain = [module]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [*reversed(chain), start]
                if target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    return None


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each circle of imports in ``graph`` once, as ``a -> b -> a``."""
    cycles: dict[frozenset[str], str] = {}
    for module in sorted(graph):
        if (chain := _cycle_through(graph, module)) is not None:
            cycles.setdefault(frozenset(chain), " -> ".join(chain))
    return list(cycles.values())


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
    assert parts <= set(ALLOWED)
    assert set(ALLOWED) - parts <= {"privacy", "web"}  # layers not built yet


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


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Within a part too, imports point one way; one under ``TYPE_CHECKING``
    or inside a function still closes a circle."""
    sources = {_module_name(path): (path.read_text(encoding="utf-8"), path.name == "__init__.py")
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert import_cycles(import_graph(sources)) == []


def test_the_cycle_check_follows_submodules_relative_and_type_only_imports() -> None:
    sources = {
        "threadline.cli": ("from threadline.cli._app import main", True),
        "threadline.cli._app": ("from threadline.cli import _read\nfrom . import _verb", False),
        "threadline.cli._read": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from ._app import Ctx", False),
        "threadline.cli._verb": ("import threadline.cli._output", False),
        "threadline.cli._output": ("def late():\n    from threadline.cli._verb import Verb", False),
    }
    assert import_cycles(import_graph(sources)) == [
        "threadline.cli._app -> threadline.cli._read -> threadline.cli._app",
        "threadline.cli._output -> threadline.cli._verb -> threadline.cli._output",
    ]
    sources["threadline.cli._read"] = ("from threadline.cli import _verb", False)
    sources["threadline.cli._output"] = ("import threadline.errors", False)
    assert import_cycles(import_graph(sources)) == []


TESTS = Path(__file__).resolve().parent
# In code or in a child process's code string: a line that imports a test module.
_TEST_IMPORT = re.compile(r"^\s*(?:from\s+test_\w*\s+import|import\s+test_\w*)", re.M)


def test_no_test_module_imports_another() -> None:
    """What tests share lives in ``tests/support/``; a test module is only ever run."""
    found = [f"{path.relative_to(TESTS)}:{text.count(chr(10), 0, m.start()) + 1}"
             for path in sorted([*TESTS.glob("*.py"), *(TESTS / "support").glob("*.py")])
             for text in [path.read_text(encoding="utf-8")]
             for m in _TEST_IMPORT.finditer(text)]
    assert found == []
    assert _TEST_IMPORT.search('CHILD = """\nfrom test_viewer import page\n"""')
    assert not _TEST_IMPORT.search("from support.viewer import page  # test_viewer's")
