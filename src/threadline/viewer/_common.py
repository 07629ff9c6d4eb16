"""Store reads shared by the server and the export, and the loopback test.

Standard library only: the HTML export runs without the viewer extra.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from threadline.errors import StoreError
from threadline.session._entries import SessionRecord
from threadline.session._store import Store, encode_cursor

__all__ = ["MAX_PAGE", "is_loopback", "lineage", "matching"]

MAX_PAGE = 500
# Finding forks and filtering by id read the listing; past this many pages
# of MAX_PAGE sessions the viewer stops looking rather than stall the page.
_SCAN_PAGES = 20


async def matching(
    lister: Callable[..., Any], query: str, limit: int, cursor: str | None
) -> tuple[list[SessionRecord], str | None]:
    """One page of sessions whose id contains ``query``, and the cursor after it."""
    if not query:
        page = await lister(limit=limit, cursor=cursor)
        return list(page.sessions), page.next_cursor
    found: list[SessionRecord] = []
    for _ in range(_SCAN_PAGES):
        page = await lister(limit=MAX_PAGE, cursor=cursor)
        for record in page.sessions:
            if query in record.id:
                found.append(record)
                if len(found) == limit:
                    return found, encode_cursor(record)
        cursor = page.next_cursor
        if cursor is None:
            return found, None
    return found, cursor


async def lineage(store: Store, sid: str) -> tuple[SessionRecord | None, list[SessionRecord]]:
    """The session's record (if the store can say) and the sessions forked from it."""
    record: SessionRecord | None = None
    loader = getattr(store, "load_session", None)
    if loader is not None:
        try:
            record = await loader(sid)
        except StoreError:
            record = None
    children: list[SessionRecord] = []
    lister = getattr(store, "list_sessions", None)
    if lister is not None:
        cursor = None
        for _ in range(_SCAN_PAGES):
            page = await lister(limit=MAX_PAGE, cursor=cursor)
            children += [r for r in page.sessions if r.parent_id == sid]
            cursor = page.next_cursor
            if cursor is None:
                break
    return record, children


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
