"""Retention: policies stated once, applied so that every remaining path still walks.

``plan`` is pure: a session's record and entries in, the ``Cut`` to make
out. ``prune`` runs it over a store, each session under the store's own
lock (``PrunableStore.prune_session``), fork children before their
parents, and reports what went.

What a cut may take, so that no path breaks:
- a whole session that nothing was appended to for longer than the policy's
  ``idle_sessions`` (and, unless ``fork_parents="release"``, that no
  remaining session was forked from);
- a side branch: entries off the active path (the path to the last
  appended entry) whose whole subtree is older than ``side_branches``. The
  set taken is closed under children, so no remaining entry loses its parent;
- the part of the active path the latest compaction on it folded (before
  its first kept entry), down from the deepest entry there that a remaining
  side branch hangs from. The first kept entry becomes a root, which the
  tree reads as one (its parent is gone), and the context built from the
  path is the same as before.
The last appended entry, and so the active path's leaf, is never taken but
with its whole session.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from threadline.errors import ConfigError, CorruptLog, SessionNotFound, StoreError
from threadline.session._entries import CompactionEntry, Entry, SessionRecord, utcnow
from threadline.stores._contract import CatalogStore, Cut, PrunableStore, Store

__all__ = ["PruneReport", "RetentionPolicy", "plan", "prune"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``"90d"``, ``"12h"``, ``"2w"``, ``"30m"``, ``"45s"`` as a ``timedelta``."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ConfigError(f"not a duration: {text[:40]!r} (write a whole number and one of "
                          f"s, m, h, d, w: 90d, 12h)")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a deployment keeps, stated once. Every rule is off until given.

    ``idle_sessions``: delete a session nothing was appended to for longer.
    ``side_branches``: drop branches off the active path whose newest entry
    is older. ``fold_compacted``: drop what the latest compaction on the
    active path folded. ``fork_parents``: ``"keep"`` (the default) keeps an
    idle session while a remaining session was forked from it; ``"release"``
    deletes it anyway, and the fork's record still names it (records are
    never rewritten): the fork loads and walks as before, since a fork
    holds its own copy of the path, but its parent is gone from the listing.
    """

    idle_sessions: timedelta | None = None
    side_branches: timedelta | None = None
    fold_compacted: bool = False
    fork_parents: Literal["keep", "release"] = "keep"

    def __post_init__(self) -> None:
        for name in ("idle_sessions", "side_branches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, timedelta)
                                      or value <= timedelta(0)):
                raise ConfigError(f"RetentionPolicy.{name} is a positive timedelta, "
                                  f"got {value!r}")
        if self.fork_parents not in ("keep", "release"):
            raise ConfigError(f"RetentionPolicy.fork_parents is 'keep' or 'release', "
                              f"got {self.fork_parents!r}")

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """A policy from ``"idle=90d,branches=30d,fold,fork-parents=release"``."""
        fields: dict[str, object] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, _, value = part.partition("=")
            if name == "idle" and value:
                fields["idle_sessions"] = parse_duration(value)
            elif name == "branches" and value:
                fields["side_branches"] = parse_duration(value)
            elif name == "fold" and not value:
                fields["fold_compacted"] = True
            elif name == "fork-parents" and value in ("keep", "release"):
                fields["fork_parents"] = value
            else:
                raise ConfigError(f"not a retention rule: {part[:60]!r} (rules: idle=D, "
                                  f"branches=D, fold, fork-parents=keep|release)")
        if not fields:
            raise ConfigError("a retention policy needs at least one rule "
                              "(idle=D, branches=D, fold)")
        return cls(**fields)  # type: ignore[arg-type]

    def __str__(self) -> str:
        parts = []
        if self.idle_sessions is not None:
            parts.append(f"idle={_spell(self.idle_sessions)}")
        if self.side_branches is not None:
            parts.append(f"branches={_spell(self.side_branches)}")
        if self.fold_compacted:
            parts.append("fold")
        if self.fork_parents != "keep":
            parts.append(f"fork-parents={self.fork_parents}")
        return ",".join(parts)


