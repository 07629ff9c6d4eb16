"""The local web viewer (``threadline serve``) and the HTML export.

``render_html`` needs only the standard library. ``create_app`` and ``serve``
need the ``viewer`` extra (Starlette and uvicorn), imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.viewer._html import render_html

if TYPE_CHECKING:
    from threadline.viewer._server import create_app, serve

__all__ = ["create_app", "render_html", "serve"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        try:
            from threadline.viewer import _server
        except ModuleNotFoundError as exc:
            from threadline.errors import ConfigError

            raise ConfigError(
                f"the web viewer needs the viewer extra ({exc.name} is missing): "
                "pip install 'threadline[viewer]'"
            ) from exc
        return getattr(_server, name)
    raise AttributeError(f"module 'threadline.viewer' has no attribute {name!r}")
