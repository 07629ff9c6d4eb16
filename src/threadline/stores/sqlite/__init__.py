"""The SQLite store: every session in one database file."""

from threadline.stores.sqlite._store import SQLiteStore

__all__ = ["SQLiteStore"]
