"""Encryption at rest: the same store with and without ``EncryptedStore``, in the same run.

Realistic entries (user prompts, assistant messages with thinking, text and
a tool call, tool results), on the file store (fsync) and on SQLite; each
store sealed by a local key-encryption key, its keyring in the same folder:

- append: one entry per ``append_entries`` to a session of 1,000 entries,
  encrypted and plain in turns, p50 against p50; goal 1.2x;
- load: ``load_entries`` of a session of N entries on new handles (new
  keyring object too, so the data key is unwrapped again), in turns, the
  median of paired ratios; goal 1.5x;
- bytes: what the session takes on disk (the session file; the database
  file after a checkpoint), encrypted over plain; goal 1.15x. The keyring
  (one small file per subject) is named in the detail.

Rows with no goal show the trade the layer makes: the file store with
``deflate=False`` (loads faster, stores more), and the peers' workload (text
of random base64, which does not compress).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

from bench._harness import Run, alternate, at_most, ms
from bench._targets import (
    EncryptedStore,
    FileStore,
    Keyring,
    LocalKeyProvider,
    MessageEntry,
    SessionRecord,
    SQLiteStore,
    Store,
)
from bench._workloads import payload, realistic

NEEDS = ()
MINUTES = 1
KEK = LocalKeyProvider(b"threadline bench kek, 32 bytes!!")

Opener = Callable[[Path, bool], Store]


def _file(root: Path, sealed: bool) -> Store:
    store = FileStore(root / "sessions")
    return EncryptedStore(store, Keyring(root / "keyring", KEK)) if sealed else store


def _file_undeflated(root: Path, sealed: bool) -> Store:
    store = FileStore(root / "sessions")
    return (EncryptedStore(store, Keyring(root / "keyring", KEK), deflate=False) if sealed
            else store)


def _sqlite(root: Path, sealed: bool) -> Store:
    store = SQLiteStore(root / "sessions.db")
    return EncryptedStore(store, Keyring(root / "keyring", KEK)) if sealed else store


def _size(root: Path, kind: str) -> int:
    if kind == "SQLite":
        with sqlite3.connect(root / "sessions.db") as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return (root / "sessions.db").stat().st_size
    return sum(p.stat().st_size for p in (root / "sessions").glob("*.jsonl"))


def _keyring_size(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "keyring").rglob("*") if p.is_file())


async def _close(store: Store) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()


async def _fill(open_: Opener, root: Path, sealed: bool, entries: list[MessageEntry]) -> None:
    store = open_(root, sealed)
    await store.create_session(SessionRecord(id="s"))
    for start in range(0, len(entries), 1000):
        await store.append_entries("s", entries[start:start + 1000])
    await _close(store)


def appends(run: Run, kind: str, open_: Opener, samples: int) -> None:
    roots = {"sealed": run.tmp / f"append-{kind}-sealed", "plain": run.tmp / f"append-{kind}"}
    new = realistic(samples + 2, seed=99)

    async def go() -> None:
        stores: dict[str, Store] = {}
        parents: dict[str, str] = {}
        for name, root in roots.items():
            existing = realistic(1000, seed=3)
            await _fill(open_, root, name == "sealed", existing)
            stores[name] = open_(root, name == "sealed")
            parents[name] = existing[-1].id
        turn = {"k": 0}

        def before(k: int) -> None:
            turn["k"] = k + 1

        def way(name: str) -> Callable[[], object]:
            async def append() -> None:
                entry = MessageEntry(parent_id=parents[name], message=new[turn["k"]].message)
                parents[name] = entry.id
                await stores[name].append_entries("s", [entry])
            return append

        got = await alternate({name: way(name) for name in stores}, samples, before=before)
        for store in stores.values():
            await _close(store)
        run.row(f"{kind}: encrypted append p50, one realistic entry, session of 1,000",
                ms(got.median("sealed")), "ms", versus=f"the same append, {kind} unencrypted",
                versus_value=ms(got.median("plain")), goal=at_most(1.2),
                detail=f"p99 {got.pct('sealed', 0.99) / got.pct('plain', 0.99):.2f}× the plain "
                       f"p99; {samples} samples in turns")

    asyncio.run(go())


def loads(run: Run, kind: str, open_: Opener, workload: str, *, goal: bool) -> None:
    n, turns = run.pick((20_000, 7), (2_000, 2))
    entries = realistic(n) if workload == "realistic" else payload(n)
    label = kind.replace(" ", "-").replace(",", "").replace("=", "-")
    roots = {"sealed": run.tmp / f"load-{label}-{workload}-sealed",
             "plain": run.tmp / f"load-{label}-{workload}"}
    for name, root in roots.items():
        asyncio.run(_fill(open_, root, name == "sealed", entries))

    def way(name: str) -> Callable[[], object]:
        async def load() -> None:
            store = open_(roots[name], name == "sealed")
            assert len(await store.load_entries("s")) == n
            await _close(store)
        return load

    got = asyncio.run(alternate({name: way(name) for name in roots}, turns, collect=True))
    run.row(f"{kind}: encrypted load of a session of {n:,} {workload} entries",
            ms(got.median("sealed")), "ms", versus=f"the same load, {kind} unencrypted",
            versus_value=ms(got.median("plain")), ratio=got.paired("sealed", "plain"),
            goal=at_most(1.5) if goal else None,
            detail=f"median of {turns} paired turns; new handles and keyring each time")
    sealed, plain = _size(roots["sealed"], kind), _size(roots["plain"], kind)
    run.row(f"{kind}: bytes on disk of {n:,} {workload} entries, encrypted", sealed / 1e6, "MB",
            versus=f"the same entries, {kind} unencrypted", versus_value=plain / 1e6,
            goal=at_most(1.15) if goal else None,
            detail=f"besides: the keyring, {_keyring_size(roots['sealed']):,} bytes"
                   + ("; random text does not compress" if workload == "payload" else ""))


def main(run: Run) -> None:
    samples = run.pick(200, 15)
    for kind, open_ in (("file store", _file), ("SQLite", _sqlite)):
        run.say(f"{kind}: appends")
        appends(run, kind, open_, samples)
        run.say(f"{kind}: loads and bytes")
        loads(run, kind, open_, "realistic", goal=True)
    run.say("file store: without deflate, and text that does not compress")
    loads(run, "file store, deflate=False", _file_undeflated, "realistic", goal=False)
    loads(run, "file store", _file, "payload", goal=False)
