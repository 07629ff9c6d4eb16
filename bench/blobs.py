"""Attachments beside the log: opening, log size, forks and appends with images, same run.

A session of 200 realistic messages, 50 of them user messages with a 2 MB
image, on the file store (fsync), three ways: text only, images as blobs
(``stores.attach``, a ``BlobPart`` in the entry), and images inline as
base64 ``ImagePart`` (how sessions held them before):

- open: a new store handle and ``load_entries``, blobs over text only, the
  median of paired turns; goal 1.2x. Inline over text only is shown beside;
- log: the session file's bytes, blobs over text only; goal 1.05x;
- fork: the image bytes a fork writes (the child references the parent's
  blobs); goal 0;
- append: ``attach`` of a new 2 MB image then ``append_entries`` of the
  message holding it, against a bare write and ``fdatasync`` of the image
  into a new file plus a write and ``fdatasync`` of the entry's line; goal 1.5x.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from pathlib import Path

from bench._harness import Run, alternate, at_most, ms
from bench._targets import FileStore, MessageEntry, SessionRecord, Store
from bench._workloads import realistic
from threadline.ai import ImagePart, UserMessage
from threadline.session import encode_entry
from threadline.stores import attach

NEEDS = ()
MINUTES = 2

_MESSAGES = 200


def _with_images(entries: list[MessageEntry], images: list[bytes], how: str,
                 parts: list[object]) -> list[MessageEntry]:
    """``entries`` with an image added to each user message, up to the number of images."""
    out: list[MessageEntry] = []
    parent: str | None = None
    n = 0
    for entry in entries:
        message = entry.message
        if how != "text" and isinstance(message, UserMessage) and n < len(images):
            extra = (parts[n] if how == "blobs" else
                     ImagePart(data=base64.b64encode(images[n]).decode(), mime_type="image/png"))
            message = UserMessage(content=(*message.content, extra))  # type: ignore[arg-type]
            n += 1
        out.append(MessageEntry(parent_id=parent, message=message))
        parent = out[-1].id
    assert how == "text" or n == len(images), n
    return out


async def _build(run: Run, root: Path, how: str, images: list[bytes]) -> list[MessageEntry]:
    store = FileStore(root)
    await store.create_session(SessionRecord(id="s"))
    parts: list[object] = []
    if how == "blobs":
        parts = [await attach(store, "s", image, media_type="image/png") for image in images]
    entries = _with_images(realistic(_MESSAGES, seed=5), images, how, parts)
    await store.append_entries("s", entries)
    await store.close()
    return entries


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def opens_and_sizes(run: Run) -> None:
    count, size = run.pick((50, 2 << 20), (50, 200_000))
    turns = run.pick(9, 3)
    images = [os.urandom(size) for _ in range(count)]
    roots = {how: run.tmp / f"open-{how}" for how in ("text", "blobs", "inline")}
    built = {how: asyncio.run(_build(run, root, how, images)) for how, root in roots.items()}

    def way(how: str) -> Callable[[], object]:
        async def open_() -> None:
            store = FileStore(roots[how])
            assert len(await store.load_entries("s")) == _MESSAGES
            await store.close()
        return open_

    got = asyncio.run(alternate({how: way(how) for how in roots}, turns, collect=True))
    label = f"{_MESSAGES} messages with {count} images of {size / 1e6:g} MB"
    run.row(f"open a session of {label}, images as blobs", ms(got.median("blobs")), "ms",
            versus="the same session without the images", versus_value=ms(got.median("text")),
            ratio=got.paired("blobs", "text"), goal=at_most(1.2),
            detail=f"median of {turns} paired turns; a new handle and load_entries each")
    run.row(f"open a session of {label}, images inline (base64, as before)",
            ms(got.median("inline")), "ms", versus="the same session without the images",
            versus_value=ms(got.median("text")), ratio=got.paired("inline", "text"),
            detail="the peer: what every load, fork and copy carried")
    logs = {how: (root / "s.jsonl").stat().st_size for how, root in roots.items()}
    run.row(f"session log of {label}, images as blobs", logs["blobs"] / 1e3, "kB",
            versus="the text-only log", versus_value=logs["text"] / 1e3, goal=at_most(1.05),
            detail=f"blobs beside it: {_dir_bytes(roots['blobs'] / 'blobs') / 1e6:.1f} MB once; "
                   f"inline the log is {logs['inline'] / logs['text']:.0f}× the text")
    asyncio.run(fork(run, roots["blobs"], built["blobs"], label))


async def fork(run: Run, root: Path, entries: list[MessageEntry], label: str) -> None:
    """A fork as ``DurableAgent.fork`` stores one: a child session holding copies of the path."""
    store = FileStore(root)
    before = _dir_bytes(root / "blobs")
    await store.create_session(SessionRecord(id="child", parent_id="s"))
    copies: list[MessageEntry] = []
    for entry in entries:
        copies.append(MessageEntry(parent_id=copies[-1].id if copies else None,
                                   message=entry.message, origin_id=entry.id))
    await store.append_entries("child", copies)
    written = _dir_bytes(root / "blobs") - before
    child_log = (root / "child.jsonl").stat().st_size
    await store.close()
    run.row(f"image bytes a fork of a session of {label} writes", written, "bytes",
            goal=at_most(0, on="value"),
            detail=f"the child's log: {child_log / 1e3:.0f} kB of references and text")


def appends(run: Run) -> None:
    samples = run.pick(30, 5)
    size = 2 << 20
    root = run.tmp / "append"
    bare = run.tmp / "append-bare"
    bare.mkdir(parents=True)
    turn: dict[str, object] = {}
    line = encode_entry(MessageEntry(message=UserMessage.of("here is the screenshot")))

    def before(k: int) -> None:
        turn["image"] = os.urandom(size)  # new bytes each turn: nothing to deduplicate
        turn["k"] = k

    async def go() -> None:
        store: Store = FileStore(root)
        await store.create_session(SessionRecord(id="s"))
        parent: dict[str, str | None] = {"id": None}

        async def with_blob() -> None:
            image = turn["image"]
            assert isinstance(image, bytes)
            part = await attach(store, "s", image, media_type="image/png")
            entry = MessageEntry(parent_id=parent["id"], message=UserMessage(
                content=(*UserMessage.of("here is the screenshot").content, part)))
            await store.append_entries("s", [entry])
            parent["id"] = entry.id

        def floor() -> None:
            image = turn["image"]
            assert isinstance(image, bytes)
            name = bare / f"image-{turn['k']}"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, image)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            fd = os.open(bare / "log.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line + b"\n")
                os.fdatasync(fd)
            finally:
                os.close(fd)

        async def floor_async() -> None:
            await asyncio.to_thread(floor)  # the store works on a thread too

        got = await alternate({"blob": with_blob, "floor": floor_async}, samples, before=before)
        await store.close()  # type: ignore[attr-defined]
        run.row("append of a message with a new 2 MB image (attach, then append)",
                ms(got.median("blob")), "ms",
                versus="a bare write+fdatasync of the image and of the entry's line",
                versus_value=ms(got.median("floor")), ratio=got.paired("blob", "floor"),
                goal=at_most(1.5), detail=f"median of {samples} paired turns")

    asyncio.run(go())


def main(run: Run) -> None:
    run.say("open, log size and fork")
    opens_and_sizes(run)
    run.say("append with an image")
    appends(run)
