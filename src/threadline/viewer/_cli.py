"""What the ``threadline`` command's ``serve`` verb and HTML export call."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from threadline.session._store import Store
from threadline.session._tree import TreeIndex
from threadline.viewer._common import is_loopback, lineage
from threadline.viewer._html import render_html

__all__ = ["export_html", "serve"]


async def export_html(store: object, tree: TreeIndex) -> bytes:
    assert isinstance(store, Store)
    record, children = await lineage(store, tree.session_id)
    return render_html(tree, record, children).encode("utf-8", "replace")


async def serve(store: object, host: str, port: int, console: Console) -> None:
    from threadline import viewer

    assert isinstance(store, Store)
    if not is_loopback(host):
        console.print(Text(f"warning: serving on {host}, reachable from other machines; "
                           "transcripts are readable by anyone who can connect",
                           style="yellow"))

    def ready(url: str) -> None:
        console.print(Text(f"threadline viewer on {url} (read-only; Ctrl-C to stop)"))

    await viewer.serve(store, host=host, port=port, ready=ready)
