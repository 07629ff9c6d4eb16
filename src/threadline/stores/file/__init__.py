"""The file store: one append-only JSON-lines file per session."""

from threadline.stores.file._format import decode_lines
from threadline.stores.file._names import session_file_name
from threadline.stores.file._store import FileStore

__all__ = ["FileStore", "decode_lines", "session_file_name"]
