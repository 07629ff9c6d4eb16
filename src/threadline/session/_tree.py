"""The tree index over one session's entries.

Built from entries in append order. Adding an entry is O(1); the path from
the root to any entry is O(path length). The leaf is where the next append
goes: after loading it is the last appended entry; ``branch`` moves it.
Adding runs for every stored message, while children are read only when
asked for (the viewer, the CLI): so they are indexed when next read, from
the entries added since.

``TreeView`` has the reads; ``TreeIndex`` adds ``add`` and ``set_leaf``. A
durable agent hands out ``index.view()``, which shares the index's state but
cannot change it, so nothing moves the leaf behind the agent's back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from threadline.errors import EntryNotFound
from threadline.session._entries import Entry

__all__ = ["TreeIndex", "TreeView"]


class _State:
    __slots__ = ("by_id", "duplicates", "indexed", "kids", "leaf_id", "lock", "order",
                 "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.by_id: dict[str, Entry] = {}
        self.kids: dict[str | None, list[str]] = {}
        """Child ids by parent id, for ``order[:indexed]``."""
        self.indexed = 0
        self.lock = threading.Lock()  # two readers must not index the same entries twice
        self.order: list[Entry] = []
        self.duplicates = 0
        self.leaf_id: str | None = None

    def children(self) -> dict[str | None, list[str]]:
        """Child ids by parent id, for every entry added so far."""
        if self.indexed < len(self.order):
            with self.lock:
                order, kids = self.order, self.kids
                end = len(order)
                for entry in order[self.indexed:end]:
                    kids.setdefault(entry.parent_id, []).append(entry.id)
                self.indexed = end
        return self.kids


class TreeView:
    """Read-only access to a session's tree: children, paths, the leaf."""

    __slots__ = ("_s",)

    def __init__(self, state: _State) -> None:
        self._s = state

    @property
    def session_id(self) -> str:
        return self._s.session_id

    @property
    def leaf_id(self) -> str | None:
        return self._s.leaf_id

    @property
    def duplicates(self) -> int:
        """How many entries were ignored because their id was seen before."""
        return self._s.duplicates

    def __len__(self) -> int:
        return len(self._s.order)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._s.by_id

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._s.order)

    @property
    def entries(self) -> list[Entry]:
        """All entries in append order (a copy)."""
        return list(self._s.order)

    def get(self, entry_id: str) -> Entry:
        try:
            return self._s.by_id[entry_id]
        except KeyError:
            raise self._not_found(entry_id) from None

    def children(self, entry_id: str | None) -> list[Entry]:
        """Direct children in append order; ``None`` gives the entries whose
        ``parent_id`` is ``None`` (``roots`` also counts orphans)."""
        by_id = self._s.by_id
        return [by_id[i] for i in self._s.children().get(entry_id, ())]

    def roots(self) -> list[Entry]:
        """Entries with no parent, or whose parent is not in this log."""
        by_id = self._s.by_id
        return [e for e in self._s.order if e.parent_id is None or e.parent_id not in by_id]

    @property
    def leaf(self) -> Entry | None:
        leaf_id = self._s.leaf_id
        return None if leaf_id is None else self._s.by_id[leaf_id]

    def path(self, entry_id: str | None = None, *, to_leaf: bool = True) -> list[Entry]:
        """Entries from the root down to ``entry_id`` (default: the leaf)."""
        if entry_id is None:
            if not to_leaf or self._s.leaf_id is None:
                return []
            entry_id = self._s.leaf_id
        out: list[Entry] = []
        by_id = self._s.by_id
        current = by_id.get(entry_id)
        if current is None:
            raise self._not_found(entry_id)
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
        children = self._s.children()
        return [e for e in self._s.order if e.id not in children]

    def _not_found(self, entry_id: str) -> EntryNotFound:
        return EntryNotFound(f"entry {entry_id!r} is not in session {self._s.session_id!r}")


class TreeIndex(TreeView):
    """The tree of one session's entries, built and extended in append order."""

    __slots__ = ()

    def __init__(self, entries: Iterable[Entry] = (), *, session_id: str = "") -> None:
        super().__init__(_State(session_id))
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        """Index an appended entry and make it the leaf.

        An id seen before is ignored (the log holds it twice only if an
        idempotent copy was retried); ``duplicates`` counts such lines.
        """
        s = self._s
        entry_id = entry.id
        if entry_id in s.by_id:
            s.duplicates += 1
            return
        s.by_id[entry_id] = entry
        s.order.append(entry)
        s.leaf_id = entry_id

    def set_leaf(self, entry_id: str | None) -> None:
        if entry_id is not None and entry_id not in self._s.by_id:
            raise self._not_found(entry_id)
        self._s.leaf_id = entry_id

    def view(self) -> TreeView:
        """A read-only view that follows this index as it grows."""
        return TreeView(self._s)
