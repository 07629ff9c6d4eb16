"""``threadline search`` as a child process (S64): scoping, JSON, hostile text escaped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support.cli import tl, tl_pty
from threadline.ai._messages import TextPart, UserMessage
from threadline.session._entries import CustomEntry, MessageEntry, SessionRecord
from threadline.session._metadata import METADATA_KIND, metadata_change
from threadline.stores import open_store
from threadline.stores._search import marked

HOSTILE = "whale [bold]x[/] \x1b[2J\x1b]0;pwned\x07 \u202etxt.exe <img src=x onerror=alert(1)>"


def _fill(url: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        store = open_store(url, create=True)
        ids = {}
        for sid, owner, text in (("ann-1", "ann", HOSTILE), ("bob-1", "bob", "whale of bob"),
                                 ("sess\u202eion", "ann", "krill only")):
            await store.create_session(SessionRecord(id=sid))
            meta = CustomEntry(kind=METADATA_KIND, data=metadata_change(owner=owner))
            entry = MessageEntry(parent_id=meta.id,
                                 message=UserMessage(content=(TextPart(text=text),)))
            await store.append_entries(sid, [meta, entry])
            ids[sid] = entry.id
        await store.close()
        return ids

    return asyncio.run(run())


def test_s64_cli_search_scopes_and_prints_json(tmp_path: Path) -> None:
    for url in (str(tmp_path / "files"), f"sqlite:///{tmp_path}/s.db"):
        ids = _fill(url)
        out = tl("--store", url, "search", "WHALE", "--json").stdout
        hits = [json.loads(line) for line in out.splitlines()]
        assert {h["session_id"] for h in hits} == {"ann-1", "bob-1"}
        assert set(hits[0]) == {"session_id", "entry_id", "snippet", "rank"}
        only = [json.loads(line) for line in
                tl("--store", url, "search", "whale", "--owner", "ann", "--json")
                .stdout.splitlines()]
        assert [(h["session_id"], h["entry_id"]) for h in only] == [("ann-1", ids["ann-1"])]
        # The JSON line holds no raw escape or bidi character; the text decodes the same.
        assert "\x1b" not in out and "\u202e" not in out
        assert only[0]["snippet"].startswith("whale [bold]x[/] \x1b[2J")
        none = tl("--store", url, "search", "absent", check=False)
        assert none.returncode == 1 and "no entry holds" in none.stderr


def test_s64_cli_search_escapes_hostile_text_on_a_terminal(tmp_path: Path) -> None:
    url = str(tmp_path / "files")
    _fill(url)
    plain = tl("--store", url, "search", "whale", "--owner", "ann").stdout
    assert "\x1b" not in plain and "\u202e" not in plain and "\x07" not in plain
    assert "\\x1b[2J" in plain and "\\u202e" in plain and "[bold]x[/]" in plain
    status, raw = tl_pty("--store", url, "search", "krill")
    text = raw.decode()
    assert status == 0 and "sess\\u202eion" in text and "\u202e" not in text
    status, raw = tl_pty("--store", url, "search", "whale", "--owner", "ann")
    text = raw.decode()
    # Our colours are the only escapes: the stored ones arrive escaped.
    assert "\x1b[2J" not in text and "\x1b]0;" not in text and "\\x1b]0;pwned" in text


def test_s64_cli_search_usage_errors(tmp_path: Path) -> None:
    url = str(tmp_path / "files")
    _fill(url)
    for args in (["search"], ["search", "x", "--limit", "0"]):
        assert tl("--store", url, *args, check=False).returncode == 2
    bad = tl("--store", url, "search", '"*()', check=False)
    assert bad.returncode != 0 and "at least one word" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_marked_pieces() -> None:
    assert marked("A Whale, whales and WHALE", ["whale"]) == [
        ("A ", False), ("Whale", True), (", whales and ", False), ("WHALE", True)]
    assert marked("nothing here", ["whale"]) == [("nothing here", False)]
