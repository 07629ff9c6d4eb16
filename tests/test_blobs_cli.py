"""The command line's attachments: ``show`` names them, ``blob get`` writes one out,
``migrate-blobs`` moves inline images of old sessions into blobs with entry ids
unchanged, and ``import`` moves an importer's inline images into blobs.

Every command runs as a real child process against a real file store.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import subprocess
from pathlib import Path

from support.cli import CLI, tl
from threadline.ai import BlobPart, ImagePart, TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.session._ids import new_id
from threadline.stores import FileStore, attach, open_blob

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
HOSTILE = "evil\x1b[31m\u202egnp.exe\nsecond line"


def user(*content: object) -> MessageEntry:
    return MessageEntry(id=new_id(), parent_id=None,
                        message=UserMessage(content=(TextPart(text="look"), *content)))  # type: ignore[arg-type]


async def blob_session(root: Path, sid: str = "pics") -> BlobPart:
    store = FileStore(root)
    await store.create_session(SessionRecord(id=sid))
    part = await attach(store, sid, PNG, media_type="image/png", name=HOSTILE)
    await store.append_entries(sid, [user(part)])
    await store.close()
    return part


def test_show_names_attachments_and_escapes_a_hostile_name(tmp_path: Path) -> None:
    part = asyncio.run(blob_session(tmp_path))
    shown = tl("--store", str(tmp_path), "show", "pics").stdout
    assert f"[image/png 2.0 KiB {part.sha256[:12]} " in shown
    # The name's escape, bidi override and newline are shown as escapes, never acted on.
    assert "\x1b" not in shown and "\u202e" not in shown
    assert shown.count("\n") == 1
    assert "\\x1b" in shown and "\\u202e" in shown


def test_blob_get_writes_the_bytes_by_short_hash(tmp_path: Path) -> None:
    part = asyncio.run(blob_session(tmp_path))
    out = tmp_path / "out.png"
    with out.open("wb") as f:  # `threadline blob get HASH > out.png`
        subprocess.run([*CLI, "--store", str(tmp_path), "blob", "get", part.sha256[:12]],
                       stdout=f, check=True, timeout=120)
    assert out.read_bytes() == PNG
    got = tmp_path / "again.png"
    tl("--store", str(tmp_path), "blob", "get", part.sha256, "--session", "pics", "-o", str(got))
    assert got.read_bytes() == PNG
    missing = tl("--store", str(tmp_path), "blob", "get", "ab" * 32, check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr
    listed = json.loads(tl("--store", str(tmp_path), "blob", "list", "--json").stdout)
    assert listed["key"] == part.sha256 and listed["size"] == len(PNG)


async def old_session(root: Path) -> tuple[list[str], bytes]:
    """A session as written before blobs: the image base64 inside its entry."""
    store = FileStore(root)
    await store.create_session(SessionRecord(id="old"))
    first = user(ImagePart(data=base64.b64encode(PNG).decode(), mime_type="image/png"))
    second = MessageEntry(id=new_id(), parent_id=first.id, message=UserMessage.of("more"))
    await store.append_entries("old", [first, second])
    await store.close()
    return [first.id, second.id], (root / "old.jsonl").read_bytes()


def test_migrate_blobs_moves_images_out_with_entry_ids_unchanged(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    ids, before = asyncio.run(old_session(src))
    # An old session opens as it always did: the image inline, the file untouched.
    assert "image/png 2.0 KiB inline" in tl("--store", str(src), "show", "old").stdout
    out = tl("--store", str(src), "migrate-blobs", "--to", str(dst)).stdout
    assert "old: copied, 1 image moved to blobs" in out
    assert (src / "old.jsonl").read_bytes() == before  # the source is never rewritten

    async def check() -> None:
        store = FileStore(dst)
        entries = await store.load_entries("old")
        assert [e.id for e in entries] == ids
        assert [e.parent_id for e in entries] == [None, ids[0]]
        part = entries[0].message.content[1]  # type: ignore[attr-defined]
        assert isinstance(part, BlobPart) and part.sha256 == hashlib.sha256(PNG).hexdigest()
        assert await open_blob(store, "old", part) == PNG
        await store.close()

    asyncio.run(check())
    assert base64.b64encode(PNG).decode()[:40] not in (dst / "old.jsonl").read_text()
    again = tl("--store", str(src), "migrate-blobs", "--to", str(dst), "--json").stdout
    assert json.loads(again)["status"] == "skipped"


def test_import_moves_a_pi_image_into_blobs(tmp_path: Path) -> None:
    data = base64.b64encode(PNG).decode()
    lines = [
        {"type": "session", "version": 3, "id": "pi-img", "timestamp": "2025-11-20T09:00:00Z",
         "cwd": "/x"},
        {"type": "message", "id": "u1", "parentId": None, "timestamp": "2025-11-20T09:00:01Z",
         "message": {"role": "user", "timestamp": 1, "content": [
             {"type": "text", "text": "see"},
             {"type": "image", "data": data, "mimeType": "image/png"}]}},
    ]
    src = tmp_path / "pi.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store_dir = tmp_path / "store"
    tl("--store", str(store_dir), "import", str(src))
    stored = next(store_dir.glob("*.jsonl")).read_text()
    assert data[:40] not in stored and '"type":"blob"' in stored
    blob = tl("--store", str(store_dir), "blob", "list", "--json").stdout
    assert json.loads(blob)["key"] == hashlib.sha256(PNG).hexdigest()


async def _moved(imported: list[object]) -> None:
    from threadline.integrations.importers import Imported, move_inline
    from threadline.stores import MemoryStore

    for item in imported:
        assert isinstance(item, Imported)
        store = MemoryStore()
        before = [e.id for e in item.entries]
        entries, moved = await move_inline(store, item.record.id, item.entries)
        assert moved == 1 and [e.id for e in entries] == before
        [part] = [p for e in entries if isinstance(e, MessageEntry)
                  for p in getattr(e.message, "content", ()) if isinstance(p, BlobPart)]
        assert await open_blob(store, item.record.id, part) == PNG
        assert not any(isinstance(p, ImagePart) for e in entries if isinstance(e, MessageEntry)
                       for p in getattr(e.message, "content", ()))


def test_claude_code_and_agents_sdk_images_move_into_blobs(tmp_path: Path) -> None:
    from agents.memory import SQLiteSession

    from threadline.integrations.importers import import_agents_sqlite, import_claude_code

    data = base64.b64encode(PNG).decode()
    line = {"parentUuid": None, "sessionId": "cc-1", "type": "user", "uuid": "u1",
            "timestamp": "2025-10-01T10:00:00.000Z", "message": {"role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": data}}]}}
    claude = import_claude_code((json.dumps(line) + "\n").encode(), "cc.jsonl")
    db = tmp_path / "agents.db"

    async def write() -> None:
        session = SQLiteSession("sdk-1", db)
        await session.add_items([{"role": "user", "content": [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "detail": "auto",
             "image_url": f"data:image/png;base64,{data}"}]}])
        session.close()

    asyncio.run(write())
    agents = import_agents_sqlite(db)
    asyncio.run(_moved([*claude, *agents]))


def test_check_reports_a_missing_blob_and_markdown_names_attachments(tmp_path: Path) -> None:
    part = asyncio.run(blob_session(tmp_path))
    assert tl("--store", str(tmp_path), "check", "pics").returncode == 0
    md = tl("--store", str(tmp_path), "export", "pics", "--format", "markdown").stdout
    assert f"sha256 `{part.sha256}`" in md and "image/png" in md and "\x1b" not in md
    blob = tmp_path / "blobs" / part.sha256[:2] / part.sha256
    blob.unlink()
    proc = tl("--store", str(tmp_path), "check", "pics", check=False)
    assert proc.returncode == 1
    assert f"1 referenced blob not stored ({part.sha256[:12]})" in proc.stdout
