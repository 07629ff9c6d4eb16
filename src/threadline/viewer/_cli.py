"""What the ``threadline`` command's HTML export calls."""

from __future__ import annotations

import base64

from threadline.session._tree import TreeIndex
from threadline.stores._blobs import blob_parts, open_blob
from threadline.stores._contract import Store
from threadline.viewer._common import lineage
from threadline.viewer._html import (
    IMAGE_TYPES,
    PAGE_ENTRIES,
    Layout,
    blob_sources,
    document_for,
)

__all__ = ["export_html"]


async def export_html(store: Store, tree: TreeIndex, *, page: int | None = None,
                      whole: bool = False, custom: bool = False) -> tuple[bytes, Layout, int]:
    """The page's bytes, the session's layout, and the page drawn."""
    record, children = await lineage(store, tree.session_id)
    layout = Layout(tree, custom=custom, per_page=None if whole else PAGE_ENTRIES)
    drawn = min(max(page or layout.leaf_page, 1), layout.pages)
    # The page makes no request, so the images it draws go in as data URLs:
    # those of its own entries and of the path its context column shows.
    on_page = layout.drawn[(drawn - 1) * layout.per_page: drawn * layout.per_page]
    images: dict[str, str] = {}
    for part in blob_parts([*on_page, *layout.path]):
        if part.media_type in IMAGE_TYPES and part.sha256 not in images:
            data = await open_blob(store, tree.session_id, part)
            images[part.sha256] = (f"data:{part.media_type};base64,"
                                   + base64.b64encode(data).decode("ascii"))
    with blob_sources(lambda part: images.get(part.sha256)):
        doc = document_for(tree, record, children, page=drawn, layout=layout)
    return doc.encode("utf-8", "replace"), layout, drawn
