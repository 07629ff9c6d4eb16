"""The viewer's session list shows each session's title (S61), escaped."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from support.viewer import in_thread, start_server, stop
from threadline.session import SessionRecord
from threadline.stores import FileStore, set_metadata


def test_s61_the_viewer_lists_titles_escaped(tmp_path: Path) -> None:
    async def setup() -> None:
        store = FileStore(tmp_path)
        await store.create_session(SessionRecord(id="titled"))
        await store.create_session(SessionRecord(id="plain"))
        await set_metadata(store, "titled", title="<img src=x onerror=alert(1)> user\u202etxt.exe")
        await store.close()

    in_thread(setup())
    proc, url = start_server(tmp_path)
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/") as reply:
            body = reply.read().decode()
        assert "<th>title</th>" in body
        assert "&lt;img src=x onerror=alert(1)&gt; user" in body
        assert "<img src=x" not in body and "\u202e" not in body
    finally:
        stop(proc)
