"""The search level: full-text search across sessions (S64, S65).

For a store that declares the "search" capability (``SearchableStore``).
"""

from __future__ import annotations

import pytest

from threadline.ai._messages import (
    AssistantMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import ConfigError
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    SessionRecord,
)
from threadline.session._ids import new_id
from threadline.session._metadata import METADATA_KIND, metadata_change
from threadline.stores._contract import SearchableStore, SearchHit, Store
from threadline.testing._conformance._base import SuiteBase

__all__ = ["SearchTests", "indexed_sample"]


def _user(text: str, parent: Entry | None = None) -> MessageEntry:
    return MessageEntry(parent_id=None if parent is None else parent.id,
                        message=UserMessage(content=(TextPart(text=text),)))


def indexed_sample(word: str) -> tuple[list[Entry], dict[str, str | None]]:
    """One chain holding each kind of content, and, per probe word, the id of the
    entry search must find for it (None: it must find nothing).

    Every probe word is ``word`` plus a suffix, so sessions of other tests
    never match.
    """
    u = _user(f"the user asks about {word}user")
    a = MessageEntry(parent_id=u.id, message=AssistantMessage(content=(
        ThinkingPart(thinking=f"{word}thinking hidden"),
        TextPart(text=f"the assistant answers {word}assistant"),
        ToolCall(id="call-1", name=f"{word}tool_lookup", arguments={"q": f"{word}argument"}),
    )))
    r = MessageEntry(parent_id=a.id, message=ToolResultMessage(
        tool_call_id="call-1", tool_name=f"{word}resulttool",
        content=(TextPart(text=f"{word}result body"),)))
    c = CompactionEntry(parent_id=r.id, summary=f"so far {word}compaction",
                        first_kept_entry_id=u.id)
    b = BranchSummaryEntry(parent_id=c.id, from_id=u.id, summary=f"branch {word}branch")
    m = CustomMessageEntry(parent_id=b.id, kind="note",
                           content=(TextPart(text=f"note {word}custommessage"),))
    x = CustomEntry(parent_id=m.id, kind="app.state", data={"t": f"{word}custom"})
    expected: dict[str, str | None] = {
        f"{word}user": u.id, f"{word}assistant": a.id, f"{word}tool": a.id,
        f"{word}resulttool": r.id, f"{word}compaction": c.id, f"{word}branch": b.id,
        f"{word}custommessage": m.id,
        f"{word}thinking": None, f"{word}argument": None, f"{word}result": None,
        f"{word}custom": None,
    }
    return [u, a, r, c, b, m, x], expected


def _word() -> str:
    return "w" + new_id().replace("-", "")[-12:]


