"""The core level: the three methods every store has (S7), and the rules they keep.

Round trips of every entry kind (S8, S9), all-or-nothing batches (S14),
foreign bytes kept (S15), nothing unreadable stored (S16), the errors, the
session-id rule (S1), handles that see each other (S4) and retries (S25).
These run for every store; their checks of an optional method run when its
capability is declared.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from threadline.ai._messages import (
    AssistantMessage,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import (
    CorruptLog,
    InvalidEntry,
    InvalidSessionId,
    SessionExists,
    SessionNotFound,
    StoreError,
)
from threadline.session._codec import MAX_DEPTH, decode_entry, encode_entry
from threadline.session._entries import (
    FORMAT_VERSION,
    CustomEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
)
from threadline.session._ids import new_id
from threadline.session._tree import TreeIndex
from threadline.stores._contract import Store
from threadline.stores._rules import MAX_SESSION_ID_BYTES
from threadline.testing._conformance._base import SuiteBase
from threadline.testing._conformance._children import append_chain, close
from threadline.testing._conformance._data import (
    INVALID_ENTRIES,
    NOTE_KIND,
    UNICODE_IDS,
    UNREGISTERED_KIND,
    ConformanceNote,
    assert_same_entries,
    at,
    chain,
    chain_entry,
    check_concurrent_log,
    nested,
    note_registered,
    sample_entries,
)
from threadline.testing._conformance._probes import (
    BAD_SESSION_IDS,
    Probes,
    session_with_one_entry,
)

__all__ = ["CoreTests"]


class CoreTests(SuiteBase):
    """Tests of ``create_session``, ``load_entries`` and ``append_entries``."""

    async def test_s7_declared_capabilities_are_offered(self, store: Store) -> None:
        # A capability declared but misnamed in the store fails here as well
        # as in its own tests; none of them skips.
        for capability in sorted(self.declared()):
            if capability == "multi_process":
                self.child_opener()
            else:
                self.require(store, capability)
        missing = [m for m in ("create_session", "load_entries", "append_entries")
                   if not callable(getattr(store, m, None))]
        assert not missing, f"{type(store).__name__} has no {', '.join(missing)}()"

    async def test_s8_round_trip_every_entry_kind(self, store: Store) -> None:
        sid = await self.new_session(store)
        with note_registered():
            entries = sample_entries()
            await store.append_entries(sid, entries)
            loaded = await store.load_entries(sid)
            assert_same_entries(loaded, entries)
        assert isinstance(loaded[6], CustomEntry)
        assert isinstance(loaded[6].data, ConformanceNote)
        assert loaded[6].data == ConformanceNote(text="registered", tags=("a", "b"), score=0.5)

    async def test_s9_unregistered_custom_kind_is_lossless(self, store: Store) -> None:
        sid = await self.new_session(store)
        raw = b'{ "x" : 1.250e1, "y":["\\u2603", {"b":null,"a":true}] }'
        entry = CustomEntry(kind=UNREGISTERED_KIND, data=msgspec.Raw(raw))
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert type(loaded) is CustomEntry
        assert loaded.kind == UNREGISTERED_KIND
        assert bytes(loaded.data) == raw
        assert encode_entry(loaded) == encode_entry(entry)

    async def test_s9_unknown_entry_type_is_written_back_unchanged(self, store: Store) -> None:
        sid = await self.new_session(store)
        raw = (
            b'{"type":"from.the.future","id":"' + new_id().encode()
            + b'","parent_id":null,"extra":{"k":[1,2.0,"\\u00e9"]},"n":  7}'
        )
        entry = decode_entry(raw)
        assert isinstance(entry, OpaqueEntry)
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert isinstance(loaded, OpaqueEntry)
        assert loaded.type == "from.the.future"
        assert encode_entry(loaded) == raw

    async def test_s8_new_session_has_no_entries(self, store: Store) -> None:
        sid = await self.new_session(store)
        assert list(await store.load_entries(sid)) == []

    async def test_s8_append_order_is_kept(self, store: Store) -> None:
        sid = await self.new_session(store)
        root = chain_entry(None, 0, 0)
        # Siblings, a late child of the root and a batch: order is append order,
        # not tree order or id order.
        batches: list[list[Entry]] = [
            [root],
            [chain_entry(root.id, 0, 1), chain_entry(root.id, 0, 2)],
            [],
            [chain_entry(root.id, 0, 3)],
        ]
        older = MessageEntry(id="00000000-0000-7000-8000-000000000000", parent_id=root.id,
                             message=UserMessage.of("an id that sorts first"))
        batches.append([older])
        for batch in batches:
            await store.append_entries(sid, batch)
        loaded = await store.load_entries(sid)
        assert_same_entries(loaded, [e for batch in batches for e in batch])

    async def test_s8_stored_data_is_not_shared_with_caller(self, store: Store) -> None:
        sid = await self.new_session(store)
        call = ToolCall(id="c", name="t", arguments={"k": "before"})
        entry = MessageEntry(message=AssistantMessage(content=(call,)))
        await store.append_entries(sid, [entry])
        call.arguments["k"] = "changed after append"
        loaded = await store.load_entries(sid)
        loaded_entry = loaded[0]
        assert isinstance(loaded_entry, MessageEntry)
        assert isinstance(loaded_entry.message, AssistantMessage)
        loaded_entry.message.tool_calls[0].arguments["k"] = "changed after load"
        loaded.clear()
        (again,) = await store.load_entries(sid)
        assert isinstance(again, MessageEntry)
        assert isinstance(again.message, AssistantMessage)
        assert again.message.tool_calls[0].arguments == {"k": "before"}

    @pytest.mark.parametrize("position", ["first", "middle", "last"])
    async def test_s14_batch_with_an_invalid_entry_appends_nothing(
        self, store: Store, position: str
    ) -> None:
        sid = await self.new_session(store)
        root = chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        good = [chain_entry(root.id, 0, n) for n in range(1, 41)]
        bad = MessageEntry(parent_id=root.id, message=UserMessage.of("lone \ud800 surrogate"))
        at = {"first": 0, "middle": 20, "last": 40}[position]
        with pytest.raises(InvalidEntry) as info:
            await store.append_entries(sid, [*good[:at], bad, *good[at:]])
        assert info.value.session_id == sid and info.value.entry_id == bad.id
        assert [e.id for e in await store.load_entries(sid)] == [root.id]
        await store.append_entries(sid, good)  # the session is not harmed
        assert len(await store.load_entries(sid)) == 41

    async def test_s15_foreign_lines_come_back_byte_for_byte(self, store: Store) -> None:
        sid = await self.new_session(store)
        ids = [new_id() for _ in range(6)]
        lines = [
            # A field this version does not know; a timestamp with two digits.
            b'{"type":"message","id":"%s","timestamp":"2025-03-01T09:30:01.12Z",'
            b'"message":{"role":"user","content":[{"type":"text","text":"hi"}]},'
            b'"mood":"curious"}' % ids[0].encode(),
            # Another key order, a +00:00 offset, escapes this version would not write.
            b'{"id":"%s","parent_id":"%s","type":"message","timestamp":'
            b'"2025-03-01T09:30:02+00:00","message":{"role":"user","content":'
            b'[{"type":"text","text":"\\u00e9t\\u00e9"}]}}' % (ids[1].encode(), ids[0].encode()),
            # A custom entry with a top-level field nobody here knows.
            b'{"type":"custom","id":"%s","parent_id":"%s","timestamp":"2025-03-01T09:30:03Z",'
            b'"kind":"%s","data":{"a":1},"written_by":"another app"}'
            % (ids[2].encode(), ids[1].encode(), UNREGISTERED_KIND.encode()),
            # A registered kind whose data has a field its class lacks.
            b'{"type":"custom","id":"%s","parent_id":"%s","timestamp":"2025-03-01T09:30:04.5Z",'
            b'"kind":"%s","data":{"text":"n","added_later":[1,2]}}'
            % (ids[3].encode(), ids[2].encode(), NOTE_KIND.encode()),
            # A type this version does not know.
            b'{"type":"from.the.future","id":"%s","parent_id":"%s","x":{"y":[1.50]}}'
            % (ids[4].encode(), ids[3].encode()),
        ]
        with note_registered():
            entries = [decode_entry(line) for line in lines]
            await store.append_entries(sid, entries)  # one call ...
            single = await self.new_session(store)
            for entry in entries:  # ... and one call each
                await store.append_entries(single, [entry])
            for session in (sid, single):
                loaded = await store.load_entries(session)
                assert [encode_entry(e) for e in loaded] == lines
        first, _, custom, note, _ = loaded
        assert isinstance(first, MessageEntry) and first.message.text == "hi"
        assert isinstance(custom, CustomEntry) and isinstance(custom.data, msgspec.Raw)
        assert isinstance(note, CustomEntry) and note.data == ConformanceNote(text="n")
        # Once changed, an entry is written the way this version writes it.
        changed = msgspec.structs.replace(first, id=ids[5])
        assert b"mood" not in encode_entry(changed)

    @pytest.mark.parametrize("case", sorted(INVALID_ENTRIES))
    async def test_s16_invalid_entry_is_refused_before_anything_is_written(
        self, store: Store, case: str
    ) -> None:
        sid = await self.new_session(store)
        good = chain_entry(None, 0, 0)
        with pytest.raises(InvalidEntry) as info:
            await store.append_entries(sid, [good, INVALID_ENTRIES[case]()])
        assert info.value.session_id == sid and repr(sid) in str(info.value)
        assert list(await store.load_entries(sid)) == []
        await store.append_entries(sid, [good])
        assert [e.id for e in await store.load_entries(sid)] == [good.id]

    async def test_s16_nesting_up_to_the_limit_round_trips(self, store: Store) -> None:
        sid = await self.new_session(store)
        # The line's own object is one level, so MAX_DEPTH - 1 levels of data fit.
        entry = CustomEntry(kind=UNREGISTERED_KIND, data=nested(MAX_DEPTH - 1))
        await store.append_entries(sid, [entry])
        (loaded,) = await store.load_entries(sid)
        assert encode_entry(loaded) == encode_entry(entry)

    async def test_s7_load_unknown_session_raises_not_found(self, store: Store) -> None:
        with pytest.raises(SessionNotFound) as info:
            await store.load_entries("conf-no-such-session")
        assert info.value.session_id == "conf-no-such-session"

    async def test_s7_create_existing_session_raises_exists(self, store: Store) -> None:
        sid = await self.new_session(store)
        await store.append_entries(sid, [chain_entry(None, 0, 0)])
        with pytest.raises(SessionExists):
            await store.create_session(SessionRecord(id=sid, parent_id="other"))
        assert len(await store.load_entries(sid)) == 1

    async def test_s7_append_to_unknown_session_raises_and_creates_nothing(
        self, store: Store
    ) -> None:
        with pytest.raises(SessionNotFound):
            await store.append_entries("conf-missing", [chain_entry(None, 0, 0)])
        with pytest.raises(SessionNotFound):
            await store.load_entries("conf-missing")

    async def test_s8_repeated_entry_id_refuses_the_whole_batch(self, store: Store) -> None:
        # The second half of the repeated-id rule: a batch that repeats a
        # stored id and is not an exact retry of stored entries (S25) is a
        # conflict, refused whole, on this handle and on any other.
        sid, before, batch = await self._stored_batch(store)
        stored = before + batch
        changed = msgspec.structs.replace(batch[1], message=UserMessage.of("not the same"))
        fresh = chain_entry(batch[2].id, 0, 4)
        twin = msgspec.structs.replace(fresh, message=UserMessage.of("its twin"))
        other = await self.another_handle()
        conflicts = [
            (store, [changed]),                          # other bytes under a stored id
            (store, [batch[0], changed, batch[2]]),      # ... inside an otherwise exact retry
            (store, [fresh, changed]),                   # a new entry, then a stored id
            (store, [*batch, fresh]),                    # stored, plus one new entry
            (store, [batch[1], batch[0], batch[2]]),     # stored ids in another order
            (store, [before[0], batch[1]]),              # stored, but not as one run
            (store, [batch[0], batch[0]]),               # one stored entry twice
            (store, [fresh, twin]),                      # an id twice within the batch
            (other, [fresh, changed]),
            (other, [batch[1], batch[0], batch[2]]),
        ]
        for handle, conflict in conflicts:
            with pytest.raises(StoreError) as info:
                await handle.append_entries(sid, conflict)
            assert info.value.session_id == sid and repr(sid) in str(info.value)
            assert_same_entries(await store.load_entries(sid), stored)
        # The new id stays free for the batch that is right.
        await store.append_entries(sid, [fresh])
        assert_same_entries(await other.load_entries(sid), [*stored, fresh])
        # Ids stored by a call of several entries count as well (one batch line
        # in the file store), for the handle that wrote them, for one that had
        # the session open before (it learns them from what was added since),
        # for one that loaded after, and for one that never looked.
        pair = [chain_entry(fresh.id, 1, 0)]
        pair.append(chain_entry(pair[0].id, 1, 1))
        await store.append_entries(sid, pair)
        loaded = await self.another_handle()
        await loaded.load_entries(sid)
        cold = await self.another_handle()
        stored = [*stored, fresh, *pair]
        for handle in (store, other, loaded, cold):
            for old in pair:
                changed = msgspec.structs.replace(old, message=UserMessage.of("changed"))
                for batch in ([changed], [chain_entry(pair[-1].id, 2, 0), changed]):
                    with pytest.raises(StoreError) as info:
                        await handle.append_entries(sid, batch)
                    assert info.value.session_id == sid
            assert_same_entries(await handle.load_entries(sid), stored)

    async def test_s8_one_mebibyte_entries(self, store: Store) -> None:
        sid = await self.new_session(store)
        big_text = "a" * (1 << 20)
        big_unicode = ("é😀" * (1 << 18))[: 1 << 19]
        entries: list[Entry] = [
            MessageEntry(message=UserMessage.of(big_text)),
            MessageEntry(message=ToolResultMessage(
                tool_call_id="c", tool_name="cat", content=(TextPart(text=big_unicode),))),
            CustomEntry(kind=UNREGISTERED_KIND,
                        data=msgspec.Raw(msgspec.json.encode({"blob": big_text}))),
        ]
        await store.append_entries(sid, entries[:1])
        await store.append_entries(sid, entries[1:])
        assert_same_entries(await store.load_entries(sid), entries)

    async def test_s1_unicode_session_ids_and_content(self, store: Store) -> None:
        text = "mixed: é ß 漢字 😀 \u200f\u05e9\u05dc\u05d5\u05dd \u2028 \x00 \\ \" \x7f end"
        for sid in UNICODE_IDS:
            await store.create_session(SessionRecord(id=sid))
            await store.append_entries(
                sid, [MessageEntry(message=UserMessage.of(f"{sid}|{text}"))]
            )
        for sid in UNICODE_IDS:
            (entry,) = await store.load_entries(sid)
            assert isinstance(entry, MessageEntry)
            assert isinstance(entry.message, UserMessage)
            assert entry.message.text == f"{sid}|{text}"
        if self.offers("catalog"):
            catalog = self.catalog(store)
            for sid in UNICODE_IDS:
                assert (await catalog.load_session(sid)).id == sid

    async def test_s8_many_sessions(self, store: Store) -> None:
        sids = [f"conf-many-{n:03d}" for n in range(150)]
        await asyncio.gather(*(store.create_session(SessionRecord(id=s)) for s in sids))
        await asyncio.gather(*(
            store.append_entries(s, [MessageEntry(message=UserMessage.of(s))]) for s in sids
        ))
        for sid in sids:
            (entry,) = await store.load_entries(sid)
            assert isinstance(entry, MessageEntry)
            assert isinstance(entry.message, UserMessage)
            assert entry.message.text == sid

    async def test_s7_identical_record_cannot_be_created_twice(self, store: Store) -> None:
        record = SessionRecord(id="conf-twice", created_at=at(1))
        await store.create_session(record)
        for handle in (store, await self.another_handle()):
            with pytest.raises(SessionExists) as info:
                await handle.create_session(record)
            assert info.value.session_id == record.id

    async def test_s7_not_found_names_the_session_asked_for(self, store: Store) -> None:
        await self.new_session(store, "conf-present")
        sid = "conf-absent"
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load_entries(sid),
            lambda: store.append_entries(sid, [chain_entry(None, 0, 0)]),
            lambda: store.append_entries(sid, []),  # an empty batch still needs the session
        ]
        if self.offers("catalog"):
            catalog = self.catalog(store)
            calls += [lambda: catalog.load_session(sid), lambda: catalog.delete_session(sid)]
        for call in calls:
            with pytest.raises(SessionNotFound) as info:
                await call()
            assert info.value.session_id == sid and repr(sid) in str(info.value)
        with pytest.raises(SessionNotFound):
            await store.load_entries(sid)  # and nothing was created on the way

    async def test_s1_one_session_id_rule(self, store: Store) -> None:
        too_long = "é" * (MAX_SESSION_ID_BYTES // 2 + 1)
        for sid in ("", "nul\x00inside", "lone \ud800 surrogate", too_long, 42, None):
            with pytest.raises(InvalidSessionId):
                await store.create_session(SessionRecord(id=sid))  # type: ignore[arg-type]
            with pytest.raises(InvalidSessionId):
                await store.load_entries(sid)  # type: ignore[arg-type]
            with pytest.raises(InvalidSessionId):
                await store.append_entries(sid, [])  # type: ignore[arg-type]
            if sid is None:
                continue  # no parent_id: a root session
            # A parent_id names a session, so the same rule holds for it; the
            # error names the session that was being created.
            with pytest.raises(InvalidSessionId) as info:
                await store.create_session(
                    SessionRecord(id="conf-bad-parent", parent_id=sid))  # type: ignore[arg-type]
            assert info.value.session_id == "conf-bad-parent"
            with pytest.raises(SessionNotFound):
                await store.load_entries("conf-bad-parent")
        longest = "é" * (MAX_SESSION_ID_BYTES // 2)
        await store.create_session(SessionRecord(id=longest))
        await store.append_entries(longest, [chain_entry(None, 0, 0)])
        assert len(await store.load_entries(longest)) == 1

    async def test_s4_every_handle_sees_what_another_handle_wrote(self, store: Store) -> None:
        other = await self.another_handle()
        sid = await self.new_session(store)
        assert list(await other.load_entries(sid)) == []  # loaded (and maybe cached) first
        first = chain_entry(None, 1, 0)
        await store.append_entries(sid, [first])
        assert_same_entries(await other.load_entries(sid), [first])
        second = chain_entry(first.id, 2, 0)
        await other.append_entries(sid, [second])
        assert_same_entries(await store.load_entries(sid), [first, second])
        late = await self.new_session(other)
        assert list(await store.load_entries(late)) == []
        if self.offers("catalog"):
            await self.catalog(other).delete_session(late)
            with pytest.raises(SessionNotFound):
                await store.load_entries(late)

    async def test_s4_two_handles_append_from_one_leaf_grow_siblings(self, store: Store) -> None:
        other = await self.another_handle()
        sid = await self.new_session(store)
        root = chain_entry(None, 0, 0)
        await store.append_entries(sid, [root])
        leaf_a = TreeIndex(await store.load_entries(sid)).leaf_id
        leaf_b = TreeIndex(await other.load_entries(sid)).leaf_id
        first, second = chain_entry(leaf_a, 1, 1), chain_entry(leaf_b, 2, 1)
        await asyncio.gather(store.append_entries(sid, [first]),
                             other.append_entries(sid, [second]))
        for handle in (store, other):
            loaded = await handle.load_entries(sid)
            assert len(loaded) == 3 and loaded[0].id == root.id
            children = TreeIndex(loaded).children(root.id)
            assert sorted(e.id for e in children) == sorted([first.id, second.id])

    async def test_s8_large_batches_are_kept_whole(self, store: Store) -> None:
        other = await self.another_handle()
        for size in (101, 250, 10_000):
            sid = await self.new_session(store)
            batch = chain(size)
            await store.append_entries(sid, batch)
            assert_same_entries(await store.load_entries(sid), batch)
            assert_same_entries(await other.load_entries(sid), batch)

    async def test_s8_readers_never_see_part_of_a_batch(self, store: Store) -> None:
        reader = await self.another_handle()
        sid = await self.new_session(store)
        size, parent, seen = 300, None, set()
        for _ in range(3):
            batch = chain(size, parent)
            parent = batch[-1].id
            task = asyncio.ensure_future(store.append_entries(sid, batch))
            while not task.done():
                seen.add(len(await reader.load_entries(sid)))
                await asyncio.sleep(0)
            await task
            seen.add(len(await reader.load_entries(sid)))
        assert seen <= {0, size, 2 * size, 3 * size}, sorted(seen)

    async def test_s8_undecodable_stored_data_is_corrupt_log(self, store: Store) -> None:
        for data in (
            b'{"type":"message","id":"conf-cut","timestamp":"2024-05-01T1',
            b'{"type":"message","id":"conf-alien","timestamp":"2024-05-01T12:00:00Z",'
            b'"message":{"role":"alien"}}',
            b"not json at all",
        ):
            sid = await self.new_session(store)
            await store.append_entries(sid, [chain_entry(None, 0, 0)])
            await self.write_stored(store, sid, data)
            with pytest.raises(CorruptLog) as info:
                await store.load_entries(sid)
            assert info.value.session_id == sid

    async def test_s8_newer_format_version_is_refused_with_upgrade_advice(
        self, store: Store
    ) -> None:
        sid = await self.new_session(store)
        await store.append_entries(sid, [chain_entry(None, 0, 0)])
        await self.write_format_version(store, sid, FORMAT_VERSION + 1)
        fresh = await self.another_handle()
        with pytest.raises(CorruptLog, match="upgrade"):
            await fresh.load_entries(sid)
        with pytest.raises(CorruptLog, match="upgrade"):
            await fresh.append_entries(sid, [chain_entry(None, 0, 1)])

    async def test_s4_concurrent_creates_one_winner(self, store: Store) -> None:
        handles = [store] + [await self.another_handle() for _ in range(3)]
        results = await asyncio.gather(
            *(h.create_session(SessionRecord(id="conf-race")) for h in handles),
            return_exceptions=True,
        )
        assert sum(r is None for r in results) == 1, results
        assert all(r is None or isinstance(r, SessionExists) for r in results), results

    async def test_s4_concurrent_appends_from_tasks(self, store: Store) -> None:
        sid = await self.new_session(store)
        handles = [store] + [await self.another_handle() for _ in range(3)]
        chains = await asyncio.gather(*(
            append_chain(handles[w % len(handles)], sid, w, 30, batch=1 + w % 3)
            for w in range(8)
        ))
        check_concurrent_log(await store.load_entries(sid), chains)

    async def test_s4_concurrent_appends_from_threads(self, store: Store) -> None:
        sid = await self.new_session(store)
        results: dict[int, list[str]] = {}
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            async def run() -> list[str]:
                handle = (
                    await self.make_store(self._tmp_path) if self.shared_instances
                    else self._main
                )
                try:
                    return await append_chain(handle, sid, w, 40, batch=1 + w % 2)
                finally:
                    if self.shared_instances:
                        await close(handle)

            try:
                results[w] = asyncio.run(run())
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()

        def join_all() -> None:
            for t in threads:
                t.join()

        await asyncio.to_thread(join_all)
        if errors:
            raise errors[0]
        check_concurrent_log(await store.load_entries(sid), list(results.values()))

    async def _stored_batch(
        self, store: Store
    ) -> tuple[str, list[MessageEntry], list[MessageEntry]]:
        sid = await self.new_session(store)
        before = [chain_entry(None, 0, 0)]
        await store.append_entries(sid, before)
        batch = [chain_entry(before[0].id, 0, 1)]
        batch += [chain_entry(batch[0].id, 0, 2), chain_entry(None, 0, 3)]
        await store.append_entries(sid, batch)
        return sid, before, batch

    async def test_s25_retried_batch_is_stored_once(self, store: Store) -> None:
        # The first half of the repeated-id rule (S8): a batch whose entries
        # are all stored already, the same bytes in the same order, is the
        # earlier append acknowledged late. It succeeds and stores nothing.
        sid, before, batch = await self._stored_batch(store)
        # The caller never heard back, so it sends the same batch again, maybe
        # over another connection, maybe more than once.
        await (await self.another_handle()).append_entries(sid, batch)
        await store.append_entries(sid, batch)
        await store.append_entries(sid, batch[1:])  # a tail of it is stored as well
        assert_same_entries(await store.load_entries(sid), before + batch)

    async def test_s7_core_methods_refuse_odd_arguments(self, store: Store) -> None:
        sid, kept = await session_with_one_entry(self, store)
        entry = chain_entry(kept[0].id, 0, 1)
        probes = Probes()
        for bad in BAD_SESSION_IDS:
            await probes.expect(InvalidSessionId, f"create_session(SessionRecord(id={bad!r}))",
                                functools.partial(store.create_session,
                                                  SessionRecord(id=bad)))
            await probes.expect(InvalidSessionId, f"load_entries({bad!r})",
                                functools.partial(store.load_entries, bad))
            for batch in ([], [entry]):
                await probes.expect(InvalidSessionId,
                                    f"append_entries({bad!r}, {len(batch)} entries)",
                                    functools.partial(store.append_entries, bad, batch))
        await probes.entries(store.append_entries, "append_entries", sid, entry)
        probes.check(store)
        assert_same_entries(await store.load_entries(sid), kept)
        await store.append_entries(sid, [entry])  # and the session is still usable
        assert_same_entries(await store.load_entries(sid), [*kept, entry])
