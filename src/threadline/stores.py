"""Opening a store from a URL, and copying sessions between stores.

``open_store`` understands:

==============================================  =====================================
``/var/sessions``, ``./sessions``               FileStore on that folder
``file:///var/sessions``, ``file:sessions``     FileStore (``?durability=fsync|flush``)
``sqlite:///var/db/sessions.db``                SQLiteStore on an absolute path
``sqlite:sessions.db``                          SQLiteStore on a relative path
                                                (``?synchronous=FULL|NORMAL``,
                                                ``?busy_timeout=SECONDS``)
``postgresql://user@host/db``, ``postgres://``  PostgresStore (``?schema=``,
                                                ``?prepare_threshold=none|N``,
                                                ``?min_size=``, ``?max_size=``,
                                                ``?timeout=``, ``?connect_timeout=``;
                                                other parameters
                                                go to libpq, e.g. ``sslmode``)
``memory:``                                     MemoryStore (tests, demos)
==============================================  =====================================

Any other ``scheme:`` prefix is refused rather than taken for a folder name, so
a typo like ``sqllite:x.db`` cannot become a directory; write ``./name:x`` for a
folder whose name holds a colon. ``open_store(url, create=False)`` opens only a
store that already exists (a reader must not leave an empty one behind).

``copy_sessions`` moves sessions between any two stores, keeping ids, lineage
and append order; entries arrive byte-identical because every store keeps the
codec's bytes. It is safe to run again after an interruption.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import msgspec

from threadline.errors import ConfigError, CopyConflict, SessionNotFound, missing_extra
from threadline.session._codec import encode_entry
from threadline.session._entries import SessionRecord
from threadline.session._store import CatalogStore, Store

__all__ = ["CopyProgress", "CopyResult", "copy_sessions", "open_store"]

_SCHEMES = ("file", "sqlite", "postgresql", "postgres", "memory")
# Two letters at least: "C:\\x" is a Windows drive, not a scheme.
_LOOKS_LIKE_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(
        f":{parts.password}@", ":***@", 1)))


def open_store(url: str | os.PathLike[str], *, create: bool = True) -> CatalogStore:
    """The store a URL (or folder path) names. Raises ``ConfigError`` naming the URL.

    With ``create=False`` a folder, SQLite file or PostgreSQL schema that does
    not exist yet is a ``StoreError`` naming it, and nothing is created.
    """
    if isinstance(url, os.PathLike):
        return _file_store(os.fspath(url), {}, str(url), create)
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"store URL must be a non-empty string, got {url!r}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"cannot parse store URL {_safe(url)!r}: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        _refuse_unknown_scheme(url)
        return _file_store(url, {}, url, create)  # a plain folder path ("C:\\x" included)
    shown = _safe(url)
    params = _params(parts.query, shown)

    if scheme in ("postgresql", "postgres"):
        return _postgres_store(parts, params, shown, create)
    if parts.netloc not in ("", "localhost") or (scheme == "sqlite" and parts.netloc):
        raise ConfigError(
            f"store URL {shown!r} names a host; {scheme}: URLs take a local path, like "
            f"{scheme}:///absolute/path or {scheme}:relative/path")
    if scheme == "memory":
        _no_more(params, shown)
        if parts.path:
            raise ConfigError(f"memory: store URL {shown!r} takes no path")
        from threadline.session._memory import MemoryStore

        return MemoryStore()
    path = unquote(parts.path)
    if not path:
        raise ConfigError(f"store URL {shown!r} has no path")
    if scheme == "file":
        return _file_store(path, params, shown, create)
    from threadline.session._sqlite import SQLiteStore

    synchronous = params.pop("synchronous", "FULL").upper()
    if synchronous not in ("FULL", "NORMAL"):
        raise ConfigError(f"store URL {shown!r}: synchronous must be FULL or NORMAL, "
                          f"got {synchronous!r}")
    busy = _number(params.pop("busy_timeout", "30"), "busy_timeout", shown, float)
    _no_more(params, shown)
    return SQLiteStore(path, synchronous="FULL" if synchronous == "FULL" else "NORMAL",
                       busy_timeout=busy, create=create)


def _refuse_unknown_scheme(url: str) -> None:
    if "://" in url or _LOOKS_LIKE_SCHEME.match(url):
        raise ConfigError(
            f"unknown store URL scheme {url.split(':', 1)[0]!r} in {_safe(url)!r}; "
            f"expected a folder path or a file:, sqlite:, postgresql: or memory: URL "
            f"(write ./{url.split('/', 1)[0]} for a folder of that name)")


def _safe(url: str) -> str:
    try:
        return _redacted(url)
    except ValueError:
        return url


def _params(query: str, shown: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in params:
            raise ConfigError(f"store URL {shown!r} repeats the parameter {key!r}")
        params[key] = value
    return params


def _no_more(params: dict[str, str], shown: str) -> None:
    if params:
        raise ConfigError(f"store URL {shown!r}: unknown parameter(s) "
                          f"{', '.join(sorted(params))}")


def _number(value: str, name: str, shown: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(value)
    except ValueError as exc:
        raise ConfigError(f"store URL {shown!r}: {name} must be a number, got {value!r}") \
            from exc


def _file_store(path: str, params: dict[str, str], shown: str, create: bool) -> CatalogStore:
    from threadline.session._file import FileStore

    durability = params.pop("durability", "fsync")
    _no_more(params, shown)
    if durability not in ("fsync", "flush"):
        raise ConfigError(f"store URL {shown!r}: durability must be fsync or flush, "
                          f"got {durability!r}")
    return FileStore(path, durability="fsync" if durability == "fsync" else "flush",
                     create=create)


def _postgres_store(parts: Any, params: dict[str, str], shown: str,
                    create: bool) -> CatalogStore:
    try:
        import psycopg

        from threadline.session._postgres import PostgresStore
    except ImportError as exc:
        raise missing_extra("postgres", f"store URL {shown!r}", exc) from exc
    options: dict[str, Any] = {}
    if "schema" in params:
        options["schema"] = params.pop("schema")
    if "prepare_threshold" in params:
        raw = params.pop("prepare_threshold")
        options["prepare_threshold"] = (
            None if raw.lower() in ("", "none", "null", "off")
            else _number(raw, "prepare_threshold", shown, int))
    # connect_timeout is the store's too: it bounds the first connection, which
    # libpq alone would not (the pool would keep retrying until its own timeout).
    for name, kind in (("min_size", int), ("max_size", int), ("timeout", float),
                       ("connect_timeout", float)):
        if name in params:
            options[name] = _number(params.pop(name), name, shown, kind)
    # What is left belongs to libpq; let it reject what it does not know now,
    # rather than at the first query.
    libpq_url = urlunsplit(parts._replace(query=urlencode(params)))
    try:
        psycopg.conninfo.conninfo_to_dict(libpq_url)
    except psycopg.Error as exc:
        raise ConfigError(f"store URL {shown!r} is not a valid PostgreSQL URL: {exc}") from exc
    return PostgresStore(libpq_url, create=create, **options)


# -- copying --------------------------------------------------------------------


class CopyProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Reported after each session. ``done`` counts sessions finished so far."""

    session_id: str
    done: int
    total: int
    status: Literal["copied", "resumed", "skipped"]
    """copied: new in the destination; resumed: the destination held a prefix
    and got the missing tail; skipped: already complete."""
    entries: int
    """Entries appended to the destination for this session."""


