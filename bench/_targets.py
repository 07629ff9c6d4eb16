"""Every name the benchmarks take from threadline, in one place.

Only public names: when a name moves, the change is here and nowhere else in bench/.
"""

from __future__ import annotations

from typing import Any

from threadline import durable
from threadline.agent import AgentEvent, AgentLoop, MessageEnd
from threadline.ai import (
    AssistantMessage,
    Message,
    ModelInfo,
    Request,
    StreamOptions,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
    tool,
)
from threadline.errors import SessionNotFound
from threadline.integrations.importers import import_claude_code, import_pi
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider, RetentionPolicy, prune
from threadline.session import (
    CustomEntry,
    Entry,
    MessageEntry,
    SessionRecord,
    TreeIndex,
    encode_entry,
)
from threadline.stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, Store
from threadline.stores.file import decode_lines
from threadline.testing import Call, ScriptedModel, Text, Turn
from threadline.viewer import render_html


def providers() -> Any:
    """``threadline.ai.providers`` (it needs the openai and anthropic extras)."""
    import threadline.ai.providers

    return threadline.ai.providers


def serve() -> Any:
    """``threadline.viewer.serve`` (it needs the viewer extra)."""
    from threadline.viewer import serve

    return serve


__all__ = [
    "AgentEvent",
    "AgentLoop",
    "AssistantMessage",
    "Call",
    "CustomEntry",
    "EncryptedStore",
    "Entry",
    "FileStore",
    "Keyring",
    "LocalKeyProvider",
    "MemoryStore",
    "Message",
    "MessageEnd",
    "MessageEntry",
    "ModelInfo",
    "PostgresStore",
    "Request",
    "RetentionPolicy",
    "SQLiteStore",
    "ScriptedModel",
    "SessionNotFound",
    "SessionRecord",
    "Store",
    "StreamOptions",
    "Text",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolResult",
    "ToolResultMessage",
    "TreeIndex",
    "Turn",
    "Usage",
    "UserMessage",
    "decode_lines",
    "durable",
    "encode_entry",
    "import_claude_code",
    "import_pi",
    "providers",
    "prune",
    "render_html",
    "serve",
    "tool",
]
