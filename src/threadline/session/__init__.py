"""Sessions: the record, the entry log, the tree, and the stores that keep them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.session.codec import decode_entry, encode_entries, encode_entry
from threadline.session.context import build_context, interrupted_result, normalize_tool_pairs
from threadline.session.entries import (
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
from threadline.session.file import FileStore
from threadline.session.ids import new_id
from threadline.session.memory import MemoryStore
from threadline.session.store import EntryLog, ManagedStore, SessionPage, Store
from threadline.session.tree import TreeIndex

if TYPE_CHECKING:
    from threadline.session.postgres import PostgresStore
    from threadline.session.sqlite import SQLiteStore

__all__ = [
    "FORMAT_VERSION",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "EntryLog",
    "FileStore",
    "ManagedStore",
    "MemoryStore",
    "MessageEntry",
    "OpaqueEntry",
    "PostgresStore",
    "SQLiteStore",
    "SessionPage",
    "SessionRecord",
    "Store",
    "TreeIndex",
    "build_context",
    "custom_kinds",
    "decode_entry",
    "encode_entries",
    "encode_entry",
    "interrupted_result",
    "new_id",
    "normalize_tool_pairs",
    "register_custom",
]


def __getattr__(name: str) -> Any:
    # The SQL stores import their drivers lazily: psycopg is an optional extra.
    if name == "SQLiteStore":
        from threadline.session.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from threadline.session.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'threadline.session' has no attribute {name!r}")
