"""Erasure by destroying keys: it reaches every session of a subject, their forks and copies.

An erased entry keeps its place (id, parent, time, type) so the tree,
listing, branching and forking go on working; the model sees none of it.
Keyring changes are atomic: a process killed in the middle of erasing or of
rotating leaves every key whole, and the next run finishes the job.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from threadline import durable
from threadline.ai import AssistantMessage, TextPart, ToolCall, ToolResultMessage, UserMessage
from threadline.errors import SessionNotFound
from threadline.privacy import (
    EncryptedStore,
    Keyring,
    LocalKeyProvider,
    delete_with_forks,
)
from threadline.session import (
    CustomEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    SessionRecord,
    TreeIndex,
    build_context,
)
from threadline.stores import FileStore, MemoryStore, SQLiteStore, Store, copy_sessions
from threadline.testing import assert_valid_for_providers

MARKER = "MARKER-erase-5b1d"
KEK = LocalKeyProvider(b"k" * 32)
NEW_KEK = LocalKeyProvider(b"n" * 32)


def sealed(inner: Store, keyring: Path, provider: Any = KEK, **options: Any) -> EncryptedStore:
    return EncryptedStore(inner, Keyring(keyring, provider), **options)


async def say(agent: durable.DurableAgent, *texts: str) -> None:
    for text in texts:
        await agent.append(UserMessage.of(text))


# -- what an erased session still is ----------------------------------------------------


async def test_erasing_a_subject_reaches_its_sessions_and_their_forks(tmp_path: Path) -> None:
    subjects = {"a1": "user-42", "a2": "user-42", "other": "user-7"}
    store = sealed(FileStore(tmp_path / "s"), tmp_path / "k",
                   subject=lambda record: subjects.get(record.id))
    agents = {sid: await durable.open(None, store=store, session_id=sid) for sid in subjects}
    for sid, agent in agents.items():
        await say(agent, f"{MARKER} {sid}", "more")
        await agent.append(CustomEntry(kind="app.state", data={"secret": MARKER}))
    fork = await agents["a1"].fork("a1-fork")
    await say(fork, "said in the fork")
    grandchild = await fork.fork("a1-fork-fork")
    before = {sid: await store.load_entries(sid) for sid in [*subjects, "a1-fork", "a1-fork-fork"]}

    erased = await store.erase_subject("user-42")
    assert erased.versions == 1
    assert await store.keys.sessions_of(erased.key_id) == ["a1", "a1-fork", "a1-fork-fork", "a2"]
    for sid, entries in before.items():
        now = await store.load_entries(sid)
        if sid == "other":
            assert now == entries
            continue
        assert all(type(e) is ErasedEntry for e in now), sid
        assert [(e.id, e.parent_id, e.timestamp) for e in now] == [
            (e.id, e.parent_id, e.timestamp) for e in entries]
        assert [e.of for e in now] == ["message", "message", "custom", *(
            ["message"] * (len(now) - 3))]
        assert now[2].kind == "app.state"  # type: ignore[union-attr]
    # The tree, the listing, branching and forking still work; the model sees nothing.
    tree = TreeIndex(await store.load_entries("a1"), session_id="a1")
    assert tree.leaf_id == before["a1"][-1].id
    assert build_context(tree.path()) == []
    assert not [e for e in await store.load_entries("other") if type(e) is ErasedEntry]
    reopened = await durable.open(None, store=store, session_id="a1-fork")
    assert reopened.messages() == []
    reopened.branch(before["a1-fork"][1].id)
    child = await reopened.fork("after-erasure")
    assert [type(e) for e in child.entries] == [ErasedEntry, ErasedEntry]
    assert [e.origin_id for e in child.entries] == [e.id for e in before["a1-fork"][:2]]
    assert [type(e) for e in await store.load_entries("after-erasure")] == [ErasedEntry] * 2
    listed = {r.id for r in (await store.list_sessions()).sessions}  # type: ignore[attr-defined]
    assert {"a1", "a1-fork", "a1-fork-fork", "after-erasure"} <= listed
    # What the subject says from now on gets a new key and reads back.
    await say(reopened, "written after the erasure")
    assert reopened.messages() == [UserMessage.of("written after the erasure")]
    again = sealed(FileStore(tmp_path / "s"), tmp_path / "k")
    assert (await again.load_entries("a1-fork"))[-1].message.text == (  # type: ignore[union-attr]
        "written after the erasure")
    assert grandchild.session_id == "a1-fork-fork"


async def test_a_fork_keeps_its_source_subject_whoever_forks_it(tmp_path: Path) -> None:
    inner = MemoryStore()
    theirs = sealed(inner, tmp_path / "k", subject="user-42")
    mine = sealed(inner, tmp_path / "k", subject="user-43")
    source = await durable.open(None, store=theirs, session_id="theirs")
    await say(source, MARKER)
    forked = await (await durable.open(None, store=mine, session_id="theirs")).fork("mine")
    await say(forked, "said by user-43 in the fork")
    assert (await mine.erase_subject("user-43")).versions == 0  # it never had a key
    assert len(await mine.load_entries("mine")) == 2
    await mine.erase_subject("user-42")
    assert [type(e) for e in await mine.load_entries("mine")] == [ErasedEntry] * 2


async def test_copies_between_stores_are_erased_with_their_source(tmp_path: Path) -> None:
    src = sealed(FileStore(tmp_path / "files"), tmp_path / "k")
    agent = await durable.open(None, store=src, session_id="s")
    await say(agent, MARKER, "second")
    await agent.fork("s-fork")
    via_layer = sealed(SQLiteStore(tmp_path / "copy.db"), tmp_path / "k")
    raw_copy = MemoryStore()
    await copy_sessions(src, via_layer)             # opened, then sealed again
    await copy_sessions(src.inner, raw_copy)        # the sealed bytes as they are
    assert await sealed(raw_copy, tmp_path / "k").load_entries("s") == agent.entries
    assert await via_layer.load_entries("s-fork") == await src.load_entries("s-fork")
    await src.erase_subject("s")
    for store in (src, via_layer, sealed(raw_copy, tmp_path / "k")):
        for sid in ("s", "s-fork"):
            assert all(type(e) is ErasedEntry for e in await store.load_entries(sid)), sid
    await via_layer.close()


def test_the_model_view_skips_erased_content_and_keeps_tool_pairs_valid() -> None:
    call = ToolCall(id="c1", name="lookup", arguments={})
    asked = MessageEntry(message=UserMessage.of("question"))
    gone_call = ErasedEntry(parent_id=asked.id)  # an assistant message with a call, erased
    result = MessageEntry(parent_id=gone_call.id, message=ToolResultMessage(
        tool_call_id="c9", tool_name="lookup", content=(TextPart(text="orphan"),)))
    calling = MessageEntry(parent_id=result.id, message=AssistantMessage(content=(call,)))
    gone_result = ErasedEntry(parent_id=calling.id)
    after = MessageEntry(parent_id=gone_result.id, message=UserMessage.of("and now?"))
    context = build_context([asked, gone_call, result, calling, gone_result, after])
    # The orphaned result is dropped; the call whose result is gone is answered.
    assert [type(m).__name__ for m in context] == [
        "UserMessage", "AssistantMessage", "ToolResultMessage", "UserMessage"]
    assert context[2].tool_call_id == "c1" and context[2].is_error  # type: ignore[union-attr]
    assert_valid_for_providers(context)


async def test_delete_with_forks_deletes_the_whole_lineage_and_nothing_else(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "s")
    for sid, parent in (("root", None), ("child", "root"), ("grandchild", "child"),
                        ("sibling", "root"), ("unrelated", None), ("unrelated-fork", "unrelated")):
        await store.create_session(SessionRecord(id=sid, parent_id=parent))
    assert await delete_with_forks(store, "root") == ["root", "child", "sibling", "grandchild"]
    assert {r.id for r in (await store.list_sessions()).sessions} == {
        "unrelated", "unrelated-fork"}
    with pytest.raises(SessionNotFound):
        await delete_with_forks(store, "root")
    # A run stopped after the forks went but before the root: it finishes.
    await store.create_session(SessionRecord(id="again"))
    await store.create_session(SessionRecord(id="again-fork", parent_id="again"))
    await store.delete_session("again")
    assert await delete_with_forks(store, "again") == ["again-fork"]


# -- killed in the middle ---------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from threadline.privacy import Keyring, LocalKeyProvider

    action, folder, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    old, new = LocalKeyProvider(b"k" * 32), LocalKeyProvider(b"n" * 32)

    class Slow(LocalKeyProvider):
        # Says how far it got, so the parent can kill it part way.
        done = 0
        async def wrap(self, key, context):
            Slow.done += 1
            if Slow.done == count:
                os.write(1, b"halfway\\n")
                await asyncio.sleep(30)
            return await super().wrap(key, context)

    async def main():
        if action == "churn":  # new key versions and erasures, until killed
            keys = Keyring(folder, old)
            os.write(1, b"halfway\\n")
            for n in range(10**9):
                await keys.rotate_subject(f"s{n % count}")
                if n % 7 == 0:
                    await keys.erase_subject(f"s{(n // 7) % count}")
        if action == "rotate":
            await Keyring(folder, Slow(b"n" * 32), previous=[old]).rewrap()
        else:
            keys = Keyring(folder, old)
            for n in range(count):
                await keys.erase_subject(f"s{n}")
                if n == count // 2:
                    os.write(1, b"halfway\\n")
                    await asyncio.sleep(30)  # killed here, or in the erasure before
    asyncio.run(main())
""")


