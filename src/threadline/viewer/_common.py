"""Store reads shared by the server and the export, the loopback test, and
which entries a view shows by default (the command's ``show`` and ``tree`` too).

Standard library only: the HTML export runs without the viewer extra.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from threadline.errors import StoreError
from threadline.session._entries import CustomEntry, Entry, SessionRecord
from threadline.stores._contract import Store, encode_cursor

__all__ = ["MAX_PAGE", "is_loopback", "lineage", "matching", "shown_by_default"]

MAX_PAGE = 500
# Finding forks and filtering by id read the listing; past this many pages
# of MAX_PAGE sessions the viewer stops looking rather than stall the page.
_SCAN_PAGES = 20


async def matching(
    lister: Callable[..., Any], query: str, limit: int, cursor: str | None,
    titles: dict[str, str] | None = None,
) -> tuple[list[SessionRecord], str | None]:
    """One page of sessions whose id contains ``query``, and the cursor after it.

    ``titles`` gets the title of each listed session that has one."""
    def note(page: Any) -> None:
        if titles is not None:
            titles.update((i.id, i.title) for i in getattr(page, "infos", ()) if i.title)

    if not query:
        page = await lister(limit=limit, cursor=cursor)
        note(page)
        return list(page.sessions), page.next_cursor
    found: list[SessionRecord] = []
    for _ in range(_SCAN_PAGES):
        page = await lister(limit=MAX_PAGE, cursor=cursor)
        note(page)
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


def shown_by_default(entry: Entry) -> bool:
    """False for the custom entries an application or an importer stored.

    They are never sent to a model, and an imported session holds one after
    almost every message (the fields the importer had no place for), so a
    view leaves them out unless asked. threadline's own records (kinds
    ``threadline.*``: tool plans, starts, approvals) are part of the story
    and always shown.
    """
    return not isinstance(entry, CustomEntry) or entry.kind.startswith("threadline.")