def _spell(d: timedelta) -> str:
    seconds = int(d.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """One session's cut, by rule."""

    expire: bool = False
    branches: tuple[str, ...] = ()
    folded: tuple[str, ...] = ()

    @property
    def cut(self) -> Cut:
        if self.expire:
            return Cut(session=True)
        return Cut(entries=self.branches + self.folded)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _when(entry: Entry) -> datetime | None:
    t = entry.timestamp
    return None if t is None else _aware(t)


def last_activity(record: SessionRecord, entries: Sequence[Entry]) -> datetime:
    """The newest time in the session: its newest entry's, or its creation."""
    times = [t for e in entries if (t := _when(e)) is not None]
    return max([_aware(record.created_at), *times])


def plan(record: SessionRecord, entries: Sequence[Entry], policy: RetentionPolicy,
         now: datetime, *, may_expire: bool = True) -> Plan:
    """What ``policy`` takes out of this session at ``now`` (pure; see the module doc)."""
    now = _aware(now)
    if (policy.idle_sessions is not None and may_expire
            and now - last_activity(record, entries) > policy.idle_sessions):
        return Plan(expire=True)
    if not entries:
        return Plan()
    by_id: dict[str, Entry] = {}
    leaf = entries[-1]
    for e in entries:
        if e.id not in by_id:  # a repeated id is ignored, as the tree index ignores it
            by_id[e.id] = leaf = e
    active = _active_path(leaf, by_id)
    on_path = {e.id for e in active}
    kids: dict[str, list[str]] = {}
    for e in by_id.values():
        if e.parent_id is not None and e.parent_id in by_id:
            kids.setdefault(e.parent_id, []).append(e.id)
    branches: list[str] = []
    if policy.side_branches is not None:
        cutoff = now - policy.side_branches
        newest = _newest_below(entries, by_id)
        # Newest-first order: a child goes before its parent, so every
        # prefix of the list leaves the rest of the branch whole.
        branches = [e.id for e in reversed(list(by_id.values()))
                    if e.id not in on_path and (t := newest.get(e.id)) is not None
                    and t < cutoff]
    folded: list[str] = []
    if policy.fold_compacted:
        folded = _folded(active, kids, set(branches))
    return Plan(branches=tuple(branches), folded=tuple(folded))


def _active_path(leaf: Entry, by_id: dict[str, Entry]) -> list[Entry]:
    path: list[Entry] = []
    seen: set[str] = set()
    current: Entry | None = leaf
    while current is not None and current.id not in seen:
        seen.add(current.id)
        path.append(current)
        parent = current.parent_id
        current = by_id.get(parent) if parent is not None else None
    path.reverse()
    return path


def _newest_below(entries: Sequence[Entry], by_id: dict[str, Entry]) -> dict[str, datetime]:
    """Entry id -> the newest time in its subtree (itself and every descendant).

    An entry without a time (a type this version does not know) counts as
    new: a branch holding one is never taken for being old.
    """
    far = datetime.max.replace(tzinfo=UTC)
    newest: dict[str, datetime] = {}
    for e in by_id.values():
        newest[e.id] = _when(e) or far
    # Children are appended after their parents: one pass from the end
    # carries each subtree's newest time up. A hand-made log that breaks this
    # only makes a branch look newer, which keeps it.
    order = list(by_id.values())
    for e in reversed(order):
        parent = e.parent_id
        if parent is not None and parent in newest and newest[e.id] > newest[parent]:
            newest[parent] = newest[e.id]
    return newest


def _folded(active: list[Entry], kids: dict[str, list[str]], taken: set[str]) -> list[str]:
    """The ids the latest compaction on ``active`` folded that can go, root first."""
    for i in range(len(active) - 1, -1, -1):
        entry = active[i]
        if isinstance(entry, CompactionEntry):
            keep = next((j for j in range(i) if active[j].id == entry.first_kept_entry_id),
                        None)
            break
    else:
        return []
    if not keep:
        return []
    # An entry that a remaining side branch hangs from stays, and so does
    # everything above it: that branch's path must still reach its root.
    start = 0
    for j in range(keep):
        if any(k not in taken and k != active[j + 1].id for k in kids.get(active[j].id, ())):
            start = j + 1
    return [e.id for e in active[start:keep]]


class PruneReport(msgspec.Struct, kw_only=True):
    """What a ``prune`` removed (or, for a dry run, would remove)."""

    policy: str
    dry_run: bool
    now: datetime
    sessions_seen: int = 0
    sessions_deleted: list[str] = msgspec.field(default_factory=list)
    """Idle sessions deleted whole."""
    fork_parents_kept: list[str] = msgspec.field(default_factory=list)
    """Idle sessions kept because a remaining session was forked from them."""
    branch_entries: dict[str, int] = msgspec.field(default_factory=dict)
    """Session id -> entries of old side branches removed."""
    folded_entries: dict[str, int] = msgspec.field(default_factory=dict)
    """Session id -> entries folded into the latest compaction removed."""
    problems: list[str] = msgspec.field(default_factory=list)
    """Sessions that could not be pruned, and why; the others were."""

    @property
    def entries_removed(self) -> int:
        return sum(self.branch_entries.values()) + sum(self.folded_entries.values())


async def prune(store: Store, policy: RetentionPolicy, *, now: datetime | None = None,
                dry_run: bool = False, batch: int = 1000,
                concurrency: int = 8) -> PruneReport:
    """Apply ``policy`` to every session of ``store``; what was removed.

    The store must list its sessions (``CatalogStore``) and, unless
    ``dry_run``, prune them (``PrunableStore``). Each session is decided and
    cut under the store's lock, so writers can go on appending meanwhile and
    nothing they were told is stored goes. ``batch`` bounds the entries one
    transaction removes, ``concurrency`` the sessions pruned at once. A
    session that cannot be read is reported in ``problems`` and the rest go
    on. A dry run reads each session and says what the policy would take now.
    """
    if not isinstance(store, CatalogStore) and not callable(getattr(store, "list_sessions",
                                                                      None)):
        raise ConfigError(f"{store!r} cannot list its sessions, so it cannot be pruned")
    if not dry_run and not isinstance(store, PrunableStore):
        raise ConfigError(f"{store!r} does not offer prune_session; "
                          f"the file, SQLite and PostgreSQL stores do")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency is an integer of at least 1, got {concurrency!r}")
    at = _aware(now) if now is not None else utcnow()
    report = PruneReport(policy=str(policy), dry_run=dry_run, now=at)
    records = await _all_records(store)
    report.sessions_seen = len(records)
    parent = {r.id: r.parent_id for r in records}
    children: dict[str, set[str]] = {}
    for r in records:
        if r.parent_id is not None and r.parent_id in parent:
            children.setdefault(r.parent_id, set()).add(r.id)
    gone: set[str] = set()
    # Forks before their sources, so that a source's children are settled
    # when it is decided.
    for level in _by_depth_deepest_first(records, parent):
        for start in range(0, len(level), concurrency):
            await asyncio.gather(*(
                _one(store, r, policy=policy, now=at, report=report, gone=gone,
                     children=children, dry_run=dry_run, batch=batch)
                for r in level[start:start + concurrency]))
    report.sessions_deleted.sort()
    report.fork_parents_kept.sort()
    return report


async def _all_records(store: Store) -> list[SessionRecord]:
    records: list[SessionRecord] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(limit=1000, cursor=cursor)  # type: ignore[attr-defined]
        records += page.sessions
        cursor = page.next_cursor
        if cursor is None:
            return records


def _by_depth_deepest_first(records: list[SessionRecord],
                            parent: dict[str, str | None]) -> list[list[SessionRecord]]:
    depth: dict[str, int] = {}
    for r in records:
        chain: list[str] = []
        current: str | None = r.id
        while current is not None and current in parent and current not in depth:
            if current in chain:  # a lineage loop only hand-made records could hold
                break
            chain.append(current)
            current = parent[current]
        base = depth.get(current, -1) if current is not None else -1
        for n, sid in enumerate(reversed(chain)):
            depth[sid] = base + 1 + n
    levels: dict[int, list[SessionRecord]] = {}
    for r in records:
        levels.setdefault(depth[r.id], []).append(r)
    return [levels[d] for d in sorted(levels, reverse=True)]


async def _one(store: Store, record: SessionRecord, *, policy: RetentionPolicy,
               now: datetime, report: PruneReport, gone: set[str],
               children: dict[str, set[str]], dry_run: bool, batch: int) -> None:
    sid = record.id
    live = children.get(sid, set()) - gone
    may_expire = policy.fork_parents == "release" or not live
    seen: list[Plan] = []

    def choose(rec: SessionRecord, entries: Sequence[Entry]) -> Cut:
        p = plan(rec, entries, policy, now, may_expire=may_expire)
        if not may_expire and policy.idle_sessions is not None and not seen:
            idle = plan(rec, entries, policy, now, may_expire=True)
            if idle.expire:
                report.fork_parents_kept.append(sid)
        seen.append(p)
        return p.cut

    try:
        if dry_run:
            cut = choose(record, await store.load_entries(sid))
        else:
            cut = await store.prune_session(sid, choose, batch=batch)  # type: ignore[attr-defined]
    except SessionNotFound:
        return  # deleted meanwhile: nothing left to prune
    except (CorruptLog, StoreError) as exc:
        report.problems.append(f"session {sid!r}: {exc}")
        return
    if cut.session:
        gone.add(sid)
        report.sessions_deleted.append(sid)
        return
    if not cut.entries:
        return
    branch_ids = {i for p in seen for i in p.branches}
    taken = set(cut.entries)
    n_branch = len(taken & branch_ids)
    if n_branch:
        report.branch_entries[sid] = n_branch
    if len(taken) - n_branch:
        report.folded_entries[sid] = len(taken) - n_branch