def _run_until_halfway_then_kill(action: str, folder: Path, count: int,
                                 after: float = 0.0) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, action, str(folder), str(count)],
                            stdout=subprocess.PIPE, env={**os.environ})
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"halfway\n", "the child never got half way"
    time.sleep(after)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


async def _filled(tmp_path: Path, sessions: int) -> tuple[EncryptedStore, dict[str, list[Entry]]]:
    store = sealed(MemoryStore(), tmp_path / "k")
    written = {}
    for n in range(sessions):
        agent = await durable.open(None, store=store, session_id=f"s{n}")
        await say(agent, f"{MARKER} {n}")
        written[agent.session_id] = agent.entries
    return store, written


async def test_a_rotation_killed_part_way_leaves_every_key_whole_and_resumes(
    tmp_path: Path,
) -> None:
    store, written = await _filled(tmp_path, 40)
    before = {sid: list(await store.inner.load_entries(sid)) for sid in written}
    _run_until_halfway_then_kill("rotate", tmp_path / "k", 20)
    keys = Keyring(tmp_path / "k", NEW_KEK, previous=[KEK])
    # Some keys are under the new key, the rest under the old; all open with both.
    files = [p for p in (tmp_path / "k" / "keys").rglob("*.json")]
    keks = {p.read_text().count(NEW_KEK.key_id) for p in files}
    assert keks == {0, 1}, "the kill did not land in the middle of the rotation"
    both = EncryptedStore(store.inner, keys)
    assert {sid: await both.load_entries(sid) for sid in written} == written
    done = await keys.rewrap()
    assert done.versions > 0 and done.unchanged > 0
    only_new = EncryptedStore(store.inner, Keyring(tmp_path / "k", NEW_KEK))
    assert {sid: await only_new.load_entries(sid) for sid in written} == written
    assert {sid: list(await store.inner.load_entries(sid)) for sid in written} == before


