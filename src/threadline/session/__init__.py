"""Sessions: the record, the entry log, the tree, and the stores that keep them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.session._codec import MAX_DEPTH, decode_entry, decode_lines, encode_entry
from threadline.session._context import build_context, normalize_tool_pairs
from threadline.session._entries import (
    FORMAT_VERSION,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
    custom_kinds,
    register_custom,
)
from threadline.session._file import FileStore
from threadline.session._ids import new_id
from threadline.session._memory import MemoryStore
from threadline.session._store import (
    CatalogStore,
    EntryLog,
    LinearStore,
    SessionPage,
    Store,
    WatchableStore,
)
from threadline.session._storekit import check_session_id
from threadline.session._tree import TreeIndex, TreeView

if TYPE_CHECKING:
    from threadline.session._postgres import PostgresStore
    from threadline.session._sqlite import SQLiteStore

__all__ = [
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "BranchSummaryEntry",
    "CatalogStore",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "EntryLog",
    "FileStore",
    "LinearStore",
    "MemoryStore",
    "MessageEntry",
    "OpaqueEntry",
    "PostgresStore",
    "SQLiteStore",
    "SessionPage",
    "SessionRecord",
    "Store",
    "TreeIndex",
    "TreeView",
    "WatchableStore",
    "build_context",
    "check_session_id",
    "custom_kinds",
    "decode_entry",
    "decode_lines",
    "encode_entry",
    "new_id",
    "normalize_tool_pairs",
    "register_custom",
]


def __getattr__(name: str) -> Any:
    # The SQL stores import their drivers lazily: psycopg is an optional extra.
    if name == "SQLiteStore":
        from threadline.session._sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from threadline.session._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'threadline.session' has no attribute {name!r}")
