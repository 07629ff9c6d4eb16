"""Failed and skipped syncs of the local stores, seen from a fresh handle afterwards.

A child process runs a store under a small LD_PRELOAD shim that fails the Nth
``fdatasync``/``fsync`` of a file under the store's folder, the way a failing
disk does (SQLite's syncs are C calls, out of Python's reach). The child then
dies without closing anything; the parent opens the store afresh and checks:

- a call that raised ``DurabilityError`` stored nothing (S14), also after the
  WAL is recovered;
- a retry that finds its batch stored (S25) syncs before it succeeds: under a
  failing sync it reports the failure instead of acknowledging data that may
  be in the page cache only.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_or_skip
from threadline.ai._messages import UserMessage
from threadline.session import MessageEntry, SessionRecord
from threadline.session._codec import encode_entry
from threadline.stores import FileStore, SQLiteStore, Store

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD shim")

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int seen;

static int fails(int fd) {
    const char *dir = getenv("FAIL_SYNC_DIR"), *nth = getenv("FAIL_SYNC_NTH");
    char link[64], path[4096];
    if (!dir || !nth) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    if (strncmp(path, dir, strlen(dir)) != 0) return 0;
    return __atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST) == atoi(nth);
}

#define FAILING(name) \
    int name(int fd) { \
        static int (*real)(int); \
        if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name); \
        if (fails(fd)) { errno = EIO; return -1; } \
        return real(fd); \
    }

FAILING(fdatasync)
FAILING(fsync)
"""

# argv: kind, location, a file of batches (a JSON array of entries a line).
# Appends them in turn until one fails; prints a JSON line per call, then dies
# without closing the store.
_CHILD = r"""
import asyncio, json, os, sys
import msgspec
from threadline.errors import DurabilityError
from threadline.session import decode_entry
from threadline.stores import FileStore, SQLiteStore

kind, location, batches = sys.argv[1:4]

async def main():
    store = FileStore(location) if kind == "file" else SQLiteStore(location)
    for line in open(batches, "rb"):
        batch = [decode_entry(msgspec.json.encode(e)) for e in msgspec.json.decode(line)]
        try:
            await store.append_entries("s", batch)
            verdict = "acked"
        except DurabilityError:
            verdict = "failed"
        print(json.dumps([verdict, [e.id for e in batch]]), flush=True)
        if verdict == "failed":
            break
    os._exit(0)  # no close: a crash right after, WAL and all left as they are

asyncio.run(main())
"""


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        require_or_skip("no C compiler (cc) to build the sync-fault shim")
    assert cc is not None
    folder = tmp_path_factory.mktemp("shim")
    (folder / "shim.c").write_text(_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "shim.so"),
                    str(folder / "shim.c"), "-ldl"], check=True)
    return folder / "shim.so"


def _store(kind: str, location: Path, **kwargs: str) -> Store:
    return FileStore(location, **kwargs) if kind == "file" else SQLiteStore(  # type: ignore[arg-type]
        location, **kwargs)


def _batches(n: int, size: int = 2) -> list[list[MessageEntry]]:
    return [[MessageEntry(message=UserMessage.of(f"call {c} entry {k} " + "x" * 500))
             for k in range(size)] for c in range(n)]


async def _run_child(shim: Path, kind: str, tmp_path: Path, *, nth: int,
                     batches: list[list[MessageEntry]]) -> list[list[object]]:
    """Run ``batches`` in a child whose ``nth`` sync under the store's folder fails."""
    location, folder = _where(kind, tmp_path)
    path = tmp_path / "batches.jsonl"
    path.write_bytes(b"".join(
        json.dumps([json.loads(encode_entry(e)) for e in b]).encode() + b"\n" for b in batches))
    env = {**os.environ, "LD_PRELOAD": str(shim), "FAIL_SYNC_DIR": str(folder),
           "FAIL_SYNC_NTH": str(nth)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, kind, str(location), str(path), env=env,
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return [json.loads(line) for line in out.splitlines()]


def _where(kind: str, tmp_path: Path) -> tuple[Path, Path]:
    """The store's location and the folder its files are in."""
    folder = tmp_path / "store"
    return (folder if kind == "file" else folder / "s.db"), folder


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s44_a_batch_whose_sync_failed_is_not_there_after_a_crash_and_reopen(
        shim: Path, tmp_path: Path, kind: str) -> None:
    location, _ = _where(kind, tmp_path)
    setup = _store(kind, location)
    await setup.create_session(SessionRecord(id="s"))
    await setup.close()  # type: ignore[attr-defined]
    batches = _batches(30)
    # The 10th sync under the folder fails: an append's commit (SQLite: its
    # WAL sync inside the commit, or the WAL header's), or its fdatasync.
    lines = await _run_child(shim, kind, tmp_path, nth=10, batches=batches)
    assert lines[-1][0] == "failed", lines
    acked = [i for verdict, ids in lines if verdict == "acked" for i in ids]  # type: ignore[union-attr]
    failed = set(lines[-1][1])  # type: ignore[arg-type]
    store = _store(kind, location)  # recovers the WAL the child left behind
    stored = [e.id for e in await store.load_entries("s")]
    assert stored == acked, "the failed call's entries came back" if failed & set(stored) \
        else "an acknowledged entry is missing"
    # The store is writable again from a fresh handle.
    await store.append_entries("s", batches[-1])
    assert len(await store.load_entries("s")) == len(acked) + 2
    await store.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_s46_a_retry_found_stored_is_synced_before_it_is_acknowledged(
        shim: Path, tmp_path: Path, kind: str) -> None:
    location, _ = _where(kind, tmp_path)
    # Written by a writer that made no sync (flush durability, SQLite's
    # NORMAL): where a writer that died before its sync leaves it.
    unsynced = _store(kind, location, **({"durability": "flush"} if kind == "file"
                                         else {"synchronous": "NORMAL"}))
    await unsynced.create_session(SessionRecord(id="s"))
    batch = _batches(1)[0]
    await unsynced.append_entries("s", batch)
    await unsynced.close()  # type: ignore[attr-defined]
    # The retry of the same batch with fsync durability finds it stored. Its
    # first sync fails: acknowledging it anyway would promise what the disk
    # may not hold.
    lines = await _run_child(shim, kind, tmp_path, nth=1, batches=[batch])
    assert lines == [["failed", [e.id for e in batch]]]
    store = _store(kind, location)
    assert [e.id for e in await store.load_entries("s")] == [e.id for e in batch]
    await store.close()  # type: ignore[attr-defined]
