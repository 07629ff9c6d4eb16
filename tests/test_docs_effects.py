"""The example in docs/tools-with-side-effects.md runs as written and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "tools-with-side-effects.md"


def test_s23_side_effects_doc_example_runs(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    example = text.split("<!-- example: tests/test_docs_effects.py runs this block -->", 1)[1]
    code = re.search(r"```python\n(.*?)```", example, re.S)
    printed = re.search(r"It prints:\n\n```text\n(.*?)```", example, re.S)
    assert code is not None and printed is not None
    script = tmp_path / "refunds.py"
    script.write_text(code.group(1), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed.group(1)
