"""Blobs through EncryptedStore: sealed and deduplicated per subject, erased with it (S59)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from threadline.ai._messages import BlobPart, TextPart, UserMessage
from threadline.errors import BlobNotFound, MalformedEnvelope, PrivacyError
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
from threadline.session import ErasedEntry, MessageEntry, SessionRecord
from threadline.stores import (
    BlobStore,
    FileStore,
    MemoryStore,
    SQLiteStore,
    Store,
    attach,
    collect_garbage,
    copy_sessions,
    open_blob,
)

MARKER = b"MARKER-5b1e the scan of the passport"
KEK = LocalKeyProvider(b"k" * 32)


def _sealed(tmp_path: Path, inner: Store, subject: object = None) -> EncryptedStore:
    return EncryptedStore(inner, Keyring(tmp_path / "keyring", KEK),
                          subject=subject)  # type: ignore[arg-type]


def _message(part: BlobPart) -> MessageEntry:
    return MessageEntry(message=UserMessage(content=(TextPart(text="attached"), part)))


def _by_user(record: SessionRecord) -> str:
    return record.id.split("-")[0]


async def _blob_count(inner: Store) -> int:
    return len(await inner.list_blobs())  # type: ignore[attr-defined]


async def test_s59_sealed_per_subject_deduplicated_only_within_one(tmp_path: Path) -> None:
    inner = MemoryStore()
    store = _sealed(tmp_path, inner, subject=_by_user)
    assert isinstance(store, BlobStore)
    for sid in ("alice-1", "alice-2", "bob-1"):
        await store.create_session(SessionRecord(id=sid))
    image = MARKER * 1000
    parts = [await attach(store, sid, image, media_type="image/png")
             for sid in ("alice-1", "alice-2", "bob-1")]
    assert len({p.sha256 for p in parts}) == 1  # the reference is the plaintext hash
    stored = await inner.list_blobs()
    assert len(stored) == 2  # once for alice's two sessions, once for bob
    plain_key = parts[0].sha256
    assert all(i.key != plain_key and i.key.startswith("s") for i in stored)
    for i in stored:
        assert MARKER not in await inner.get_blob(i.key)
    for sid, part in zip(("alice-1", "alice-2", "bob-1"), parts, strict=True):
        assert await open_blob(store, sid, part) == image
    # An encrypted store takes sealed bytes only through its plain methods.
    with pytest.raises(PrivacyError):
        await store.put_blob(plain_key, image)
    with pytest.raises(MalformedEnvelope):
        await store.put_blob("s" + plain_key, image)
    assert len(await inner.list_blobs()) == 2


async def test_s59_sealed_bytes_bound_to_their_name_and_media_type(tmp_path: Path) -> None:
    inner = MemoryStore()
    store = _sealed(tmp_path, inner, subject="one")
    await store.create_session(SessionRecord(id="s"))
    a = await attach(store, "s", b"first image", media_type="image/png")
    b = await attach(store, "s", b"second image", media_type="image/png")
    ka, kb = list(inner._blobs)
    inner._blobs[ka], inner._blobs[kb] = inner._blobs[kb], inner._blobs[ka]  # swapped names
    for part in (a, b):
        with pytest.raises(MalformedEnvelope, match="does not authenticate"):
            await open_blob(store, "s", part)
    inner._blobs[ka], inner._blobs[kb] = inner._blobs[kb], inner._blobs[ka]
    relabelled = BlobPart(sha256=a.sha256, media_type="text/html", size=a.size)
    with pytest.raises(MalformedEnvelope):
        await open_blob(store, "s", relabelled)
    assert await open_blob(store, "s", a) == b"first image"


async def test_s59_erase_subject_deletes_its_blobs_and_spares_others(tmp_path: Path) -> None:
    inner = FileStore(tmp_path / "files")
    store = _sealed(tmp_path, inner, subject=_by_user)
    for sid in ("alice-1", "bob-1"):
        await store.create_session(SessionRecord(id=sid))
    await store.create_session(SessionRecord(id="alice-fork", parent_id="alice-1"))
    a = await attach(store, "alice-1", b"alice's scan", media_type="image/png")
    f = await attach(store, "alice-fork", b"alice's fork file", media_type="application/pdf")
    b = await attach(store, "bob-1", b"bob's scan", media_type="image/png")
    await store.append_entries("alice-1", [_message(a)])
    await store.append_entries("alice-fork", [_message(a), _message(f)])
    await store.append_entries("bob-1", [_message(b)])
    assert await _blob_count(inner) == 3
    erasure = await store.erase_subject("alice")
    assert erasure.blobs == 2
    assert await _blob_count(inner) == 1
    assert await open_blob(store, "bob-1", b) == b"bob's scan"
    with pytest.raises(BlobNotFound, match="alice-1"):
        await open_blob(store, "alice-1", a)
    # Erased entries reference nothing, so the collector has nothing of alice to keep.
    assert all(isinstance(e, ErasedEntry) for e in await store.load_entries("alice-1"))
    report = await collect_garbage(store, grace=timedelta(0))
    assert report.deleted == [] and report.referenced == 1


async def test_s59_collector_keeps_sealed_references_and_takes_orphans(tmp_path: Path) -> None:
    inner = SQLiteStore(tmp_path / "s.db")
    store = _sealed(tmp_path, inner, subject="tenant")
    try:
        await store.create_session(SessionRecord(id="s"))
        kept = await attach(store, "s", b"referenced", media_type="image/png")
        await attach(store, "s", b"orphan", media_type="image/png")
        await store.append_entries("s", [_message(kept)])
        # A key version made later (rotation) still finds the older name.
        await store.keys.rotate_subject("tenant")
        report = await collect_garbage(store, grace=timedelta(0))
        assert (len(report.deleted), report.referenced) == (1, 1)
        assert await open_blob(store, "s", kept) == b"referenced"
        again = await attach(store, "s", b"referenced", media_type="image/png")
        assert again == kept and await open_blob(store, "s", again) == b"referenced"
    finally:
        await inner.close()


async def test_s59_copy_between_sealed_stores_carries_sealed_blobs(tmp_path: Path) -> None:
    keys = Keyring(tmp_path / "keyring", KEK)
    src = EncryptedStore(FileStore(tmp_path / "a"), keys, subject="t")
    dst_inner = MemoryStore()
    dst = EncryptedStore(dst_inner, keys, subject="t")
    await src.create_session(SessionRecord(id="s"))
    part = await attach(src, "s", MARKER, media_type="image/png")
    await src.append_entries("s", [_message(part)])
    result = await copy_sessions(src, dst)
    assert result.blobs == 1
    assert await open_blob(dst, "s", part) == MARKER
    assert all(MARKER not in d for d, _ in dst_inner._blobs.values())


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s59_marker_in_a_blob_is_in_no_file_on_disk(tmp_path: Path, kind: str) -> None:
    where = tmp_path / "data"
    where.mkdir()
    inner: Store = FileStore(where) if kind == "file" else SQLiteStore(where / "s.db")
    store = _sealed(tmp_path, inner, subject="someone")
    await store.create_session(SessionRecord(id="s"))
    data = MARKER * 3000 + bytes(range(256))
    part = await attach(store, "s", data, media_type="image/png", name="passport.png")
    await store.append_entries("s", [_message(part)])
    await attach(store, "s", data, media_type="image/png")  # dedupe: the touch only
    assert await open_blob(store, "s", part) == data
    _nowhere_on_disk(tmp_path, part)  # the SQLite WAL still open
    await inner.close()  # type: ignore[attr-defined]
    _nowhere_on_disk(tmp_path, part)  # and checkpointed into the database


def _nowhere_on_disk(root: Path, part: BlobPart) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) > 2
    for path in files:
        content = path.read_bytes()
        for needle in (MARKER, MARKER[:16], part.sha256.encode(), b"passport.png"):
            assert needle not in content, (path, needle)


async def test_s59_migrating_a_plaintext_session_seals_its_blobs(tmp_path: Path) -> None:
    from threadline.privacy import migrate_session

    inner = FileStore(tmp_path / "files")
    await inner.create_session(SessionRecord(id="old"))
    part = await attach(inner, "old", MARKER * 100, media_type="image/png")
    await inner.append_entries("old", [_message(part)])
    store = EncryptedStore(inner, Keyring(tmp_path / "keyring", KEK), plaintext="read")
    # In migration mode the plaintext blob opens, and the collector keeps it.
    assert await open_blob(store, "old", part) == MARKER * 100
    assert (await collect_garbage(store, grace=timedelta(0))).deleted == []
    assert await migrate_session(store, "old") == 1
    assert await open_blob(store, "old", part) == MARKER * 100
    assert (await collect_garbage(store, grace=timedelta(0))).deleted == []  # still careful
    # Out of migration mode the plaintext copy is referenced by nothing: it goes.
    store = EncryptedStore(inner, Keyring(tmp_path / "keyring", KEK))
    report = await collect_garbage(store, grace=timedelta(0))
    assert report.deleted == [part.sha256] and report.referenced == 1
    for path in (tmp_path / "files").rglob("*"):
        assert not path.is_file() or MARKER not in path.read_bytes(), path
    assert await open_blob(store, "old", part) == MARKER * 100
