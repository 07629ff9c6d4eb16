"""Serve chats to browsers: runs that outlive the request, rejoinable streams, stored stops.

``create_app`` gives an ASGI app (Starlette; extra ``[web]``, imported on
first use) that speaks the Vercel AI SDK's UI message stream protocol, so
``useChat`` with ``resume: true`` works against it, and a plain event stream
with ``Last-Event-ID`` resume for other clients. Runs are owned by
``threadline.durable.LiveRuns``. The UI message mapping (``ui_messages``,
``user_message``, ``UIStream``) needs no extra. See docs/web.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.web._ui import HEADERS, UIStream, ui_messages, user_message

if TYPE_CHECKING:
    from threadline.web._app import MAX_BODY_BYTES, MAX_MESSAGE_BYTES, Sessions, create_app

__all__ = [
    "HEADERS",
    "MAX_BODY_BYTES",
    "MAX_MESSAGE_BYTES",
    "Sessions",
    "UIStream",
    "create_app",
    "ui_messages",
    "user_message",
]


def __getattr__(name: str) -> Any:
    if name in ("MAX_BODY_BYTES", "MAX_MESSAGE_BYTES", "Sessions", "create_app"):
        try:
            from threadline.web import _app
        except ImportError as exc:
            from threadline.errors import missing_extra

            raise missing_extra("web", "threadline.web.create_app", exc) from exc
        return getattr(_app, name)
    raise AttributeError(f"module 'threadline.web' has no attribute {name!r}")
