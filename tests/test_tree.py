"""The tree index over a session's entries (S5, S8: leaf after loading = last appended)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from threadline.ai._messages import UserMessage
from threadline.errors import EntryNotFound
from threadline.session._codec import decode_entry
from threadline.session._entries import CustomEntry, Entry, MessageEntry
from threadline.session._tree import TreeIndex

TS = datetime(2025, 1, 1, tzinfo=UTC)


def msg(entry_id: str, parent_id: str | None) -> MessageEntry:
    return MessageEntry(
        id=entry_id, parent_id=parent_id, timestamp=TS, message=UserMessage.of(entry_id)
    )


def ids(entries: list[Entry]) -> list[str]:
    return [e.id for e in entries]


@pytest.fixture
def tree() -> TreeIndex:
    r"""
    a - b - c - d
         \
          e - f
    g            (a second root)
    """
    return TreeIndex(
        [msg("a", None), msg("b", "a"), msg("c", "b"), msg("e", "b"), msg("d", "c"),
         msg("f", "e"), msg("g", None)],
        session_id="s1",
    )


def test_s8_leaf_after_loading_is_the_last_appended_entry(tree: TreeIndex) -> None:
    assert tree.leaf_id == "g"
    assert tree.leaf is not None and tree.leaf.id == "g"
    tree.add(msg("h", "d"))
    assert tree.leaf_id == "h"
    empty = TreeIndex()
    assert (empty.leaf_id, empty.leaf, empty.path(), len(empty)) == (None, None, [], 0)


def test_s5_entries_keep_append_order(tree: TreeIndex) -> None:
    assert ids(tree.entries) == ["a", "b", "c", "e", "d", "f", "g"]
    assert ids(list(tree)) == ids(tree.entries)
    assert len(tree) == 7
    tree.entries.clear()  # a copy
    assert len(tree) == 7


def test_s5_children_in_append_order(tree: TreeIndex) -> None:
    assert ids(tree.children("b")) == ["c", "e"]
    assert ids(tree.children("a")) == ["b"]
    assert tree.children("d") == []
    assert ids(tree.children(None)) == ["a", "g"]
    assert tree.children("nope") == []


def test_s5_path_from_root(tree: TreeIndex) -> None:
    assert ids(tree.path("d")) == ["a", "b", "c", "d"]
    assert ids(tree.path("f")) == ["a", "b", "e", "f"]
    assert ids(tree.path("a")) == ["a"]
    assert ids(tree.path()) == ["g"]  # the leaf
    assert tree.path(None, to_leaf=False) == []
    with pytest.raises(EntryNotFound, match=r"'zz'.*'s1'"):
        tree.path("zz")


def test_s5_branch_moves_the_leaf_and_the_next_append_grows_a_sibling(tree: TreeIndex) -> None:
    tree.set_leaf("c")
    assert tree.leaf_id == "c"
    assert ids(tree.path()) == ["a", "b", "c"]
    tree.add(msg("c2", "c"))  # appended from the branch point
    assert ids(tree.children("c")) == ["d", "c2"]
    assert ids(tree.path()) == ["a", "b", "c", "c2"]
    tree.set_leaf(None)  # before the first entry: the next append is a new root
    assert tree.path() == []
    with pytest.raises(EntryNotFound):
        tree.set_leaf("zz")
    assert tree.leaf_id is None


def test_roots_and_leaves(tree: TreeIndex) -> None:
    assert ids(tree.roots()) == ["a", "g"]
    assert ids(tree.leaves()) == ["d", "f", "g"]


def test_get_and_contains(tree: TreeIndex) -> None:
    assert tree.get("e").id == "e"
    assert "e" in tree
    assert "zz" not in tree
    with pytest.raises(EntryNotFound, match="'zz'"):
        tree.get("zz")


def test_duplicate_ids_are_ignored_and_counted(tree: TreeIndex) -> None:
    first = tree.get("b")
    tree.add(msg("b", "g"))  # same id, different content: the first one stands
    tree.add(msg("a", None))
    assert tree.duplicates == 2
    assert tree.get("b") is first
    assert len(tree) == 7
    assert tree.leaf_id == "g"  # a duplicate is not an append
    assert ids(tree.children("g")) == []


def test_missing_parent_makes_an_orphan_root(tree: TreeIndex) -> None:
    tree.add(msg("o", "gone"))
    tree.add(msg("p", "o"))
    assert ids(tree.path("p")) == ["o", "p"]
    assert ids(tree.roots()) == ["a", "g", "o"]
    assert "o" not in ids(tree.children(None))
    assert ids(tree.children("gone")) == ["o"]


def test_cycle_from_a_hand_edited_log_terminates() -> None:
    tree = TreeIndex([msg("x", "y"), msg("y", "x"), msg("z", "z")])
    assert ids(tree.path("x")) == ["y", "x"]
    assert ids(tree.path("z")) == ["z"]


def test_opaque_and_custom_entries_have_a_place_in_the_tree() -> None:
    opaque = decode_entry(b'{"type":"future","id":"o","parent_id":"a"}')
    custom = CustomEntry(id="c", parent_id="o", timestamp=TS, kind="k", data=1)
    tree = TreeIndex([msg("a", None), opaque, custom, msg("d", "c")])
    assert ids(tree.path()) == ["a", "o", "c", "d"]


def test_long_chain_of_100k_entries() -> None:
    n = 100_000
    chain = [msg("0", None)] + [msg(str(i), str(i - 1)) for i in range(1, n)]
    tree = TreeIndex(chain)
    assert len(tree) == n
    assert tree.leaf_id == str(n - 1)
    path = tree.path()
    assert len(path) == n
    assert path[0].id == "0" and path[-1].id == str(n - 1)
    assert path == chain
    assert len(tree.path("49999")) == 50_000
    assert ids(tree.leaves()) == [str(n - 1)]
    assert ids(tree.roots()) == ["0"]
