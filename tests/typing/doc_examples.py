"""The Python examples of README.md and docs/*.md, as files mypy can check.

Read from the markdown each time, so a checked example is always the one a
reader sees. A block that awaits at its top level (docs show those lines as
if inside a coroutine) is wrapped in an ``async def`` first.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_TOP_LEVEL_AWAIT = re.compile(r"^(?:async (?:for|with) |(?:\w+ = )?await )", re.M)


def examples() -> dict[str, str]:
    """``{name: code}``, named after the file and the block's position in it."""
    found: dict[str, str] = {}
    for source in SOURCES:
        for n, match in enumerate(_BLOCK.finditer(source.read_text(encoding="utf-8")), 1):
            code = match.group(1)
            if _TOP_LEVEL_AWAIT.search(code):
                code = _wrap(code)
            found[f"{source.stem.replace('-', '_')}_{n}"] = code
    return found


def _wrap(code: str) -> str:
    imports = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
    body = [line for line in code.splitlines() if line not in imports]
    indented = "\n".join(f"    {line}" if line else "" for line in body)
    return "\n".join([*imports, "", "", "async def example() -> None:", indented, ""])
