"""What the docs tell a new user is what the code does.

Every verb the command has is in the command lists of the README and
docs/cli.md; every store-URL parameter ``open_store`` accepts is on the page
that lists them; no example points a SQLite store at the filesystem root;
``show --json`` is described as what it prints; every contract number a test
is named after is written down once, as a promise or as a store's design note.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from support.cli import tl
from threadline.ai import UserMessage
from threadline.cli._app import _verbs
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _command_list(page: Path) -> str:
    """The fenced block of ``threadline VERB ...`` lines on ``page``."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r"```\n(threadline .*?)```", text, flags=re.S)
    assert blocks, f"{page.name} has no command list"
    return blocks[0]


def test_every_verb_is_in_the_readme_and_cli_command_lists() -> None:
    verbs = [v.name for v in _verbs()]
    for page in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        listed = set(re.findall(r"^threadline (\S+)", _command_list(page), flags=re.M))
        assert set(verbs) <= listed, (page.name, sorted(set(verbs) - listed))
        assert "--format" in _command_list(page) and "html" in _command_list(page)


def test_every_store_url_parameter_is_on_the_store_url_page() -> None:
    source = (ROOT / "src" / "threadline" / "stores" / "_url.py").read_text()
    accepted = set(re.findall(r'params\.pop\("(\w+)"', source))
    accepted |= set(re.findall(r'\("(\w+)", (?:int|float)\)', source))
    assert {"schema", "durability", "synchronous", "busy_timeout", "connect_timeout"} <= accepted
    page = (ROOT / "docs" / "store-urls.md").read_text(encoding="utf-8")
    for name in sorted(accepted):
        assert f"`{name}=" in page or f"`?{name}=" in page, name
    for page_path in (ROOT / "README.md", ROOT / "docs" / "cli.md",
                      ROOT / "docs" / "integrations.md"):
        assert "store-urls.md" in page_path.read_text(encoding="utf-8"), page_path.name


def test_no_example_puts_a_sqlite_store_in_the_filesystem_root() -> None:
    for page in DOCS:
        for line in page.read_text(encoding="utf-8").splitlines():
            if "root of the filesystem" in line:
                continue  # the warning about it
            for found in re.findall(r"sqlite:///([^\s`'\")]+)", line):
                # sqlite:///x.db is /x.db: a file in / that a user did not mean.
                assert "/" in found, (page.name, f"sqlite:///{found}")


def test_show_json_is_described_as_what_it_prints(tmp_path: Path) -> None:
    async def write() -> None:
        store = FileStore(tmp_path)
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", [MessageEntry(message=UserMessage.of("hi"))])
        await store.close()

    asyncio.run(write())
    stored = (tmp_path / "s.jsonl").read_bytes().splitlines()[1]
    printed = tl("--store", str(tmp_path), "show", "s", "--json").stdout.splitlines()[0]
    assert json.loads(printed)["type"] == "message"  # one JSON object per entry
    assert stored.startswith(b"[") and printed.encode() != stored  # not the stored bytes
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "exactly as the store encodes them" not in text
    assert re.search(r"`show --json` prints .*one JSON object", text, flags=re.S)


def test_every_contract_number_a_test_is_named_after_is_written_down() -> None:
    named = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        named |= set(re.findall(r"def test_s(\d+)_", path.read_text(encoding="utf-8")))
    conformance = ROOT / "src" / "threadline" / "testing" / "_conformance"
    for path in conformance.glob("*.py"):
        named |= set(re.findall(r"def test_s(\d+)_", path.read_text(encoding="utf-8")))
    written = set()
    for page in ("design.md", "internals.md"):
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        written |= set(re.findall(r"^\| S(\d+) \|", text, flags=re.M))
    assert sorted(named - written, key=int) == []
    # Each number is either a promise or a note about how one store keeps one, never both.
    design = set(re.findall(r"^\| S(\d+) \|", (ROOT / "docs" / "design.md").read_text("utf-8"),
                            flags=re.M))
    internals = set(re.findall(r"^\| S(\d+) \|",
                               (ROOT / "docs" / "internals.md").read_text("utf-8"), flags=re.M))
    assert design & internals == set()
