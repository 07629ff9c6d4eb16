"""threadline's own export format: sessions followed by their blobs' lines, and
bundles: sessions and the blobs they reference, as a folder or one tar file.

Layout (the same inside the tar)::

    manifest.json          {"format": "threadline-bundle", "version": 1,
                            "sessions": [{"id", "file", "entries"}], "blobs": [{"sha256", "size"}]}
    sessions/000001.jsonl  one session as ``export`` writes it: its session_init
                           line, then every entry's stored bytes
    blobs/<sha256>         the plaintext bytes of one blob

Session files are numbered, never named after the session id, so a hostile
id cannot reach a path. Reading trusts nothing in the bundle: names must
match the layout, tar members must be regular files (never extracted to
disk), a folder's files must not be links, and every blob must hash to its
name. ``import`` of a bundle gives back the same records, the same entry
bytes and the same blobs, so exporting again writes the same bundle.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import msgspec

from threadline.ai._messages import BlobPart
from threadline.errors import ConfigError, CorruptLog
from threadline.integrations.importers._common import Imported, not_the_format
from threadline.session._tree import TreeIndex
from threadline.stores._blobs import blob_parts, open_blob
from threadline.stores._contract import CatalogStore
from threadline.stores.file._format import decode_init, decode_lines, encode_init, export_lines

__all__ = ["blob_line", "decode_blob_line", "import_threadline", "is_bundle", "read_bundle",
           "write_bundle"]

FORMAT = "threadline-bundle"
_SESSION_FILE = re.compile(r"sessions/[0-9]{6}\.jsonl")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Manifest(msgspec.Struct, frozen=True):
    format: str
    version: int
    sessions: list[dict[str, Any]]
    blobs: list[dict[str, Any]]


def is_bundle(path: Path) -> bool:
    """A folder holding a manifest, or a file named ``*.tar``."""
    return (path.is_dir() and (path / "manifest.json").is_file()) or path.suffix == ".tar"


class _Writer:
    """A folder, or a tar file, written one member at a time."""

    def __init__(self, target: Path) -> None:
        self.tar: tarfile.TarFile | None = None
        self.root = target
        if target.suffix == ".tar":
            if target.exists():
                raise ConfigError(f"{target} exists; a bundle is written to a new file")
            self.tar = tarfile.open(target, "x", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        else:
            if target.exists() and (not target.is_dir() or any(target.iterdir())):
                raise ConfigError(f"{target} exists and is not an empty folder; a bundle is "
                                  f"written to a new folder (or a FILE.tar)")
            (target / "sessions").mkdir(parents=True, exist_ok=True)
            (target / "blobs").mkdir(exist_ok=True)

    def add(self, name: str, data: bytes) -> None:
        if self.tar is not None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # the same bytes each time
            self.tar.addfile(info, io.BytesIO(data))
        else:
            (self.root / name).write_bytes(data)

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


async def write_bundle(store: CatalogStore, ids: list[str], target: Path) -> tuple[int, int]:
    """Write ``ids`` (all sessions when empty) and their blobs to ``target``; (sessions, blobs)."""
    if not ids:
        cursor: str | None = None
        while True:
            page = await store.list_sessions(limit=500, cursor=cursor)
            ids += [r.id for r in page.sessions]
            if (cursor := page.next_cursor) is None:
                break
    writer = _Writer(target)
    sessions: list[dict[str, Any]] = []
    blobs: dict[str, int] = {}
    try:
        for n, sid in enumerate(ids, 1):
            record = await store.load_session(sid)
            entries = await store.load_entries(sid)
            tree = TreeIndex(entries, session_id=sid)
            name = f"sessions/{n:06d}.jsonl"
            writer.add(name, encode_init(record) + b"\n" + export_lines(tree.entries))
            sessions.append({"id": sid, "file": name, "entries": len(entries)})
            for part in blob_parts(entries):
                if part.sha256 not in blobs and _HEX64.fullmatch(part.sha256):
                    writer.add(f"blobs/{part.sha256}", await open_blob(store, sid, part))
                    blobs[part.sha256] = part.size
        manifest = _Manifest(FORMAT, 1, sessions,
                             [{"sha256": k, "size": v} for k, v in sorted(blobs.items())])
        writer.add("manifest.json", msgspec.json.format(msgspec.json.encode(manifest)) + b"\n")
    finally:
        writer.close()
    return len(sessions), len(blobs)


# -- threadline's own file format: sessions, then their blobs ------------------------

_INIT = b'{"type":"session_init"'


def import_threadline(data: bytes, name: str) -> list[Imported]:
    """One or more sessions, each a ``session_init`` line followed by its entries,
    and after them the lines of the blobs they reference, if any."""
    other = not_the_format(name, data, "threadline")
    if other is not None:
        raise other
    lines = data.split(b"\n")  # never a universal-newline split: see docs/design.md
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise CorruptLog("the file is empty; expected a session_init line", path=name, line=1)
    starts = [i for i, line in enumerate(lines) if i == 0 or line.startswith(_INIT)]
    found: list[Imported] = []
    for start, stop in zip(starts, [*starts[1:], len(lines)], strict=True):
        record = decode_init(lines[start], path=name, lineno=start + 1)
        blobs: dict[str, bytes] = {}
        end = stop
        while end > start + 1 and lines[end - 1].startswith(_BLOB):
            key, value = decode_blob_line(lines[end - 1], path=name, lineno=end)
            blobs[key] = value
            end -= 1
        # One decode per session: the codec reads batch lines as well.
        body = b"".join(line + b"\n" for line in lines[start + 1:end])
        entries = decode_lines(body, session_id=record.id, path=name, first_line=start + 2)
        found.append(Imported(record, entries, blobs=blobs))
    return found


# -- blobs inline in a JSONL export ------------------------------------------------------

_BLOB = b'{"type":"blob"'


class _BlobLine(msgspec.Struct, frozen=True, tag_field="type", tag="blob"):
    sha256: str
    media_type: str
    size: int
    data: str
    """The bytes, base64."""


def blob_line(part: BlobPart, data: bytes) -> bytes:
    """One blob as a JSONL export carries it, after the entries of its session."""
    return msgspec.json.encode(_BlobLine(part.sha256, part.media_type, len(data),
                                         base64.b64encode(data).decode("ascii"))) + b"\n"


def decode_blob_line(line: bytes, *, path: str, lineno: int) -> tuple[str, bytes]:
    """(sha256, bytes) of a blob line, checked against its hash and size."""
    try:
        blob = msgspec.json.decode(line, type=_BlobLine)
        data = base64.b64decode(blob.data, validate=True)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise CorruptLog(f"not a blob line: {exc}", path=path, line=lineno) from exc
    if len(data) != blob.size or hashlib.sha256(data).hexdigest() != blob.sha256:
        raise CorruptLog(f"blob {blob.sha256[:80]!r}: the bytes do not match its hash and size",
                         path=path, line=lineno)
    return blob.sha256, data



# -- reading a bundle ----------------------------------------------------------------


def _read_file(f: Path, shown: str) -> bytes:
    try:
        fd = os.open(f, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise CorruptLog(f"cannot read {f.name}: {exc.strerror or exc} (a bundle holds "
                         f"plain files, never links)", path=shown) from exc
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _files(path: Path) -> dict[str, bytes]:
    shown = str(path)
    out: dict[str, bytes] = {}
    if path.is_dir():
        for sub in ("sessions", "blobs"):
            folder = path / sub
            if folder.is_dir() and not folder.is_symlink():
                for f in sorted(folder.iterdir()):
                    out[f"{sub}/{f.name}"] = _read_file(f, shown)
        out["manifest.json"] = _read_file(path / "manifest.json", shown)
        return out
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isreg():
                    raise CorruptLog(f"member {member.name!r} is not a regular file",
                                     path=shown)
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has one
                out[member.name] = handle.read()
    except (OSError, tarfile.TarError) as exc:
        raise CorruptLog(f"not a readable tar file: {exc}", path=shown) from exc
    return out


def _blobs(files: dict[str, bytes], shown: str) -> dict[str, bytes]:
    """The bundle's blobs by hash, each checked against its name; no stray members."""
    blobs: dict[str, bytes] = {}
    for name, data in files.items():
        if name.startswith("blobs/"):
            key = name.removeprefix("blobs/")
            if not _HEX64.fullmatch(key):
                raise CorruptLog(f"{name!r} is not named by a SHA-256", path=shown)
            if hashlib.sha256(data).hexdigest() != key:
                raise CorruptLog(f"{name}: the bytes do not hash to the name", path=shown)
            blobs[key] = data
        elif name != "manifest.json" and not _SESSION_FILE.fullmatch(name):
            raise CorruptLog(f"unexpected member {name!r}", path=shown)
    return blobs


