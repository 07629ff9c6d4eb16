"""What the ``threadline`` command's HTML export calls."""

from __future__ import annotations

from threadline.session._store import Store
from threadline.session._tree import TreeIndex
from threadline.viewer._common import lineage
from threadline.viewer._html import render_html

__all__ = ["export_html"]


async def export_html(store: Store, tree: TreeIndex) -> bytes:
    record, children = await lineage(store, tree.session_id)
    return render_html(tree, record, children).encode("utf-8", "replace")
