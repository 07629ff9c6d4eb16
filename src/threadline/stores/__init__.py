"""Where sessions are kept: the Store contract and the stores that ship.

A store needs three async methods (``Store``); the shipped ones offer the
optional capabilities too (``CatalogStore``, ``LinearStore``,
``WatchableStore``). ``open_store`` opens one from a URL or folder path and
``copy_sessions`` moves sessions between any two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.stores._blobs import (
    DEFAULT_MAX_BLOB,
    GcReport,
    attach,
    collect_garbage,
    open_blob,
)
from threadline.stores._contract import (
    BlobInfo,
    BlobStore,
    CatalogStore,
    Cut,
    EntryLog,
    LinearStore,
    ListOrder,
    PrunableStore,
    SearchableStore,
    SearchHit,
    SessionInfo,
    SessionPage,
    Store,
    WatchableStore,
)
from threadline.stores._copy import CopyProgress, CopyResult, copy_sessions
from threadline.stores._listing import load_metadata, set_metadata
from threadline.stores._memory import MemoryStore
from threadline.stores._rules import MAX_SESSION_ID_BYTES, check_blob_key, check_session_id
from threadline.stores._search import indexed_text
from threadline.stores._url import open_store
from threadline.stores.file import FileStore

if TYPE_CHECKING:
    from threadline.stores.postgres import PostgresStore
    from threadline.stores.sqlite import SQLiteStore

__all__ = [
    "DEFAULT_MAX_BLOB",
    "MAX_SESSION_ID_BYTES",
    "BlobInfo",
    "BlobStore",
    "CatalogStore",
    "CopyProgress",
    "CopyResult",
    "Cut",
    "EntryLog",
    "FileStore",
    "GcReport",
    "LinearStore",
    "ListOrder",
    "MemoryStore",
    "PostgresStore",
    "PrunableStore",
    "SQLiteStore",
    "SearchHit",
    "SearchableStore",
    "SessionInfo",
    "SessionPage",
    "Store",
    "WatchableStore",
    "attach",
    "check_blob_key",
    "check_session_id",
    "collect_garbage",
    "copy_sessions",
    "indexed_text",
    "load_metadata",
    "open_blob",
    "open_store",
    "set_metadata",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: psycopg is an optional extra, and a program that
    # keeps its sessions in files need not load sqlite3.
    if name == "SQLiteStore":
        from threadline.stores.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from threadline.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'threadline.stores' has no attribute {name!r}")
