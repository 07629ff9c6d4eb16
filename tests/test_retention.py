"""Retention (S69, S70): policies that never break a path, applied while writers append.

S69: after pruning, every leaf of every session loads, crash repair opens it,
and its context is accepted by the OpenAI and Anthropic wire-format servers;
no acknowledged entry of a live session is lost. S70: the file store rewrites
a session atomically under the lock its appends take, the SQL stores delete in
bounded transactions under theirs; 8 writer processes append throughout, and a
prune killed with SIGKILL leaves every session loadable.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from support.providers import anthropic_text_turn, chunk
from support.stores import StoreSpec, close, make_spec
from support.wire_server import WireServer, sse_data, sse_reply
from threadline import durable
from threadline.ai import (
    AssistantMessage,
    DoneEvent,
    ModelInfo,
    Request,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai.providers import AnthropicModel, OpenAIChatModel
from threadline.errors import ConfigError, SessionNotFound
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider, RetentionPolicy, prune
from threadline.privacy._retention import plan
from threadline.session import (
    CompactionEntry,
    Entry,
    MessageEntry,
    SessionRecord,
    TreeIndex,
    build_context,
)
from threadline.stores import Cut, FileStore, PrunableStore, Store
from threadline.testing import assert_valid_for_providers

HERE = Path(__file__).resolve().parent
NOW = datetime.now(UTC).replace(microsecond=0)  # the command prunes as of its own now
OLD = NOW - timedelta(days=60)
POLICY = RetentionPolicy(idle_sessions=timedelta(days=30), side_branches=timedelta(days=30),
                         fold_compacted=True)


def msg(text: str, parent: Entry | None = None, at: datetime = OLD) -> MessageEntry:
    return MessageEntry(parent_id=None if parent is None else parent.id,
                        message=UserMessage.of(text), timestamp=at)


def reply(text: str, parent: Entry, at: datetime = OLD, *calls: ToolCall) -> MessageEntry:
    return MessageEntry(parent_id=parent.id, timestamp=at,
                        message=AssistantMessage(content=(TextPart(text=text), *calls)))


def result(call: ToolCall, parent: Entry, at: datetime = OLD) -> MessageEntry:
    return MessageEntry(parent_id=parent.id, timestamp=at, message=ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=(TextPart(text="sunny"),)))


def tree_session() -> tuple[list[Entry], dict[str, Entry]]:
    """A session with every shape retention meets, in append order.

    root -> q1 -> a1(call) -> r1 -> q2 -> a2 ... compaction(first kept q3) -> q4 -> a4(call,
    no result: a crash mid-tool). Off the path: an old branch from q1 (with its own
    tool pair), a new branch from q2 (a live writer's), an old branch from q4.
    """
    call1 = ToolCall(id="c1", name="weather", arguments={"city": "Oslo"})
    call2 = ToolCall(id="c2", name="weather", arguments={"city": "Rome"})
    call4 = ToolCall(id="c4", name="weather", arguments={"city": "Lima"})
    root = msg("root")
    q1 = msg("q1", root)
    old_side = reply("old side", q1, OLD, call2)
    old_side_r = result(call2, old_side)
    a1 = reply("a1", q1, OLD, call1)
    r1 = result(call1, a1)
    q2 = msg("q2", r1)
    new_side = msg("new side", q2, NOW - timedelta(hours=1))
    a2 = reply("a2", q2)
    q3 = msg("q3", a2)
    a3 = reply("a3", q3)
    comp = CompactionEntry(parent_id=a3.id, summary="they talked about weather",
                           first_kept_entry_id=q3.id, timestamp=NOW - timedelta(days=1))
    q4 = msg("q4", comp, NOW - timedelta(hours=2))
    old_tail = msg("old tail", q4, OLD)
    a4 = reply("a4", q4, NOW - timedelta(minutes=5), call4)
    order = [root, q1, old_side, old_side_r, a1, r1, q2, new_side, a2, q3, a3, comp, q4,
             old_tail, a4]
    names = ["root", "q1", "old_side", "old_side_r", "a1", "r1", "q2", "new_side", "a2", "q3",
             "a3", "comp", "q4", "old_tail", "a4"]
    return order, dict(zip(names, order, strict=True))


# -- the plan, pure ---------------------------------------------------------------------


def test_s69_plan_takes_old_branches_whole_and_keeps_the_paths_they_hang_from() -> None:
    entries, e = tree_session()
    p = plan(SessionRecord(id="s", created_at=OLD), entries,
             RetentionPolicy(side_branches=timedelta(days=30)), NOW)
    # Children before parents: every prefix leaves the rest of the branch whole.
    assert p.branches == (e["old_tail"].id, e["old_side_r"].id, e["old_side"].id)
    assert not p.expire and not p.folded


def test_s69_plan_folds_up_to_the_first_kept_entry_but_not_above_a_live_branch() -> None:
    entries, e = tree_session()
    record = SessionRecord(id="s", created_at=OLD)
    fold = RetentionPolicy(fold_compacted=True)
    # The new branch hangs from q2: q2 and everything above it stay.
    assert plan(record, entries, fold, NOW).folded == (e["a2"].id,)
    # With the old branch from q1 taken too, still only below q2.
    both = RetentionPolicy(fold_compacted=True, side_branches=timedelta(days=30))
    assert plan(record, entries, both, NOW).folded == (e["a2"].id,)
    # Without the new branch, everything before q3 goes, root first, once the
    # old branch goes with it.
    without = [x for x in entries if x is not e["new_side"]]
    assert plan(record, without, both, NOW).folded == tuple(
        e[n].id for n in ("root", "q1", "a1", "r1", "q2", "a2"))
    # Keeping the old branch from q1 keeps q1 and the root.
    assert plan(record, without, fold, NOW).folded == tuple(
        e[n].id for n in ("a1", "r1", "q2", "a2"))


def test_s69_plan_every_prefix_of_a_cut_keeps_every_path_and_the_context() -> None:
    entries, e = tree_session()
    record = SessionRecord(id="s", created_at=OLD)
    without = [x for x in entries if x is not e["new_side"]]
    cut = plan(record, without, POLICY, NOW, may_expire=False).cut
    before = build_context(TreeIndex(without).path())
    for n in range(len(cut.entries) + 1):
        gone = set(cut.entries[:n])
        left = [x for x in without if x.id not in gone]
        tree = TreeIndex(left)
        assert tree.leaf_id == e["a4"].id  # the last appended entry is never taken
        for leaf in tree.leaves():
            assert_valid_for_providers(build_context(tree.path(leaf.id)))
        assert build_context(tree.path()) == before  # folding changes nothing the model sees


def test_s69_plan_idle_sessions_expire_whole_unless_a_fork_points_at_them() -> None:
    entries, _ = tree_session()
    record = SessionRecord(id="s", created_at=OLD)
    idle = RetentionPolicy(idle_sessions=timedelta(minutes=1))
    assert plan(record, entries, idle, NOW).expire
    assert not plan(record, entries, idle, NOW, may_expire=False).expire
    assert not plan(record, entries, RetentionPolicy(idle_sessions=timedelta(days=1)), NOW).expire
    assert plan(SessionRecord(id="e", created_at=OLD), [], idle, NOW).expire


def test_s69_plan_an_entry_without_a_time_keeps_its_branch() -> None:
    from threadline.session import OpaqueEntry

    root = msg("root")
    odd = OpaqueEntry(type="future", id="x", parent_id=root.id, timestamp=None,
                      raw=b'{"type":"future","id":"x","parent_id":"' + root.id.encode() + b'"}')
    old = msg("old", root)
    leaf = msg("leaf", old, NOW)
    p = plan(SessionRecord(id="s", created_at=OLD), [root, odd, old, leaf],
             RetentionPolicy(side_branches=timedelta(days=1)), NOW)
    assert p.branches == ()


def test_retention_policy_parse_and_refusals() -> None:
    p = RetentionPolicy.parse("idle=90d, branches=12h,fold,fork-parents=release")
    assert p == RetentionPolicy(idle_sessions=timedelta(days=90),
                                side_branches=timedelta(hours=12), fold_compacted=True,
                                fork_parents="release")
    assert RetentionPolicy.parse(str(p)) == p
    for bad in ("", "idle", "idle=9x", "branches=-1d", "fold=yes", "keep=1d",
                "fork-parents=maybe", "idle=\x1b[31m1d"):
        with pytest.raises(ConfigError):
            RetentionPolicy.parse(bad)
    with pytest.raises(ConfigError):
        RetentionPolicy(idle_sessions=timedelta(0))


# -- against the stores --------------------------------------------------------------------


@pytest.fixture(params=["file", "sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    return make_spec(request.param, tmp_path, request)


async def seed(store: Store) -> dict[str, Entry]:
    entries, e = tree_session()
    await store.create_session(SessionRecord(id="tree", created_at=OLD))
    for entry in entries:  # one append each: one line, one row
        await store.append_entries("tree", [entry])
    await store.create_session(SessionRecord(id="idle", created_at=OLD))
    await store.append_entries("idle", [msg("hello")])
    await store.create_session(SessionRecord(id="idle-parent", created_at=OLD))
    await store.append_entries("idle-parent", [msg("source")])
    await store.create_session(SessionRecord(id="fork", parent_id="idle-parent",
                                             created_at=OLD))
    await store.append_entries("fork", [msg("fork", None, NOW)])
    return e


async def accepted_by_providers(context: list[Any]) -> None:
    """Send ``context`` to the OpenAI and Anthropic wire servers; both must answer."""
    assert_valid_for_providers(context)
    request = Request(messages=tuple(context), system="be brief")
    async with WireServer() as srv:
        srv.reply(sse_reply(sse_data([chunk({"role": "assistant", "content": "ok"}),
                                      chunk({}, finish="stop")])), anthropic_text_turn("ok"))
        models = [OpenAIChatModel(ModelInfo(provider="openai", id="gpt-test"), api_key="k",
                                  base_url=srv.url + "/v1", max_retries=0),
                  AnthropicModel(ModelInfo(provider="anthropic", id="claude-test"),
                                 api_key="k", base_url=srv.url, max_retries=0)]
        try:
            for model in models:
                events = [ev async for ev in model.stream(request)]
                assert isinstance(events[-1], DoneEvent), events[-1]
        finally:
            for model in models:
                await model.aclose()
    chat, messages = srv.received[0].body["messages"], srv.received[1].body["messages"]
    assert chat[0] == {"role": "system", "content": "be brief"}
    assert len(chat) >= len(context) + 1 and messages[0]["role"] == "user"


async def walk_every_leaf(store: Store, session_id: str) -> int:
    """Open the session (crash repair included) and check every leaf's context."""
    agent = await durable.open(None, store=store, session_id=session_id)
    leaves = agent.tree.leaves()
    for leaf in leaves:
        agent.branch(leaf.id)
        path = agent.path()
        assert path[-1].id == leaf.id
        await accepted_by_providers(agent.messages())
    return len(leaves)


async def test_s69_after_pruning_every_leaf_loads_and_the_providers_accept_it(
        spec: StoreSpec) -> None:
    store = spec.open()
    try:
        e = await seed(store)
        assert isinstance(store, PrunableStore)
        dry = await prune(store, POLICY, now=NOW, dry_run=True)
        report = await prune(store, POLICY, now=NOW, batch=2)
        assert report.sessions_deleted == dry.sessions_deleted == ["idle"]
        assert report.fork_parents_kept == ["idle-parent"]
        assert report.branch_entries == dry.branch_entries == {"tree": 3}
        assert report.folded_entries == {"tree": 1}  # the new branch holds q2 in place
        assert report.entries_removed == 4 and report.sessions_seen == 4
        with pytest.raises(SessionNotFound):
            await store.load_entries("idle")
        left = {x.id for x in await store.load_entries("tree")}
        taken = {e[n].id for n in ("old_side", "old_side_r", "old_tail", "a2")}
        assert left == {x.id for x in e.values()} - taken
        for sid in ("tree", "idle-parent", "fork"):
            assert await walk_every_leaf(store, sid) >= 1
        # Crash repair answered the call a4 left open, on the pruned path.
        tree = TreeIndex(await store.load_entries("tree"))
        assert any(isinstance(x, MessageEntry) and isinstance(x.message, ToolResultMessage)
                   and x.message.tool_call_id == "c4" for x in tree.path())
        # Again: nothing more to take; then release fork parents.
        again = await prune(store, POLICY, now=NOW)
        assert again.entries_removed == 0 and again.sessions_deleted == []
        released = RetentionPolicy(idle_sessions=timedelta(days=30), fork_parents="release")
        assert (await prune(store, released, now=NOW)).sessions_deleted == ["idle-parent"]
        fork = await store.load_session("fork")  # type: ignore[attr-defined]
        assert fork.parent_id == "idle-parent"  # the record still names it (S6)
        assert await walk_every_leaf(store, "fork") == 1
    finally:
        await close(store)


async def test_s69_pruning_through_encryption_opens_compactions_to_fold(
        tmp_path: Path) -> None:
    keys = Keyring(tmp_path / "keys", LocalKeyProvider.from_text(LocalKeyProvider.generate()))
    store = EncryptedStore(FileStore(tmp_path / "s"), keys)
    try:
        entries, e = tree_session()
        entries = [x for x in entries if x is not e["new_side"]]
        await store.create_session(SessionRecord(id="tree", created_at=OLD))
        await store.append_entries("tree", entries)
        report = await prune(store, POLICY, now=NOW)
        assert report.folded_entries == {"tree": 6} and report.branch_entries == {"tree": 3}
        raw = await store.inner.load_entries("tree")
        assert all(type(x).__name__ == "SealedEntry" for x in raw)
        assert await walk_every_leaf(store, "tree") == 1
    finally:
        await store.close()


async def test_s70_a_watcher_follows_a_file_session_across_a_prune(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    entries, e = tree_session()
    await store.create_session(SessionRecord(id="tree", created_at=OLD))
    await store.append_entries("tree", entries)
    got: list[str] = []
    watch = store.watch("tree")
    async for entry in watch:
        got.append(entry.id)
        if len(got) == len(entries):
            break
    assert (await prune(store, POLICY, now=NOW)).entries_removed == 4
    later = msg("after the prune", e["a4"], NOW)
    await store.append_entries("tree", [later])
    assert (await asyncio.wait_for(watch.__anext__(), 10)).id == later.id
    await watch.aclose()


async def test_prune_refuses_a_store_that_cannot(tmp_path: Path) -> None:
    from threadline.stores import MemoryStore

    with pytest.raises(ConfigError, match="prune_session"):
        await prune(MemoryStore(), POLICY)
    assert (await prune(MemoryStore(), POLICY, dry_run=True)).sessions_seen == 0
    with pytest.raises(SessionNotFound):
        await FileStore(tmp_path / "s").prune_session("nope", lambda r, x: Cut(session=True))


# -- concurrency and kill -9 -----------------------------------------------------------------


def child(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.Popen([sys.executable, str(HERE / "retention_child.py"), *argv],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def seed_old_branches(store: Store, sid: str, branches: int, length: int) -> Entry:
    """A session whose active path is one new entry, with many old side branches."""
    root = msg("root", None, OLD)
    await store.create_session(SessionRecord(id=sid, created_at=OLD))
    await store.append_entries(sid, [root])
    for b in range(branches):
        chain: list[Entry] = []
        parent: Entry = root
        for k in range(length):
            parent = msg(f"old {b}.{k}", parent)
            chain.append(parent)
        await store.append_entries(sid, chain)
    head = msg("head", root, datetime.now(UTC))
    await store.append_entries(sid, [head])
    return head


def check_acks(entries: list[Entry], ack_files: list[Path]) -> int:
    ids = {x.id for x in entries}
    acked = [line for f in ack_files if f.exists() for line in f.read_text().split()]
    missing = [a for a in acked if a not in ids]
    assert not missing, f"{len(missing)} acknowledged entries lost"
    return len(acked)


def check_walkable(entries: list[Entry]) -> None:
    tree = TreeIndex(entries)
    for leaf in tree.leaves():
        assert_valid_for_providers(build_context(tree.path(leaf.id)))


async def test_s70_pruning_under_8_concurrent_writer_processes(spec: StoreSpec,
                                                               tmp_path: Path) -> None:
    store = spec.open()
    try:
        heads = [await seed_old_branches(store, f"s{n}", 20, 10) for n in range(2)]
        acks = [tmp_path / f"acks-{w}" for w in range(8)]
        writers = [child("writer", *spec.as_argv(), f"s{w % 2}", heads[w % 2].id, "40",
                         str(acks[w])) for w in range(8)]
        policy = RetentionPolicy(side_branches=timedelta(days=30))
        removed = 0
        while any(w.poll() is None for w in writers):
            removed += (await prune(store, policy, batch=7)).entries_removed
        for w in writers:
            _, err = w.communicate(timeout=120)
            assert w.returncode == 0, err
        removed += (await prune(store, policy, batch=7)).entries_removed
        assert removed == 2 * 20 * 10
        acked = 0
        for n in range(2):
            entries = list(await store.load_entries(f"s{n}"))
            acked += check_acks(entries, acks[n::2])
            assert not any(isinstance(x, MessageEntry) and x.message.text.startswith("old ")
                           for x in entries)  # type: ignore[union-attr]
            check_walkable(entries)
        assert acked == 8 * 40
    finally:
        await close(store)


async def test_s70_a_prune_killed_mid_way_leaves_every_session_loadable(
        spec: StoreSpec, tmp_path: Path) -> None:
    store = spec.open()
    rng = random.Random(7)
    interrupted = killed = 0
    try:
        for attempt in range(6):
            sid = f"k{attempt}"
            head = await seed_old_branches(store, sid, 60, 25)
            acks = tmp_path / f"acks-{attempt}"
            writer = child("writer", *spec.as_argv(), sid, head.id, "30", str(acks))
            pruner = child("pruner", *spec.as_argv(), "branches=30d", "once")
            assert pruner.stdout is not None
            assert pruner.stdout.readline() == "pruning\n"
            await asyncio.sleep(rng.uniform(0.0, 0.25))
            os.kill(pruner.pid, signal.SIGKILL)
            killed += pruner.wait(timeout=60) == -signal.SIGKILL
            _, err = writer.communicate(timeout=120)
            assert writer.returncode == 0, err
            entries = list(await store.load_entries(sid))
            assert check_acks(entries, [acks]) == 30
            check_walkable(entries)
            if spec.kind == "file":  # one rename: all of them or none
                assert len(entries) - 32 in (0, 60 * 25)
            interrupted += 0 < len(entries) - 32 < 60 * 25
            # What the killed prune left is finished by the next.
            await prune(store, RetentionPolicy(side_branches=timedelta(days=30)))
            entries = list(await store.load_entries(sid))
            assert len(entries) == 2 + 30
            check_acks(entries, [acks])
        assert killed, "no prune was killed before it finished"
        if spec.kind != "file":
            assert interrupted, "no kill landed between two of a prune's transactions"
        if spec.kind == "file":
            assert not [n for n in os.listdir(spec.location) if n.endswith(".prune")]
    finally:
        await close(store)


# -- the command ---------------------------------------------------------------------------


def test_s69_threadline_prune_shows_then_removes(tmp_path: Path) -> None:
    from support.cli import tl

    hostile = "evil\x1b[2J\u202eid"

    async def build() -> None:
        store = FileStore(tmp_path / "s")
        await seed(store)
        await store.create_session(SessionRecord(id=hostile, created_at=OLD))

    asyncio.run(build())
    where = ["--store", str(tmp_path / "s")]
    policy = "idle=30d,branches=30d,fold"
    dry = tl(*where, "prune", "--policy", policy, "--dry-run").stdout
    assert "would delete session idle (idle)" in dry
    assert "would drop 3 entries of old side branches from tree" in dry
    assert "\x1b" not in dry and "\u202e" not in dry and "evil\\x1b[2J\\u202eid" in dry
    assert "keep idle session idle-parent: a session was forked from it" in dry
    listed = tl(*where, "list", "--json").stdout
    assert '"idle"' in listed  # a dry run removes nothing
    refused = tl(*where, "prune", "--policy", policy, check=False, input="")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    done = json.loads(tl(*where, "prune", "--policy", policy, "--yes", "--json").stdout)
    assert done["dry_run"] is False and sorted(done["sessions_deleted"]) == sorted(
        ["idle", hostile])
    assert done["branch_entries"] == {"tree": 3} and done["entries_removed"] >= 3
    bad = tl(*where, "prune", "--policy", "keep=forever", check=False)
    assert bad.returncode != 0 and "not a retention rule" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_s69_plan_reads_the_leaf_as_the_tree_index_does() -> None:
    root = msg("root")
    live = msg("live", root, NOW)
    old = msg("old", root)
    # A line repeated at the end (an idempotent copy retried) does not move the leaf.
    entries: list[Entry] = [root, old, live, old]
    assert TreeIndex(entries).leaf_id == live.id
    p = plan(SessionRecord(id="s", created_at=OLD), entries,
             RetentionPolicy(side_branches=timedelta(days=1)), NOW)
    assert p.branches == (old.id,)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_s70_sql_stores_delete_at_most_batch_entries_a_transaction(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = make_spec(kind, tmp_path, request).open()
    try:
        head = await seed_old_branches(store, "b", 5, 4)  # 20 old entries
        seen: list[int] = []

        def choose(record: SessionRecord, entries: Any) -> Cut:
            seen.append(len(entries))
            return plan(record, entries, RetentionPolicy(side_branches=timedelta(days=30)),
                        datetime.now(UTC)).cut

        cut = await store.prune_session("b", choose, batch=3)  # type: ignore[attr-defined]
        assert len(cut.entries) == 20
        # Decided again for each transaction, each removing at most 3.
        assert seen == [22 - 3 * k for k in range(7)]
        assert [x.id for x in await store.load_entries("b")][-1] == head.id
        with pytest.raises(ConfigError):
            await store.prune_session("b", choose, batch=0)  # type: ignore[attr-defined]
    finally:
        await close(store)
