"""Session metadata (S61), listing by it (S62) and the file store's derived catalog (S63).

The conformance part (``testing/_conformance/_listing.py``) checks each store's
listing; these tests cover what goes across handles and processes: two writers,
the durable agent, a child process appending to a file store.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from support.stores import StoreSpec, close
from threadline import durable
from threadline.ai import UserMessage
from threadline.errors import ConfigError
from threadline.session import METADATA_KIND, CustomEntry, fold_metadata
from threadline.stores import CatalogStore, FileStore, load_metadata
from threadline.testing import ScriptedModel, Turn

pytestmark = pytest.mark.asyncio

_WRITER = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from support.stores import StoreSpec, close
from threadline.stores import set_metadata

async def main():
    spec = StoreSpec(*sys.argv[2:5])
    store = spec.open()
    name = sys.argv[5]
    for n in range(int(sys.argv[6])):
        await set_metadata(store, "shared", title=f"{name}-{n}", labels={name: str(n)})
    await close(store)

asyncio.run(main())
"""


async def _writers(spec: StoreSpec, names: list[str], count: int) -> None:
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WRITER, str(Path(__file__).parent), *spec.as_argv(), name,
        str(count), stderr=asyncio.subprocess.PIPE) for name in names]
    for proc in procs:
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()


async def test_s61_two_writer_processes_the_last_change_appended_wins(
    shared_store_spec: StoreSpec,
) -> None:
    store = shared_store_spec.open()
    try:
        agent = await durable.open(None, store=store, session_id="shared",
                                   metadata={"owner": "ann", "tenant": "acme"})
        await _writers(shared_store_spec, ["w1", "w2"], 15)
        entries = await store.load_entries("shared")
        changes = [e for e in entries if isinstance(e, CustomEntry) and e.kind == METADATA_KIND]
        assert len(changes) == 31
        last_title = changes[-1].data.title
        meta = fold_metadata(entries)
        assert meta.title == last_title
        assert meta.labels == {"w1": "14", "w2": "14"}
        assert (meta.owner, meta.tenant) == ("ann", "acme")
        assert isinstance(store, CatalogStore)
        [info] = (await store.list_sessions(owner="ann", order="activity")).infos
        assert info.metadata == meta
        # The writers chained every change after the last entry: one path, no branches.
        await agent.refresh()
        assert agent.metadata == meta
        assert agent.leaf_id == entries[-1].id
    finally:
        await close(store)


async def test_s61_a_branch_switch_does_not_change_the_title(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    try:
        one = await durable.open(None, store=store, session_id="s")
        [root] = await one.append(UserMessage.of("hi"))
        two = await durable.open(None, store=store, session_id="s")  # loaded the same leaf
        await one.set_metadata(title="first", labels={"k": "1"})
        await two.set_metadata(title="second")  # a sibling branch, appended later
        reopened = await durable.open(None, store=store, session_id="s")
        assert reopened.metadata.title == "second"
        assert reopened.metadata.labels == {"k": "1"}
        reopened.branch(root.id)
        assert reopened.metadata.title == "second"
        assert (await load_metadata(store, "s")).title == "second"
    finally:
        await close(store)


async def test_s61_open_with_metadata_appends_only_what_differs() -> None:
    from threadline.stores import MemoryStore

    store = MemoryStore()
    events: list[object] = []
    agent = await durable.open(None, store=store, session_id="s", publisher=events.append,
                               metadata={"title": "T", "owner": "u1", "labels": {"a": "b"}})
    assert agent.metadata.title == "T" and agent.metadata.owner == "u1"
    assert len(agent.entries) == 1
    again = await durable.open(None, store=store, session_id="s",
                               metadata={"title": "T", "labels": {"a": "b"}})
    assert len(again.entries) == 1  # nothing differed: nothing appended
    again = await durable.open(None, store=store, session_id="s",
                               metadata={"owner": "u2", "labels": {"a": None}})
    assert len(again.entries) == 2
    assert again.metadata.owner == "u2" and again.metadata.labels == {}
    await again.set_metadata(title=None)
    # S13: metadata never publishes (only the creation did).
    assert [type(e).__name__ for e in events] == ["SessionCreated"]
    with pytest.raises(ConfigError):
        await durable.open(None, store=store, session_id="s", metadata={"titel": "x"})
    with pytest.raises(ConfigError):
        await again.set_metadata(tenant="")


async def test_s61_generated_title_after_the_first_exchange() -> None:
    from threadline.stores import MemoryStore

    store = MemoryStore()
    plain = await durable.open(durable.model(ScriptedModel([Turn.text("hello")])),
                               store=store, session_id="off")
    await plain.run("hi").collect()
    assert plain.metadata.title is None  # off by default

    titler = ScriptedModel([Turn.text('  Greeting\nand   weather  ')])
    agent = await durable.open(
        durable.model(ScriptedModel([Turn.text("hello"), Turn.text("again")])),
        store=store, session_id="on", title=durable.GeneratedTitle(titler))
    await agent.run("hi, what is the weather?").collect()
    assert agent.metadata.title == "Greeting and weather"
    assert "hi, what is the weather?" in str(titler.requests[0].messages[0])
    await agent.run("more").collect()
    assert len(titler.requests) == 1  # titled once
    [info] = (await store.list_sessions(order="activity", limit=1)).infos
    assert info.id == "on" and info.title == "Greeting and weather"

    failing = await durable.open(
        durable.model(ScriptedModel([Turn.text("hello")])), store=store, session_id="bad",
        title=durable.GeneratedTitle(ScriptedModel([Turn.text("   ")])))
    await failing.run("hi").collect()  # an empty title is logged, the run stands
    assert failing.metadata.title is None


_APPENDER = """
import asyncio, sys
from threadline.stores import FileStore, set_metadata
from threadline.session import MessageEntry
from threadline.ai._messages import UserMessage

async def main():
    store = FileStore(sys.argv[1])
    await set_metadata(store, sys.argv[2], owner="bob", title="from the child")
    await store.append_entries(sys.argv[2], [MessageEntry(
        message=UserMessage.of("late"), timestamp=__import__("datetime").datetime(
            2030, 1, 1, tzinfo=__import__("datetime").UTC))])
    await store.close()

asyncio.run(main())
"""


async def test_s63_the_file_catalog_sees_another_process_append(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FileStore(root)
    for n in range(3):
        await durable.open(None, store=store, session_id=f"s{n}", metadata={"owner": "ann"})
    first = await store.list_sessions(owner="ann", order="activity")
    assert [i.id for i in first.infos] == ["s2", "s1", "s0"]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _APPENDER, str(root), "s0")
    assert await proc.wait() == 0
    # The same handle, its catalog built before the child wrote: it catches up.
    assert [i.id for i in (await store.list_sessions(owner="ann")).infos] == ["s2", "s1"]
    [moved] = (await store.list_sessions(owner="bob", order="activity")).infos
    assert (moved.id, moved.title, moved.last_activity.year) == ("s0", "from the child", 2030)
    assert (await store.list_sessions(order="activity")).infos[0].id == "s0"
    # Disposable: a new handle rebuilds the same catalog from the logs alone.
    fresh = FileStore(root)
    assert (await fresh.list_sessions(order="activity")).infos == (
        await store.list_sessions(order="activity")).infos
    # A log rewritten behind the catalog's back (the store never does) is read again
    # when the bytes the catalog saw last differ.
    path = store.path_for("s1")
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"ann"', b'"eve"'))
    [eve] = (await store.list_sessions(owner="eve")).infos
    assert eve.id == "s1"
    await store.close()
    await fresh.close()
