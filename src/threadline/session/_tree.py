"""The tree index over one session's entries (S5, S8).

Built from entries in append order. Adding an entry is O(1); the path from
the root to any entry is O(path length). The leaf is where the next append
goes: after loading it is the last appended entry; ``branch`` moves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from threadline.errors import EntryNotFound
from threadline.session._entries import Entry

__all__ = ["TreeIndex"]


class TreeIndex:
    __slots__ = ("_by_id", "_children", "_duplicates", "_order", "leaf_id", "session_id")

    def __init__(self, entries: Iterable[Entry] = (), *, session_id: str = "") -> None:
        self.session_id = session_id
        self._by_id: dict[str, Entry] = {}
        self._children: dict[str | None, list[str]] = {}
        self._order: list[Entry] = []
        self._duplicates = 0
        self.leaf_id: str | None = None
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        """Index an appended entry and make it the leaf.

        An id seen before is ignored (the log holds it twice only if an
        idempotent copy was retried); ``duplicates`` counts such lines.
        """
        if entry.id in self._by_id:
            self._duplicates += 1
            return
        self._by_id[entry.id] = entry
        self._children.setdefault(entry.parent_id, []).append(entry.id)
        self._order.append(entry)
        self.leaf_id = entry.id

    @property
    def duplicates(self) -> int:
        return self._duplicates

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._order)

    @property
    def entries(self) -> list[Entry]:
        """All entries in append order (a copy)."""
        return list(self._order)

    def get(self, entry_id: str) -> Entry:
        try:
            return self._by_id[entry_id]
        except KeyError:
            raise EntryNotFound(
                f"entry {entry_id!r} is not in session {self.session_id!r}"
            ) from None

    def children(self, entry_id: str | None) -> list[Entry]:
        """Direct children in append order; ``None`` gives the entries whose
        ``parent_id`` is ``None`` (``roots`` also counts orphans)."""
        return [self._by_id[i] for i in self._children.get(entry_id, ())]

    def roots(self) -> list[Entry]:
        """Entries with no parent, or whose parent is not in this log."""
        return [e for e in self._order if e.parent_id is None or e.parent_id not in self._by_id]

    @property
    def leaf(self) -> Entry | None:
        return None if self.leaf_id is None else self._by_id[self.leaf_id]

    def set_leaf(self, entry_id: str | None) -> None:
        if entry_id is not None and entry_id not in self._by_id:
            raise EntryNotFound(f"entry {entry_id!r} is not in session {self.session_id!r}")
        self.leaf_id = entry_id

    def path(self, entry_id: str | None = None, *, to_leaf: bool = True) -> list[Entry]:
        """Entries from the root down to ``entry_id`` (default: the leaf)."""
        if entry_id is None:
            if not to_leaf or self.leaf_id is None:
                return []
            entry_id = self.leaf_id
        out: list[Entry] = []
        by_id = self._by_id
        current = by_id.get(entry_id)
        if current is None:
            raise EntryNotFound(f"entry {entry_id!r} is not in session {self.session_id!r}")
        seen: set[str] = set()
        while current is not None:
            if current.id in seen:  # a cycle can only come from a hand-edited log
                break
            seen.add(current.id)
            out.append(current)
            parent = current.parent_id
            current = by_id.get(parent) if parent is not None else None
        out.reverse()
        return out

    def leaves(self) -> list[Entry]:
        """Entries with no children, in append order: the tips of every branch."""
        return [e for e in self._order if e.id not in self._children]