def read_bundle(path: Path) -> list[Imported]:
    """The sessions of a bundle, each with the blobs its entries reference."""
    shown = str(path)
    files = _files(path)
    blobs = _blobs(files, shown)
    if "manifest.json" not in files:
        raise CorruptLog("no manifest.json: not a threadline bundle", path=shown)
    try:
        manifest = msgspec.json.decode(files["manifest.json"], type=_Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptLog(f"manifest.json: {exc}", path=shown) from exc
    if manifest.format != FORMAT or manifest.version != 1:
        raise CorruptLog(f"manifest.json: not a version 1 {FORMAT} "
                         f"({manifest.format!r} version {manifest.version})", path=shown)
    found: list[Imported] = []
    for s in manifest.sessions:
        file = s.get("file")
        if not isinstance(file, str) or not _SESSION_FILE.fullmatch(file) or file not in files:
            raise CorruptLog(f"manifest.json names a missing session file {file!r}", path=shown)
        for item in import_threadline(files[file], f"{shown}/{file}"):
            wanted = {p.sha256 for p in blob_parts(item.entries)}
            missing = sorted(wanted - blobs.keys())
            if missing:
                raise CorruptLog(f"session {item.record.id!r} references blob {missing[0]} "
                                 f"that the bundle does not hold", path=shown)
            found.append(item._replace(blobs={k: blobs[k] for k in wanted}))
    return found
