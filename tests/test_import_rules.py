"""Importing as a new user does it (S30): a missing required field is an error,
the format is told from the file when ``--format`` is not given, a file of
another format is refused, and one bad file among many is named while the
others are imported, with a report of what was and was not written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents.memory import SQLiteSession

from support.cli import tl
from threadline.errors import CorruptLog
from threadline.integrations.importers import import_claude_code, import_pi

FIXTURES = Path(__file__).parent / "fixtures" / "import"
CLAUDE_REAL = FIXTURES / "claude_code_real_2.1.332.jsonl"
PI_REAL = FIXTURES / "pi_real_0.73.1.jsonl"
PI = FIXTURES / "pi_v3_branching.jsonl"


def _without_uuid(tmp_path: Path, role: str) -> tuple[Path, int]:
    lines = CLAUDE_REAL.read_bytes().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if json.loads(line).get("type") == role)
    obj = json.loads(lines[n])
    del obj["uuid"]
    lines[n] = json.dumps(obj).encode() + b"\n"
    path = tmp_path / "transcript.jsonl"
    path.write_bytes(b"".join(lines))
    return path, n + 1


@pytest.mark.parametrize("role", ["assistant", "user"])
def test_s30_a_claude_code_message_line_without_uuid_is_an_error(
    tmp_path: Path, role: str
) -> None:
    path, lineno = _without_uuid(tmp_path, role)
    with pytest.raises(CorruptLog) as caught:
        import_claude_code(path.read_bytes(), str(path))
    assert caught.value.line == lineno and "uuid" in str(caught.value)
    store = tmp_path / "store"
    proc = tl("--store", str(store), "import", "--format", "claude-code", str(path), check=False)
    assert proc.returncode == 1 and f"{path} line {lineno}" in proc.stderr
    assert not list(store.glob("*.jsonl")) if store.exists() else True


def _agents_db(tmp_path: Path) -> Path:
    import asyncio

    path = tmp_path / "agents.db"

    async def write() -> None:
        session = SQLiteSession("sdk-1", path)
        await session.add_items([{"role": "user", "content": "hi"}])
        session.close()

    asyncio.run(write())
    return path


def test_s30_the_format_is_told_from_the_file(tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "store")]
    src = ["--store", str(tmp_path / "src")]
    tl(*src, "import", "--format", "pi", str(PI))
    exported = tmp_path / "exported.jsonl"
    exported.write_text(tl(*src, "export", import_pi(PI.read_bytes(), str(PI))[0].record.id).stdout)
    files = [PI_REAL, CLAUDE_REAL, _agents_db(tmp_path), exported]
    out = tl(*store, "import", *map(str, files), "--json").stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["format"] for r in rows] == ["pi", "claude-code", "openai-agents-sqlite",
                                          "threadline"]
    assert all(r["status"] in ("copied", "skipped") for r in rows), rows
    # The same sessions as with the format named.
    named = tl("--store", str(tmp_path / "named"), "import", "--format", "pi", str(PI_REAL),
               "--json").stdout
    assert json.loads(named)["entries"] == rows[0]["entries"]
    unknown = tmp_path / "notes.txt"
    unknown.write_text("shopping list\n")
    proc = tl(*store, "import", str(unknown), check=False)
    assert proc.returncode == 1 and str(unknown) in proc.stderr and "--format" in proc.stderr


@pytest.mark.parametrize(("named", "path"), [("claude-code", PI_REAL), ("pi", CLAUDE_REAL),
                                             ("threadline", PI_REAL),
                                             ("claude-code", FIXTURES / "README.md")])
def test_s30_a_file_of_another_format_is_refused(tmp_path: Path, named: str, path: Path) -> None:
    store = tmp_path / "store"
    proc = tl("--store", str(store), "import", "--format", named, str(path), check=False)
    assert proc.returncode == 1, proc.stdout
    assert str(path) in proc.stderr
    assert not store.exists() or not list(store.glob("*.jsonl"))
    if named == "claude-code":
        with pytest.raises(CorruptLog):
            import_claude_code(path.read_bytes(), str(path))


def test_s30_one_bad_file_is_named_and_the_others_are_imported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = PI.read_bytes().splitlines(keepends=True)
    bad.write_bytes(lines[0].replace(b'"id":"', b'"id":"bad-') + lines[1]
                    + b"this is not json\n")
    store = ["--store", str(tmp_path / "store")]
    proc = tl(*store, "import", "--format", "pi", str(PI), str(bad), str(PI_REAL), check=False)
    assert proc.returncode == 1
    good = [import_pi(p.read_bytes(), str(p))[0].record.id for p in (PI, PI_REAL)]
    for sid in good:
        assert f"imported: {sid}" in proc.stdout
    assert f"{bad} line 3" in proc.stderr
    assert "not imported" in proc.stderr and "2 of 3 files" in proc.stderr
    listed = tl(*store, "list", "--json").stdout
    assert sorted(json.loads(line)["id"] for line in listed.splitlines()) == sorted(good)
    as_json = tl(*store, "import", "--format", "pi", str(bad), str(PI), "--json", check=False)
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert {r["file"]: r["status"] for r in rows} == {str(bad): "failed", str(PI): "skipped"}
    failed = next(r for r in rows if r["status"] == "failed")
    assert "line 3" in failed["error"]
