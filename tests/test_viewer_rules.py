"""S29 where a new user broke it: ids with control characters, characters that
reorder or hide text, long sessions, and the custom entries importers leave.

Over HTTP against a real ``threadline serve`` child process, on the export the
command writes, and in a real browser (Debian's chromium through Playwright),
with the detector of ``test_viewer.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from support.cli import tl
from support.viewer import (
    Page,
    append_from_child,
    assert_nothing_ran,
    browser,
    http_get,
    in_thread,
    page,
    start_server,
    stop,
)
from threadline.ai import UserMessage
from threadline.session import CustomEntry, Entry, MessageEntry, SessionRecord
from threadline.stores import FileStore
from threadline.viewer import render_html
from threadline.viewer._html import PAGE_ENTRIES

__all__ = ["browser", "page"]  # the fixtures, imported for these tests

CONTROL_ID = "ticket\t42\x1b[2J\rx"
SPOOF_ID = "user\u202etxt.exe"
HIDING = ["\u202e", "\u2066", "\u200b", "\u200d", "\u00ad", "\U000e0041", "\U000e0001",
          "\ufeff", "\u2028"]
LONG = "long"
LONG_SIZE = 2 * PAGE_ENTRIES + 37


async def _build(root: Path) -> None:
    store = FileStore(root)

    async def session(sid: str, entries: list[Entry]) -> None:
        await store.create_session(SessionRecord(id=sid))
        await store.append_entries(sid, entries)

    first = MessageEntry(message=UserMessage.of("hello"))
    await session(CONTROL_ID, [first])
    await session(SPOOF_ID, [MessageEntry(message=UserMessage.of("x".join(HIDING)))])
    long: list[Entry] = []
    for n in range(LONG_SIZE):
        long.append(MessageEntry(parent_id=long[-1].id if long else None,
                                 message=UserMessage.of(f"message number {n}")))
    await session(LONG, long)
    chat: list[Entry] = [MessageEntry(message=UserMessage.of("before the extra"))]
    chat.append(CustomEntry(parent_id=chat[-1].id, kind="pi.extra", data={"cwd": "/home/ana"}))
    chat.append(MessageEntry(parent_id=chat[-1].id, message=UserMessage.of("after the extra")))
    await session("imported", chat)
    await store.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("viewer-rules") / "store"
    in_thread(_build(out))
    return out


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    proc, url = start_server(root)
    try:
        yield url
    finally:
        stop(proc)


def _session_page(server: str, sid: str, query: str = "") -> str:
    status, _, body = http_get(server, f"/session?id={quote(sid, safe='')}{query}")
    assert status == 200, body
    return body.decode()


def _entry_texts(doc: str) -> list[str]:
    """The message texts of the stored-log column, in page order."""
    tree = doc.split('<section id="tree"', 1)[1].split("</section>", 1)[0]
    return re.findall(r"message number \d+", tree)


def test_s29_characters_that_reorder_or_hide_text_are_drawn_as_escapes(
    server: str, root: Path
) -> None:
    served = _session_page(server, SPOOF_ID)
    exported = tl("--store", str(root), "export", SPOOF_ID, "--format", "html").stdout
    entries = in_thread(_load(root, SPOOF_ID))
    rendered = render_html(_tree(entries, SPOOF_ID))
    for doc in (served, exported, rendered):
        text = "".join(Page(doc).text)
        for char in HIDING:
            assert char not in doc, repr(char)
        assert "user\\u202etxt.exe" in text and "\\U000e0041" in text and "\\xad" in text


def test_s29_a_long_session_is_paged_and_every_entry_is_on_one_page(
    server: str, root: Path
) -> None:
    first = _session_page(server, LONG)
    # Opens where the leaf is: the last page here.
    shown = _entry_texts(first)
    assert 0 < len(shown) <= PAGE_ENTRIES
    assert shown[-1] == f"message number {LONG_SIZE - 1}"
    assert f"{LONG_SIZE:,} entries" in first
    seen: list[str] = []
    for number in (1, 2, 3):
        doc = _session_page(server, LONG, f"&page={number}")
        seen += _entry_texts(doc)
        assert len(Page(doc).tags) > 0
    assert seen == [f"message number {n}" for n in range(LONG_SIZE)]
    assert 'href="/session?id=long&amp;page=2"' in first  # the way back
    status, _, _ = http_get(server, "/session?id=long&page=x")
    assert status == 400
    # The export is paged the same way, and --all gives everything.
    store = ["--store", str(root)]
    exported = tl(*store, "export", LONG, "--format", "html")
    assert _entry_texts(exported.stdout) == shown
    assert "--page" in exported.stderr and "--all" in exported.stderr  # told it is a part
    assert _entry_texts(tl(*store, "export", LONG, "--format", "html", "--page", "1").stdout) \
        == seen[:PAGE_ENTRIES]
    assert _entry_texts(tl(*store, "export", LONG, "--format", "html", "--all").stdout) == seen


def test_s29_custom_entries_are_hidden_unless_asked_for(server: str) -> None:
    doc = _session_page(server, "imported")
    assert "before the extra" in doc and "after the extra" in doc
    assert "pi.extra" not in doc
    assert "1 custom entry hidden" in doc
    assert 'href="/session?id=imported&amp;custom=1"' in doc
    shown = _session_page(server, "imported", "&custom=1")
    assert "custom · pi.extra" in shown and "/home/ana" in shown


def test_s29_browser_follows_a_session_whose_id_holds_control_characters(
    page: Any, server: str, root: Path
) -> None:
    page.goto(f"{server}session?id={quote(CONTROL_ID, safe='')}")
    page.wait_for_selector("#live-state.on", timeout=20_000)
    append_from_child(root, CONTROL_ID, "appended while watching")
    page.get_by_text("appended while watching").first.wait_for()
    assert_nothing_ran(page)


async def _load(root: Path, sid: str) -> list[Entry]:
    store = FileStore(root)
    try:
        return await store.load_entries(sid)
    finally:
        await store.close()


def _tree(entries: list[Entry], sid: str) -> Any:
    from threadline.session import TreeIndex

    return TreeIndex(entries, session_id=sid)
