"""The viewer's search box and page (S64): hostile text in hits is escaped, scoping works.

Checked on the HTML with a parser, through the ASGI app on a real file store.
"""

from __future__ import annotations

import asyncio
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

from starlette.testclient import TestClient

from support.viewer import PAYLOADS
from threadline.ai._messages import TextPart, UserMessage
from threadline.session._entries import CustomEntry, MessageEntry, SessionRecord
from threadline.session._metadata import METADATA_KIND, metadata_change
from threadline.stores import FileStore
from threadline.viewer._server import create_app

HOSTILE_ID = '"><svg onload=window.__pwned=1>\u202eexe'


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.marks: list[str] = []
        self._in_mark = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_mark = tag == "mark"

    def handle_endtag(self, tag: str) -> None:
        self._in_mark = False

    def handle_data(self, data: str) -> None:
        if self._in_mark:
            self.marks.append(data)


def _fill(root: Path) -> None:
    async def run() -> None:
        store = FileStore(root)
        for sid, owner in ((HOSTILE_ID, "ann"), ("plain", "bob")):
            await store.create_session(SessionRecord(id=sid))
            meta = CustomEntry(kind=METADATA_KIND, data=metadata_change(owner=owner))
            text = "whale " + " ".join(PAYLOADS) if owner == "ann" else "whale of bob"
            entry = MessageEntry(parent_id=meta.id,
                                 message=UserMessage(content=(TextPart(text=text),)))
            await store.append_entries(sid, [meta, entry])

    asyncio.run(run())


def _page(client: TestClient, url: str) -> tuple[int, str, _Tags]:
    response = client.get(url)
    parser = _Tags()
    parser.feed(response.text)
    return response.status_code, response.text, parser


def test_s64_viewer_search_escapes_hits(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _fill(root)
    client = TestClient(create_app(FileStore(root)), base_url="http://localhost")
    status, html, tags = _page(client, "/search?q=" + quote("WHALE"))
    assert status == 200
    # Only the page's own elements: nothing stored became a tag or an attribute.
    allowed = {"html", "head", "meta", "link", "title", "script", "body", "nav", "a", "form",
               "input", "button", "main", "h1", "ol", "li", "span", "p", "mark"}
    assert {t for t, _ in tags.tags} <= allowed
    assert all(not k.startswith("on") for _, attrs in tags.tags for k in attrs)
    scripts = [a for t, a in tags.tags if t == "script"]
    assert scripts == [{"src": "/static/viewer.js", "defer": None}]
    assert "\u202e" not in html and "&lt;script&gt;" in html
    assert {m.lower() for m in tags.marks} == {"whale"}
    hrefs = [a.get("href") or "" for t, a in tags.tags if t == "a"]
    assert "/session?id=" + quote(HOSTILE_ID, safe="") in hrefs
    assert "/session?id=plain" in hrefs
    # Scoped to one owner: the other session is gone from the page.
    _, html, tags = _page(client, "/search?q=whale&owner=bob")
    hrefs = [a.get("href") or "" for t, a in tags.tags if t == "a"]
    assert "/session?id=plain" in hrefs
    assert not any(quote(HOSTILE_ID, safe="") in h for h in hrefs)


def test_s64_viewer_search_box_and_bad_queries(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _fill(root)
    client = TestClient(create_app(FileStore(root)), base_url="http://localhost")
    _, _, tags = _page(client, "/")
    assert ("form", {"class": "search", "method": "get", "action": "/search",
                     "role": "search"}) in tags.tags
    status, html, _ = _page(client, "/search?q=" + quote('"*()'))
    assert status == 400 and "at least one word" in html
    status, html, _ = _page(client, "/search?q=absentword")
    assert status == 200 and "no entry holds" in html
    status, _, _ = _page(client, "/search")
    assert status == 200


def test_s64_viewer_search_reflects_its_parameters_escaped(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _fill(root)
    client = TestClient(create_app(FileStore(root)), base_url="http://localhost")
    hostile = "<script>alert(1)</script>\u202e"
    url = "/search?q=" + quote(hostile + " whale") + "&owner=" + quote(hostile) + \
        "&tenant=" + quote(hostile)
    status, html, tags = _page(client, url)
    assert status == 200 and "no entry holds" in html
    assert [a for t, a in tags.tags if t == "script"] == [
        {"src": "/static/viewer.js", "defer": None}]
    assert "\u202e" not in html and html.count("&lt;script&gt;") >= 3
