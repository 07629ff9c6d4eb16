"""Export bundles and JSONL with blobs inline: ``import`` reads them back byte for byte.

A bundle (a folder, or one tar file) holds sessions and the blobs they
reference; importing it into an empty store and exporting again writes the
same bytes. A tampered bundle is refused with nothing stored. Every command
runs as a real child process against real file and SQLite stores.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from support.cli import CLI, tl
from threadline.ai import TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.session._ids import new_id
from threadline.stores import attach, open_blob, open_store

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 16
PDF = b"%PDF-1.4\n" + bytes(range(255, -1, -1)) * 9


async def fill(url: str) -> None:
    store = open_store(url, create=True)
    for sid, data, media in (("a", PNG, "image/png"), ("b", PDF, "application/pdf"),
                             ("c", PNG, "image/png")):
        await store.create_session(SessionRecord(id=sid))
        part = await attach(store, sid, data, media_type=media, name=f"{sid}.bin")
        entry = MessageEntry(id=new_id(), parent_id=None, message=UserMessage(
            content=(TextPart(text=f"session {sid}"), part)))
        await store.append_entries(sid, [entry])
    await store.close()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("target", ["bundle", "bundle.tar"])
def test_bundle_round_trips_byte_for_byte(tmp_path: Path, target: str) -> None:
    src = tmp_path / "src"
    asyncio.run(fill(str(src)))
    first, second = tmp_path / "one" / target, tmp_path / "two" / target
    first.parent.mkdir()
    second.parent.mkdir()
    tl("--store", str(src), "export", "--bundle", str(first))
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    tl("--store", dst, "import", str(first))
    tl("--store", dst, "export", "--bundle", str(second))
    if target.endswith(".tar"):
        assert first.read_bytes() == second.read_bytes()
        with tarfile.open(first) as tar:
            names = tar.getnames()
        # The same image in two sessions is in the bundle once.
        assert sum(n.startswith("blobs/") for n in names) == 2
    else:
        assert tree_bytes(first) == tree_bytes(second)
        assert len(list((first / "blobs").iterdir())) == 2
    for sid in "abc":  # entry bytes as they were in the source
        assert (tl("--store", dst, "export", sid, "--no-blobs").stdout
                == tl("--store", str(src), "export", sid, "--no-blobs").stdout)

    async def check() -> None:
        store = open_store(dst)
        entries = await store.load_entries("b")
        part = entries[0].message.content[1]  # type: ignore[attr-defined]
        assert await open_blob(store, "b", part) == PDF
        await store.close()

    asyncio.run(check())


def test_jsonl_export_carries_its_blobs_inline(tmp_path: Path) -> None:
    src = tmp_path / "src"
    asyncio.run(fill(str(src)))
    exported = subprocess.run([*CLI, "--store", str(src), "export", "a"], capture_output=True,
                              check=True, timeout=120).stdout
    session_file = (src / "a.jsonl").read_bytes()
    assert exported.startswith(session_file)  # the stored bytes, then the blob line
    assert exported[len(session_file):].startswith(b'{"type":"blob"')
    bare = subprocess.run([*CLI, "--store", str(src), "export", "a", "--no-blobs"],
                          capture_output=True, check=True, timeout=120).stdout
    assert bare == session_file
    one_file = tmp_path / "a.jsonl"
    one_file.write_bytes(exported)
    dst = tmp_path / "dst"
    tl("--store", str(dst), "import", str(one_file))
    assert (dst / "a.jsonl").read_bytes() == session_file
    assert (dst / "blobs").is_dir()
    got = tmp_path / "got"
    tl("--store", str(dst), "blob", "get", hashlib.sha256(PNG).hexdigest(), "-o", str(got))
    assert got.read_bytes() == PNG


def test_tampered_bundles_are_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    src = tmp_path / "src"
    asyncio.run(fill(str(src)))
    bundle = tmp_path / "b"
    tl("--store", str(src), "export", "--bundle", str(bundle), "a")
    blob = next((bundle / "blobs").iterdir())
    blob.write_bytes(b"not the image")
    dst = tmp_path / "dst"
    proc = tl("--store", str(dst), "import", str(bundle), check=False)
    assert proc.returncode == 1 and "do not hash to the name" in proc.stderr
    assert not list(dst.glob("*.jsonl"))
    # A tar with a link, or a member outside the layout, is refused too.
    for member in (tarfile.TarInfo("blobs/" + "0" * 64), tarfile.TarInfo("../../escape")):
        bad = tmp_path / f"bad{len(member.name)}.tar"
        with tarfile.open(bad, "w") as tar:
            if member.name.startswith("blobs/"):
                member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(member)
            else:
                member.size = 2
                tar.addfile(member, io.BytesIO(b"hi"))
        proc = tl("--store", str(dst), "import", str(bad), check=False)
        assert proc.returncode == 1
        assert "not a regular file" in proc.stderr or "unexpected member" in proc.stderr
    assert not (tmp_path / "escape").exists()
    assert not list(dst.glob("*.jsonl"))


def test_export_into_an_existing_folder_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    asyncio.run(fill(str(src)))
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    proc = tl("--store", str(src), "export", "--bundle", str(used), check=False)
    assert proc.returncode == 1 and "not an empty folder" in proc.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
