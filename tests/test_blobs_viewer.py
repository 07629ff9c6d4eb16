"""The viewer and the HTML export show attachments, and a hostile blob runs nothing.

Images a browser decodes as pixels are drawn from ``/blob`` with their own
content type; every other file (an SVG with script, an HTML page, an "image"
whose bytes are HTML) is a download, served as ``application/octet-stream``
with ``Content-Disposition: attachment``. Every blob response has
``nosniff`` and a sandboxing CSP, the page's CSP stays strict. Checked over
HTTP against a real ``threadline serve`` child process and in Chromium with
the viewer tests' detector installed.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from support.viewer import (
    assert_nothing_ran,
    browser,
    http_get,
    in_thread,
    page,
    start_server,
    stop,
)
from threadline.ai import TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord, TreeIndex
from threadline.session._ids import new_id
from threadline.stores import FileStore, attach
from threadline.viewer._cli import export_html
from threadline.viewer._server import CSP

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD"
                       "hgGAWjR9awAAAABJRU5ErkJggg==")
SVG = (b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=1">'
       b"<script>window.__pwned=1;alert(1)</script></svg>")
HTML = b"<html><body><script>window.__pwned=1;alert(1)</script></body></html>"
NAME = '<img src=x onerror="window.__pwned=1">"\r\nX-Evil: 1.png'
SID = "att <b>&</b>"
__all__ = ["browser", "page"]  # the fixtures, imported for these tests


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def build(root: Path) -> None:
    store = FileStore(root)
    await store.create_session(SessionRecord(id=SID))
    parts = [await attach(store, SID, PNG, media_type="image/png", name=NAME),
             await attach(store, SID, SVG, media_type="image/svg+xml", name="x.svg"),
             await attach(store, SID, HTML, media_type="text/html", name=NAME),
             # A polyglot: HTML bytes that call themselves an image.
             await attach(store, SID, HTML + b" ", media_type="image/png", name="poly.png")]
    entry = MessageEntry(id=new_id(), parent_id=None, message=UserMessage(
        content=(TextPart(text="four files"), *parts)))
    await store.append_entries(SID, [entry])
    # Another session's blob: not reachable through this session's URL.
    await store.create_session(SessionRecord(id="other"))
    other = await attach(store, "other", b"GIF89a private", media_type="image/gif")
    await store.append_entries("other", [MessageEntry(
        id=new_id(), parent_id=None, message=UserMessage(content=(other,)))])
    await store.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("blobs") / "store"
    in_thread(build(out))
    return out


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    proc, url = start_server(root)
    try:
        yield url
    finally:
        stop(proc)


def href(digest: str, session: str = SID) -> str:
    return f"/blob?session={quote(session, safe='')}&sha={digest}"


def test_images_are_served_inline_with_their_type_and_nosniff(server: str) -> None:
    status, headers, body = http_get(server, href(sha(PNG)))
    assert (status, body) == (200, PNG)
    assert headers["content-type"] == "image/png"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["content-disposition"] == "inline"
    assert "sandbox" in headers["content-security-policy"]


@pytest.mark.parametrize("data", [SVG, HTML, HTML + b" "])
def test_svg_html_and_polyglots_are_downloads_only(server: str, data: bytes) -> None:
    status, headers, body = http_get(server, href(sha(data)))
    assert (status, body) == (200, data)
    if data.endswith(b" "):  # labelled image/png: served as such, never sniffed as HTML
        assert headers["content-type"] == "image/png"
        assert headers["x-content-type-options"] == "nosniff"
        return
    assert headers["content-type"] == "application/octet-stream"
    disposition = headers["content-disposition"]
    assert disposition.startswith("attachment; filename=")
    # The hostile name cannot break out of the header: no quote, CR or LF in it.
    assert "\r" not in disposition and "\n" not in disposition
    assert disposition.count('"') == 2
    assert "x-evil" not in headers


def test_blob_urls_only_reach_the_named_sessions_blobs(server: str) -> None:
    assert http_get(server, href(sha(b"GIF89a private")))[0] == 404  # another session's
    assert http_get(server, href(sha(b"GIF89a private"), "other"))[0] == 200
    assert http_get(server, href("0" * 64))[0] == 404
    assert http_get(server, "/blob?session=x&sha=../../etc/passwd")[0] == 400
    assert http_get(server, href(sha(PNG), "missing"))[0] == 404


def test_the_session_page_draws_images_and_links_files(server: str) -> None:
    status, headers, body = http_get(server, f"/session?id={quote(SID, safe='')}")
    page_html = body.decode()
    assert status == 200 and headers["content-security-policy"] == CSP
    assert '<img class="image" alt="' in page_html
    assert f'src="{href(sha(PNG)).replace("&", "&amp;")}"' in page_html
    # The SVG is a link to a download, never an <img> or inline markup.
    assert f'href="{href(sha(SVG)).replace("&", "&amp;")}" download' in page_html
    assert "<svg" not in page_html and "onerror=" not in page_html.replace("onerror=&quot;", "")


# --------------------------------------------------------------------------- in Chromium


def test_hostile_blobs_run_nothing_in_the_browser(page: Any, server: str) -> None:
    page.goto(f"{server}session?id={quote(SID, safe='')}")
    page.wait_for_selector("#live-state.on")
    images = page.locator("img.image")
    assert images.count() == 4  # the PNG and the polyglot, in the tree and the context
    page.wait_for_function("document.querySelector('img.image').complete")
    assert page.evaluate("document.querySelector('img.image').naturalWidth") == 1
    assert_nothing_ran(page)
    # Clicking the SVG's link saves it; nothing renders it.
    with page.expect_download() as download:
        page.locator(f'a[href="{href(sha(SVG))}"]').first.click()
    assert download.value.suggested_filename == "x.svg"
    assert_nothing_ran(page)
    # Opening the polyglot's URL itself: an image that does not decode, no script.
    page.goto(server.rstrip("/") + href(sha(HTML + b" ")))
    assert page.evaluate("window.__pwned") == 0
    assert page.evaluate("document.scripts.length") == 0
    assert page.dialogs == []


def test_html_export_inlines_images_and_runs_nothing(page: Any, root: Path,
                                                     tmp_path: Path) -> None:
    async def export() -> bytes:
        store = FileStore(root)
        try:
            tree = TreeIndex(await store.load_entries(SID), session_id=SID)
            data, _, _ = await export_html(store, tree)
            return data
        finally:
            await store.close()

    doc = in_thread(export())
    assert b"data:image/png;base64," + base64.b64encode(PNG) in doc
    assert base64.b64encode(SVG) not in doc and base64.b64encode(HTML) not in doc
    out = tmp_path / "export.html"
    out.write_bytes(doc)
    page.goto(out.as_uri())
    page.wait_for_function("document.querySelector('img.image').complete")
    assert page.evaluate("document.querySelector('img.image').naturalWidth") == 1
    assert_nothing_ran(page)