class SearchTests(SuiteBase):
    """Tests of ``search``."""

    def searchable(self, store: Store) -> SearchableStore:
        self.require(store, "search")
        assert isinstance(store, SearchableStore)
        return store

    async def test_s64_acknowledged_append_is_found_at_once_on_every_handle(
            self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        first = _user(f"hello {word} world")
        await store.append_entries(sid, [first])
        other = self.searchable(await self.another_handle())
        for handle in (searchable, other):
            hits = await handle.search(f"{word.upper()} hello")
            assert [(h.session_id, h.entry_id) for h in hits] == [(sid, first.id)]
            assert isinstance(hits[0], SearchHit)
            assert word in hits[0].snippet and isinstance(hits[0].rank, float)
        second = _user(f"again {word}", first)
        await other.append_entries(sid, [second])  # appended through the other handle
        assert {h.entry_id for h in await searchable.search(word)} == {first.id, second.id}
        assert [h.entry_id for h in await searchable.search(f"{word} world")] == [first.id]

    async def test_s64_indexes_text_tool_names_and_summaries_not_arguments_or_results(
            self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        entries, expected = indexed_sample(word)
        await store.append_entries(sid, entries)
        for probe, entry_id in expected.items():
            hits = await searchable.search(probe)
            got = [h.entry_id for h in hits if h.session_id == sid]
            assert got == ([] if entry_id is None else [entry_id]), probe

    async def test_s64_deleted_session_is_never_found(self, store: Store) -> None:
        searchable = self.searchable(store)
        catalog = self.catalog(store)
        word = _word()
        gone, kept = await self.new_session(store), await self.new_session(store)
        await store.append_entries(gone, [_user(f"{word} one")])
        await store.append_entries(kept, [_user(f"{word} two")])
        assert {h.session_id for h in await searchable.search(word)} == {gone, kept}
        await self.catalog(await self.another_handle()).delete_session(gone)
        assert {h.session_id for h in await searchable.search(word)} == {kept}
        await catalog.create_session(SessionRecord(id=gone))  # the id again, empty
        assert {h.session_id for h in await searchable.search(word)} == {kept}

    async def test_s64_active_path_only(self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        root = _user(f"{word} root")
        old = _user(f"{word} abandoned branch", root)
        new = _user(f"{word} current branch", root)
        await store.append_entries(sid, [root, old, new])
        every = {h.entry_id for h in await searchable.search(word)}
        assert every == {root.id, old.id, new.id}
        on_path = {h.entry_id for h in await searchable.search(word, active_path=True)}
        assert on_path == {root.id, new.id}
        assert await searchable.search(f"{word} abandoned", active_path=True) == []

    async def test_s64_scoped_by_owner_and_tenant(self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sessions = {}
        for owner, tenant in (("ann", "t1"), ("bob", "t1"), ("ann", "t2"), (None, None)):
            sid = await self.new_session(store)
            change = metadata_change(owner=owner, tenant=tenant)
            meta = CustomEntry(kind=METADATA_KIND, data=change)
            await store.append_entries(sid, [meta, _user(f"{word} from {owner}", meta)])
            sessions[sid] = (owner, tenant)

        async def found(owner: str | None = None, tenant: str | None = None) -> set[str]:
            return {h.session_id for h in await searchable.search(word, owner=owner,
                                                                  tenant=tenant)}

        assert await found() == set(sessions)
        assert await found(owner="ann") == {s for s, (o, _) in sessions.items() if o == "ann"}
        assert await found(tenant="t1") == {s for s, (_, t) in sessions.items() if t == "t1"}
        assert await found(owner="ann", tenant="t2") == {
            s for s, ot in sessions.items() if ot == ("ann", "t2")}
        assert await found(owner="nobody") == set()
        # The last change wins: the session moves to its new owner at once.
        moved = next(s for s, (o, t) in sessions.items() if (o, t) == ("bob", "t1"))
        await store.append_entries(moved, [
            CustomEntry(kind=METADATA_KIND, data=metadata_change(owner="carol"))])
        assert moved not in await found(owner="bob")
        assert moved in await found(owner="carol")

    async def test_s64_best_first_and_limited(self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        weak = _user(f"{word} " + " ".join(f"filler{n}" for n in range(40)))
        strong = _user(f"{word} {word} {word}", weak)
        await store.append_entries(sid, [weak, strong])
        hits = await searchable.search(word)
        assert [h.entry_id for h in hits] == [strong.id, weak.id]
        assert hits[0].rank > hits[1].rank
        assert [h.entry_id for h in await searchable.search(word, limit=1)] == [strong.id]

    async def test_s64_a_query_is_words_never_syntax(self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        hostile = _user(f'{word} "quoted" NEAR(a b) x* -y AND OR NOT ^col: \\ \' ; -- <b>')
        await store.append_entries(sid, [hostile])
        for query in (f'"{word}', f"{word} AND", f"{word}*", f"-{word}", f"NEAR({word})",
                      f"{word}:", f"{word} ' ; --", f"{word} <b>", f"({word}"):
            hits = await searchable.search(query)
            assert [h.entry_id for h in hits] == [hostile.id], query
        assert await searchable.search(f"{word} absentword") == []
        for bad, kwargs in (("", {}), (" \t*\"()' ", {}), (word, {"limit": 0}),
                            (word, {"limit": 1001}), (" ".join(["a"] * 33), {}),
                            (word, {"owner": 7})):
            with pytest.raises(ConfigError):
                await searchable.search(bad, **kwargs)  # type: ignore[arg-type]

    async def test_s64_hostile_text_comes_back_as_stored(self, store: Store) -> None:
        searchable = self.searchable(store)
        word = _word()
        sid = await self.new_session(store)
        text = f"<script>alert(1)</script> {word} \u202etxt.exe \x1b[31m red"
        await store.append_entries(sid, [_user(text)])
        (hit,) = await searchable.search(word)
        # Plain text, unescaped and unmarked: the output escapes it.
        assert "<script>alert(1)</script>" in hit.snippet and "\u202e" in hit.snippet
