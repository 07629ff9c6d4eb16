"""Opening a store from a URL.

``open_store`` understands:

==============================================  =====================================
``/var/sessions``, ``./sessions``               FileStore on that folder
``file:///var/sessions``, ``file:sessions``     FileStore (``?durability=fsync|flush``,
                                                ``?tenant=``)
``sqlite:///var/db/sessions.db``                SQLiteStore on an absolute path
``sqlite:sessions.db``                          SQLiteStore on a relative path
                                                (``?synchronous=FULL|NORMAL``,
                                                ``?busy_timeout=SECONDS``,
                                                ``?tenant=``)
``postgresql://user@host/db``, ``postgres://``  PostgresStore (``?schema=``,
                                                ``?prepare_threshold=none|N``,
                                                ``?min_size=``, ``?max_size=``,
                                                ``?timeout=``, ``?connect_timeout=``,
                                                ``?tenant=``, ``?trusted=true``;
                                                other parameters
                                                go to libpq, e.g. ``sslmode``)
``memory:``                                     MemoryStore (tests, demos)
==============================================  =====================================

Any other ``scheme:`` prefix is refused rather than taken for a folder name, so
a typo like ``sqllite:x.db`` cannot become a directory; write ``./name:x`` for a
folder whose name holds a colon. ``open_store(url, create=False)`` opens only a
store that already exists (a reader must not leave an empty one behind).

"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from threadline.errors import ConfigError, missing_extra
from threadline.stores._contract import CatalogStore

__all__ = ["open_store"]

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
        from threadline.stores._memory import MemoryStore

        return MemoryStore()
    path = unquote(parts.path)
    if not path:
        raise ConfigError(f"store URL {shown!r} has no path")
    if scheme == "file":
        return _file_store(path, params, shown, create)
    from threadline.stores.sqlite._store import SQLiteStore

    synchronous = params.pop("synchronous", "FULL").upper()
    if synchronous not in ("FULL", "NORMAL"):
        raise ConfigError(f"store URL {shown!r}: synchronous must be FULL or NORMAL, "
                          f"got {synchronous!r}")
    busy = _number(params.pop("busy_timeout", "30"), "busy_timeout", shown, float)
    tenant = params.pop("tenant", None)
    _no_more(params, shown)
    return SQLiteStore(path, synchronous="FULL" if synchronous == "FULL" else "NORMAL",
                       busy_timeout=busy, create=create, tenant=tenant)


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
        raise ConfigError(f"store URL {shown!r}: unknown parameter"
                          f"{'s' if len(params) > 1 else ''} {', '.join(sorted(params))}")


def _number(value: str, name: str, shown: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(value)
    except ValueError as exc:
        raise ConfigError(f"store URL {shown!r}: {name} must be a number, got {value!r}") \
            from exc


def _file_store(path: str, params: dict[str, str], shown: str, create: bool) -> CatalogStore:
    from threadline.stores.file._store import FileStore

    durability = params.pop("durability", "fsync")
    tenant = params.pop("tenant", None)
    _no_more(params, shown)
    if durability not in ("fsync", "flush"):
        raise ConfigError(f"store URL {shown!r}: durability must be fsync or flush, "
                          f"got {durability!r}")
    return FileStore(path, durability="fsync" if durability == "fsync" else "flush",
                     create=create, tenant=tenant)


def _postgres_store(parts: Any, params: dict[str, str], shown: str,
                    create: bool) -> CatalogStore:
    try:
        import psycopg

        from threadline.stores.postgres._store import PostgresStore
    except ImportError as exc:
        raise missing_extra("postgres", f"store URL {shown!r}", exc) from exc
    options: dict[str, Any] = {}
    if "schema" in params:
        options["schema"] = params.pop("schema")
    if "tenant" in params:
        options["tenant"] = params.pop("tenant")
    if "trusted" in params:
        raw = params.pop("trusted").lower()
        if raw not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"store URL {shown!r}: trusted must be true or false, "
                              f"got {raw!r}")
        options["trusted"] = raw in ("true", "1", "yes")
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