class CopyResult(msgspec.Struct, frozen=True, kw_only=True):
    copied: int = 0
    resumed: int = 0
    skipped: int = 0
    entries: int = 0


async def copy_sessions(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    *,
    batch_size: int = 500,
) -> CopyResult:
    """Copy sessions (all of ``src``'s when ``ids`` is None) into ``dst``.

    Records keep their id, parent and creation time; entries keep their bytes
    and append order. Resumable: a session already complete in ``dst`` is
    skipped, one holding a strict prefix of the source log gets the missing
    tail, and one that differs raises ``CopyConflict`` (nothing is
    overwritten). Entries go in batches of ``batch_size`` so an interrupted
    copy leaves a prefix that the next run completes.
    """
    load_session = getattr(src, "load_session", None)
    if load_session is None:
        raise ConfigError(f"copy_sessions needs a source with load_session to keep lineage; "
                          f"{type(src).__name__} has none")
    if batch_size < 1:
        raise ConfigError(f"copy_sessions batch_size must be at least 1, got {batch_size}")
    if ids is None:
        session_ids = await _all_ids(src)
    else:
        session_ids = list(dict.fromkeys(ids))
    counts = {"copied": 0, "resumed": 0, "skipped": 0, "entries": 0}
    for done, sid in enumerate(session_ids, 1):
        record: SessionRecord = await load_session(sid)
        status, appended = await _copy_one(src, dst, record, batch_size)
        counts[status] += 1
        counts["entries"] += appended
        if progress is not None:
            progress(CopyProgress(session_id=sid, done=done, total=len(session_ids),
                                  status=status, entries=appended))
    return CopyResult(**counts)


async def _all_ids(src: Store) -> list[str]:
    list_sessions = getattr(src, "list_sessions", None)
    if list_sessions is None:
        raise ConfigError(f"copy_sessions without ids needs a source with list_sessions; "
                          f"{type(src).__name__} has none")
    found: list[str] = []
    cursor = None
    while True:
        page = await list_sessions(limit=500, cursor=cursor)
        found += [r.id for r in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            # Oldest first, so parents tend to arrive before their forks.
            return found[::-1]


async def _copy_one(src: Store, dst: Store, record: SessionRecord,
                    batch_size: int) -> tuple[Literal["copied", "resumed", "skipped"], int]:
    sid = record.id
    entries = await src.load_entries(sid)
    source = [encode_entry(e) for e in entries]
    try:
        existing = await dst.load_entries(sid)
    except SessionNotFound:
        await dst.create_session(record)
        existing = []
        status: Literal["copied", "resumed", "skipped"] = "copied"
    else:
        status = "resumed"
        dst_load = getattr(dst, "load_session", None)
        if dst_load is not None:
            have: SessionRecord = await dst_load(sid)
            if (have.parent_id, _instant(have.created_at)) != (
                    record.parent_id, _instant(record.created_at)):
                raise CopyConflict(
                    f"session {sid!r} exists in the destination with a different record "
                    f"(parent {have.parent_id!r}, created {have.created_at.isoformat()}) "
                    f"than the source (parent {record.parent_id!r}, created "
                    f"{record.created_at.isoformat()})", session_id=sid)
    if len(existing) > len(source):
        raise CopyConflict(f"session {sid!r} has {len(existing)} entries in the destination "
                           f"but only {len(source)} in the source", session_id=sid)
    for n, entry in enumerate(existing):
        if encode_entry(entry) != source[n]:
            raise CopyConflict(f"session {sid!r} differs at entry {n + 1} (id {entry.id!r}): "
                               f"the destination holds different content", session_id=sid)
    tail = entries[len(existing):]
    if not tail and status == "resumed":
        return "skipped", 0
    for start in range(0, len(tail), batch_size):
        await dst.append_entries(sid, tail[start:start + batch_size])
    return status, len(tail)


def _instant(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt
