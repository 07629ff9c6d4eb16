"""Power cuts during attach-then-append on the file store: no entry outlives its blob (S57).

A child process, recorded by ``PowerLoss``, attaches blobs and appends the
entries that reference them; every state a power cut at any point could
leave is rebuilt and checked: each acknowledged attach has its bytes, and
every entry the log holds (acknowledged or not) opens its blob intact.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from threadline.errors import ThreadlineError
from threadline.stores import FileStore, open_blob
from threadline.stores._blobs import blob_parts
from threadline.testing import CrashState, PowerLoss

_COUNT = 5

_WORKLOAD = """
import asyncio, json, sys
from threadline.ai._messages import TextPart, UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.stores import FileStore, attach
from threadline.testing import mark_acknowledged

async def main(root, count):
    store = FileStore(root)
    await store.create_session(SessionRecord(id="s"))
    parent = None
    for n in range(count):
        data = bytes([n]) * (3000 + 700 * n)
        part = await attach(store, "s", data, media_type="image/png")
        mark_acknowledged(json.dumps({"attached": part.sha256, "size": part.size}))
        entry = MessageEntry(id=f"e{n}", parent_id=parent, message=UserMessage(
            content=(TextPart(text=f"image {n}"), part)))
        await store.append_entries("s", [entry])
        mark_acknowledged(json.dumps({"appended": entry.id}))
        parent = entry.id
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _blob(n: int) -> bytes:
    return bytes([n]) * (3000 + 700 * n)


async def _check(state: CrashState, where: Path) -> None:
    store = FileStore(where, create=False) if (where / "s.jsonl").exists() else None
    for note in map(json.loads, state.acknowledged):
        if "attached" in note:
            path = where / "blobs" / note["attached"][:2] / note["attached"]
            assert path.exists(), f"attach of {note['attached']} acknowledged, bytes lost"
            assert hashlib.sha256(path.read_bytes()).hexdigest() == note["attached"]
    acked = {n["appended"] for n in map(json.loads, state.acknowledged) if "appended" in n}
    if store is None:
        assert not acked
        return
    try:
        entries = await store.load_entries("s")
    except ThreadlineError as exc:
        if acked:
            raise AssertionError(f"acknowledged entries {sorted(acked)} unreadable") from exc
        return
    assert acked <= {e.id for e in entries}
    for entry in entries:  # acknowledged or not: an entry on disk has its blob
        for part in blob_parts([entry]):
            assert await open_blob(store, "s", part, entry_id=entry.id) is not None


@pytest.mark.skipif(sys.platform != "linux", reason="power-loss recording needs Linux")
async def test_s57_powerloss_no_entry_outlives_its_blob(tmp_path: Path) -> None:
    root = tmp_path / "store"
    # Folders made before the recording count as durable (the recorder follows files).
    for n in range(_COUNT):
        key = hashlib.sha256(_blob(n)).hexdigest()
        (root / "blobs" / key[:2]).mkdir(parents=True, exist_ok=True)
    recorder = PowerLoss(root)
    done = recorder.run([sys.executable, "-c", _WORKLOAD, str(recorder.directory), str(_COUNT)])
    assert done.returncode == 0, done.stderr
    report = await recorder.trace().check(_check, model="reordering", per_cut=24)
    assert report.checked >= 30, report