async def test_an_erasure_killed_part_way_leaves_each_subject_whole_or_erased(
    tmp_path: Path,
) -> None:
    store, written = await _filled(tmp_path, 30)
    _run_until_halfway_then_kill("erase", tmp_path / "k", 30)
    fresh = sealed(store.inner, tmp_path / "k")
    states = set()
    for sid, entries in written.items():
        now = await fresh.load_entries(sid)
        assert now == entries or all(type(e) is ErasedEntry for e in now), sid
        states.add(now == entries)
    assert states == {False, True}  # killed with half the subjects erased
    for stray in (tmp_path / "k").rglob("*.tmp"):
        assert b"wrapped" not in stray.read_bytes() or b'"versions":[]' in stray.read_bytes()
    for sid in written:  # the next run finishes the job
        await fresh.erase_subject(sid)
    for sid in written:
        assert all(type(e) is ErasedEntry for e in await fresh.load_entries(sid))


async def test_keyring_writes_killed_at_random_leave_every_file_whole(tmp_path: Path) -> None:
    store, written = await _filled(tmp_path, 8)
    rnd = random.Random(26)
    for _ in range(5):
        _run_until_halfway_then_kill("churn", tmp_path / "k", 8, after=rnd.uniform(0.05, 0.4))
        fresh = sealed(store.inner, tmp_path / "k")
        for key_id in fresh.keys.key_ids():  # every file decodes (a torn one would raise)
            await fresh.keys.reading_keys({(key_id, 1)})
        for sid, entries in written.items():
            now = await fresh.load_entries(sid)
            assert now == entries or all(type(e) is ErasedEntry for e in now), sid
