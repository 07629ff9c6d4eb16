"""The session data model: the record, entries, ids, the tree and context building.

Nothing here does I/O. The stores that keep sessions are in
``threadline.stores``.
"""

from __future__ import annotations

import warnings
from typing import Any

from threadline.session._codec import MAX_DEPTH, decode_entry, encode_entry
from threadline.session._context import build_context, normalize_tool_pairs
from threadline.session._entries import (
    FORMAT_VERSION,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
    SessionRecord,
    custom_kinds,
    register_custom,
)
from threadline.session._ids import new_id
from threadline.session._metadata import (
    METADATA_KIND,
    MetadataChange,
    SessionMetadata,
    fold_metadata,
)
from threadline.session._tree import TreeIndex, TreeView

__all__ = [
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "METADATA_KIND",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "ErasedEntry",
    "MessageEntry",
    "MetadataChange",
    "OpaqueEntry",
    "SealedEntry",
    "SessionMetadata",
    "SessionRecord",
    "TreeIndex",
    "TreeView",
    "build_context",
    "custom_kinds",
    "decode_entry",
    "encode_entry",
    "fold_metadata",
    "new_id",
    "normalize_tool_pairs",
    "register_custom",
]

# Names that lived here before the stores got their own package; they keep
# working for one release, with a warning that says where they went.
_MOVED = {
    "CatalogStore": "threadline.stores",
    "EntryLog": "threadline.stores",
    "FileStore": "threadline.stores",
    "LinearStore": "threadline.stores",
    "MemoryStore": "threadline.stores",
    "PostgresStore": "threadline.stores",
    "SQLiteStore": "threadline.stores",
    "SessionPage": "threadline.stores",
    "Store": "threadline.stores",
    "WatchableStore": "threadline.stores",
    "check_session_id": "threadline.stores",
    "decode_lines": "threadline.stores.file",
}


def __getattr__(name: str) -> Any:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'threadline.session' has no attribute {name!r}")
    warnings.warn(f"threadline.session.{name} moved to {home}.{name}; the old name goes "
                  f"away in the next release", DeprecationWarning, stacklevel=2)
    import importlib

    return getattr(importlib.import_module(home), name)
