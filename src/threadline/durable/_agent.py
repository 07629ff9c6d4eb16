"""The durable agent.

A ``DurableAgent`` owns the transcript state of one session: its id, the
loaded entries, a tree index and an in-memory leaf. It holds no application
state. Every mutation goes through the store first and only then changes
memory, is reported to a run's consumer, or is published.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import AsyncGeneratorType, TracebackType
from typing import Any, TypeAlias, cast

import msgspec
from msgspec import UNSET, UnsetType

from threadline.agent._events import AgentEvent, MessageEnd, MessageUpdate
from threadline.agent._gate import ResumeTurn
from threadline.agent._loop import AgentLoop
from threadline.ai import _trace as trace
from threadline.ai._messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.ai._model import LanguageModel
from threadline.ai._tools import Tool
from threadline.durable import _effects as effects
from threadline.durable._blobs import blob_reader
from threadline.durable._budget import Budget, BudgetTracker, checked_first, model_check
from threadline.durable._channel import Channel
from threadline.durable._compaction import CompactionPolicy, compact_agent, maybe_compact
from threadline.durable._events import (
    LifecycleEvent,
    PublisherLike,
    RunEvent,
    RunStarted,
    SessionBranched,
    SessionCompacted,
    SessionCreated,
    SessionForked,
    StoredMessageEnd,
)
from threadline.durable._factory import Factory
from threadline.durable._lock import AnyLoopLock
from threadline.durable._metadata import (
    TitleGenerator,
    change_entry,
    opening_change,
    title_after_first_exchange,
)
from threadline.durable._repair import orphaned_results
from threadline.durable._retry import append_linear_retrying, retry_append
from threadline.durable._stop import request_stop
from threadline.durable._tracing import load, traced_append, traced_events, traced_run
from threadline.errors import (
    AgentError,
    ConfigError,
    NoLoopError,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
)
from threadline.session._codec import check_entry, rechain_opaque, stored_form
from threadline.session._context import build_context
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
    utcnow,
)
from threadline.session._ids import new_id
from threadline.session._metadata import (
    MetadataChange,
    SessionMetadata,
    fold_metadata,
    metadata_change,
)
from threadline.session._tree import TreeIndex, TreeView
from threadline.stores._contract import LinearStore, Store, WatchableStore
from threadline.stores._rules import check_session_id

__all__ = ["DurableAgent", "PublishError", "Run", "RunInput", "open"]

log = logging.getLogger("threadline.durable")

RunInput: TypeAlias = str | Message | Sequence[Message]

_OPENING = object()  # only open() and fork() build agents: they load, create and repair

_CHECK_INLINE = 64
"""Appends of up to this many entries are checked on the event loop's thread."""


class PublishError(AgentError):
    """The effect is stored, but the publisher raised.

    ``result`` is what the call would have returned (the agent for ``open`` and
    ``fork``, the entry for ``compact``), so the caller loses nothing.
    """

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


async def open(
    factory: Factory | None,
    *,
    store: Store,
    session_id: str | None = None,
    publisher: PublisherLike | None = None,
    repair: bool = True,
    compaction: CompactionPolicy | None = None,
    create: bool = True,
    approval: effects.ApprovalRule | None = None,
    budget: Budget | None = None,
    metadata: Mapping[str, Any] | MetadataChange | None = None,
    title: TitleGenerator | None = None,
) -> DurableAgent:
    """Resume the session ``session_id`` or create it.

    With no ``session_id`` a new one is generated (``agent.session_id``).
    With ``create=False`` an unknown ``session_id`` raises ``SessionNotFound``
    instead of being created.
    Tool calls on the active path left without results by a crash get
    synthesized "interrupted" results appended unless ``repair=False``;
    calls the effect ledger tracks are left for ``continue_run``.
    With ``compaction``, each run first compacts the session when its context
    is over the policy's threshold. ``approval(call)`` returning true or a
    reason holds that call for a human decision (on top of each tool's own
    ``approval`` rule; ``docs/tools-with-side-effects.md``). With ``budget``,
    every model call of a run is checked against the session's stored usage
    first (``docs/usage.md``).
    ``metadata`` (``title``, ``owner``, ``tenant``, ``labels``) is appended
    as one change when it differs from the session's. With ``title``,
    a session without a title gets one generated after its first exchange.
    """
    created = False
    session_id = new_id() if session_id is None else check_session_id(session_id)
    try:
        entries = await load(store, session_id)
    except SessionNotFound:
        if not create:
            raise
        try:
            await store.create_session(SessionRecord(id=session_id, created_at=utcnow()))
            entries = []
            created = True
        except SessionExists:
            # Another agent created it between our load and our create: resume it.
            entries = await load(store, session_id)
    agent = DurableAgent(factory, store=store, session_id=session_id, entries=entries,
                         publisher=publisher, compaction=compaction, approval=approval,
                         budget=budget, _opening=_OPENING)
    agent._title = title
    if metadata is not None:
        change = opening_change(agent.metadata, metadata)
        if change is not None:
            async with agent._lock:
                await agent._append([change_entry(change)])
    if repair:
        await agent._repair()
    if created:
        agent._publish([SessionCreated(session_id=session_id, parent_id=None)], agent)
    return agent


class DurableAgent:
    """One live view of a session. Build it with ``await durable.open(...)``."""

    def __init__(
        self,
        factory: Factory | None,
        *,
        store: Store,
        session_id: str,
        entries: Sequence[Entry] = (),
        publisher: PublisherLike | None = None,
        compaction: CompactionPolicy | None = None,
        approval: effects.ApprovalRule | None = None,
        budget: Budget | None = None,
        _opening: object = None,
    ) -> None:
        if _opening is not _OPENING:
            raise AgentError(
                "a DurableAgent is opened with 'await durable.open(factory, store=..., "
                "session_id=...)', which loads or creates the session and repairs it"
            )
        if compaction is not None and factory is not None:
            compaction.models(factory)  # no model to summarise with: fail now
        self._compaction = compaction
        self._factory = factory
        self._store = store
        self._session_id = session_id
        self._tree = TreeIndex(entries, session_id=session_id)
        self._publisher = publisher
        # Any thread, any event loop (S33): an asyncio.Lock would bind to the first.
        self._lock = AnyLoopLock()
        self._approval = approval
        self._budget = budget
        self._synced_id: str | None = entries[-1].id if entries else None
        """The last entry known to be loaded in the store's own append order."""
        self._run_task: asyncio.Task[Any] | None = None
        """The task iterating the current run, if one is in progress."""
        self._run_owner: weakref.ref[Any] | None = None
        self._title: TitleGenerator | None = None
        self.repaired: tuple[Entry, ...] = ()
        """Entries crash repair appended when this agent was opened."""
        self.diagnostics: tuple[str, ...] = tuple(getattr(entries, "diagnostics", ()))
        """What the store noticed while loading (a torn last line, ...)."""

    # -- reads ---------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def store(self) -> Store:
        return self._store

    @property
    def factory(self) -> Factory | None:
        return self._factory

    @property
    def publisher(self) -> PublisherLike | None:
        return self._publisher

    @property
    def entries(self) -> list[Entry]:
        """Every entry of the session in append order (all branches)."""
        return self._tree.entries

    @property
    def leaf(self) -> Entry | None:
        return self._tree.leaf

    @property
    def leaf_id(self) -> str | None:
        return self._tree.leaf_id

    @property
    def tree(self) -> TreeView:
        """The session's tree, read-only; it follows the agent as entries are added."""
        return self._tree.view()

    def get(self, entry_id: str) -> Entry:
        return self._tree.get(entry_id)

    def children(self, entry_id: str | None) -> list[Entry]:
        return self._tree.children(entry_id)

    def path(self) -> list[Entry]:
        """The active branch: root to leaf."""
        return self._tree.path()

    def messages(self) -> list[Message]:
        """The model context built from the active path."""
        return build_context(self._tree.path())

    @property
    def metadata(self) -> SessionMetadata:
        """The session's metadata as this agent loaded and changed it."""
        return fold_metadata(self._tree.entries)

    # -- mutations -------------------------------------------------------------

    async def set_metadata(
        self, *, title: str | UnsetType | None = UNSET, owner: str | UnsetType | None = UNSET,
        tenant: str | UnsetType | None = UNSET, labels: Mapping[str, str | None] | None = None,
    ) -> Entry:
        """Append one metadata change at the leaf: ``None`` clears a field or label,
        a field left out keeps its value. Not published."""
        change = metadata_change(title=title, owner=owner, tenant=tenant, labels=labels)
        return (await self.append(change_entry(change)))[0]

    async def append(self, *items: Message | Entry) -> list[Entry]:
        """Append messages or entries at the leaf, chained one after another.

        Entries keep their type and payload; their id, parent and timestamp
        are assigned here. Returns the entries as stored.
        """
        self._check_not_inside_run("append")
        async with self._lock:
            written = await self._append(items)
        return written

    def branch(self, entry_id: str | None) -> None:
        """Move the leaf in memory; the next append becomes a child of ``entry_id``.

        ``None`` makes the next append a new root. Nothing is written: the
        branch exists once something is appended to it. Refused while a run,
        append, fork or compaction is in flight, whose write would otherwise
        move the leaf back.
        """
        if self._run_task is not None:
            raise AgentError(
                f"cannot branch session {self._session_id!r} while a run is in progress "
                "(a run left with break is closed by the event loop soon after; iterate it "
                "in 'async with agent.run(...)' to have it closed when the block exits)"
            )
        if self._lock.locked():
            raise AgentError(
                f"cannot branch session {self._session_id!r} while an append, fork or "
                "compaction is in flight: await it first"
            )
        before = self._tree.leaf_id
        self._tree.set_leaf(entry_id)
        self._publish(
            [SessionBranched(session_id=self._session_id, from_id=before, to_id=entry_id)],
            None,
        )

    async def branch_to(
        self, entry_id: str | None, *then: Message | Entry, summary: str = "",
        details: Any = None,
    ) -> list[Entry]:
        """Move the leaf to ``entry_id`` and record the move in the log.

        Appends a ``BranchSummaryEntry`` as a child of ``entry_id`` (a new root
        for ``None``) naming the leaf it left, followed by ``then``, in one
        ``append_entries`` call: the move and what follows it are stored
        together or not at all. A reopen, in any process, continues from the
        last entry written. The marker reaches the model only when ``summary``
        is set. Publishes ``session_branched``; returns the entries as stored.
        """
        self._check_not_inside_run("branch")
        if entry_id is not None:
            self._tree.get(entry_id)  # EntryNotFound before anything is written
        async with self._lock:
            before = self._tree.leaf_id
            marker = BranchSummaryEntry(parent_id=entry_id, from_id=before or "",
                                        summary=summary, details=details)
            self._tree.set_leaf(entry_id)
            try:
                written = await self._append([marker, *then])
            except BaseException:
                if self._tree.leaf_id == entry_id:
                    self._tree.set_leaf(before)  # nothing stored: the leaf stays put
                raise
        self._publish(
            [SessionBranched(session_id=self._session_id, from_id=before, to_id=entry_id)],
            written,
        )
        return written

    async def append_linear(self, *items: Message | Entry) -> list[Entry]:
        """Append after the log's last entry, whoever wrote it.

        ``append`` grows the branch this agent has loaded, so two writers grow
        siblings. With a store that offers ``LinearStore``, this instead
        chains the batch after the last entry in the store at the moment of the
        write, atomically, so every writer's batch lands on one path. The agent
        then ``refresh``-es, taking in what others appended; its leaf is the
        last entry of the log. Returns this call's entries as stored.
        """
        store = self._linear_store("append_linear")
        self._check_not_inside_run("append")
        async with self._lock:
            batch = _chained(items, self._tree.leaf_id)
            if not batch:
                return []
            written = await append_linear_retrying(store, self._session_id, batch)
            await self._refresh()
        return written

    async def refresh(self) -> list[Entry]:
        """Take in the entries other agents and processes appended since the last load.

        Only the new entries are read when the store offers ``LinearStore``
        (otherwise the whole log is). If any arrived, the leaf moves to the
        last of them, as a reopen would put it; if none did, it stays. Returns
        the new entries in append order.
        """
        self._check_not_inside_run("refresh")
        async with self._lock:
            return await self._refresh()

    async def _refresh(self) -> list[Entry]:
        store = self._store
        if isinstance(store, LinearStore):
            loaded = await store.load_entries_after(self._session_id, self._synced_id)
        else:
            loaded = list(await store.load_entries(self._session_id))
            ids = [e.id for e in loaded]
            if self._synced_id in ids:
                loaded = loaded[ids.index(self._synced_id) + 1:]
        if not loaded:
            return []
        new = [e for e in loaded if e.id not in self._tree]
        self._add(new)
        self._synced_id = loaded[-1].id
        self._tree.set_leaf(loaded[-1].id)
        return new

    def _linear_store(self, verb: str) -> LinearStore:
        if not isinstance(self._store, LinearStore):
            raise ConfigError(
                f"{verb} on session {self._session_id!r} needs a store with append_linear and "
                f"load_entries_after (LinearStore); {type(self._store).__name__} has not"
            )
        return self._store

    async def fork(self, session_id: str | None = None) -> DurableAgent:
        """Copy the active path into a new child session and return its agent.

        The child's record has ``parent_id`` set to this session. Entries get
        fresh ids, re-chained in order, each keeping ``origin_id`` = the id it
        copies; all are written in one ``append_entries`` call, so a failed or
        killed fork leaves the child with all of them or none. On error no
        event is published. Calling ``fork`` again with the id of a child that
        a failed fork left behind finishes that fork: an empty child gets the
        copies, a complete copy of the active path is taken as it is.
        """
        child_id = new_id() if session_id is None else check_session_id(session_id)
        self._check_not_inside_run("fork")
        async with self._lock:
            path = self._tree.path()
            copies = await asyncio.to_thread(stored_form, _rechain(path), session_id=child_id)
            try:
                await self._store.create_session(
                    SessionRecord(id=child_id, parent_id=self._session_id, created_at=utcnow())
                )
            except SessionExists:
                if session_id is None:
                    raise
                done = await self._left_by_failed_fork(child_id, path)
                copies = done if done else copies
            else:
                done = []
            if copies and not done:
                with trace.store_span("append", self._store, child_id, copies):
                    await self._store.append_entries(child_id, copies)
            leaf_id = self._tree.leaf_id
        child = DurableAgent(self._factory, store=self._store, session_id=child_id,
                             entries=copies, publisher=self._publisher,
                             compaction=self._compaction, approval=self._approval,
                             budget=self._budget, _opening=_OPENING)
        self._publish(
            [
                SessionForked(session_id=self._session_id, child_id=child_id, leaf_id=leaf_id,
                              entries_copied=len(copies)),
                SessionCreated(session_id=child_id, parent_id=self._session_id),
            ],
            child,
        )
        return child

    async def _left_by_failed_fork(self, child_id: str, path: Sequence[Entry]) -> list[Entry]:
        """The entries of ``child_id`` if an earlier fork of this path left it: none
        (the copy never landed) or exactly the copy. Anything else is refused."""
        existing = list(await self._store.load_entries(child_id))
        load_session = getattr(self._store, "load_session", None)
        parent = (await load_session(child_id)).parent_id if load_session is not None else None
        copied = [_origin(e) for e in existing] == [e.id for e in path]
        if parent == self._session_id and (not existing or copied):
            return existing
        lineage = ("its lineage cannot be read from this store" if load_session is None
                   else f"its parent_id is {parent!r}")
        raise SessionExists(
            child_id,
            f"{self._store!r}; it is not what a failed fork of session {self._session_id!r} "
            f"leaves (it has {len(existing)} entries, {lineage}), so fork will not write "
            f"into it: choose another id, or delete that session first",
        )

    async def compact(
        self,
        summary: str,
        first_kept_entry_id: str,
        *,
        tokens_before: int = 0,
        details: Any = None,
    ) -> CompactionEntry:
        """Append a compaction entry at the leaf.

        From then on the model sees ``summary`` followed by the path from
        ``first_kept_entry_id`` on; the entries before it stay stored.
        """
        entry = CompactionEntry(summary=summary, first_kept_entry_id=first_kept_entry_id,
                                tokens_before=tokens_before, details=details)
        self._check_not_inside_run("compact")
        async with self._lock:
            # Checked under the lock: while waiting for it, the leaf may have moved.
            if all(e.id != first_kept_entry_id for e in self._tree.path()):
                raise AgentError(
                    f"first kept entry {first_kept_entry_id!r} is not on the active path of "
                    f"session {self._session_id!r}"
                )
            (stored,) = await self._append([entry])
        assert isinstance(stored, CompactionEntry)
        self._publish([SessionCompacted(session_id=self._session_id, entry=stored)], stored)
        return stored

    async def compact_with(
        self,
        model: LanguageModel,
        *,
        keep_recent_tokens: int = 20_000,
        instructions: str | None = None,
        abort: asyncio.Event | None = None,
    ) -> CompactionEntry | None:
        """Compact with a summary written by ``model``; None if nothing to fold.

        The kept tail (about ``keep_recent_tokens``) starts at a point that never
        separates a tool call from its result; an earlier compaction's summary
        is folded into the new one. If the model fails, its ``ModelError`` is
        raised and nothing is appended or published.
        """
        self._check_not_inside_run("compact")
        return await compact_agent(self, model, keep_recent_tokens=keep_recent_tokens,
                                   instructions=instructions, abort=abort)

    def run(self, input: RunInput, *, abort: asyncio.Event | None = None,
            observe: Callable[[RunEvent], None] | None = None) -> Run:
        """Run the loop on ``input``; iterate the result for events.

        Every event is forwarded only after what it reports is stored:
        ``RunStarted`` after the input is appended, each ``MessageEnd`` as a
        ``StoredMessageEnd`` after its message is appended. If a store write
        fails, the event is not forwarded, the loop is cancelled and the error
        is raised to the consumer. Stopping early (``break``, ``aclose``, task
        cancellation) aborts the loop and stores what it ended with. Setting
        ``abort`` winds the loop down the same way while the events keep
        coming: the message streaming then ends ``aborted``, is stored and
        reported, and ``AgentEnd`` follows (the run sets ``abort`` itself when
        its consumer leaves). ``observe(event)`` is called with each event
        (receipts once stored) in the run's own task, as it happens, and the
        ``MessageUpdate`` events (stream deltas) go to it alone, not to the
        iterator: a relay then costs no hand-off per delta. It must not block.

        The run holds the session until it ends: ``append``, ``fork`` and
        ``compact`` from other tasks wait for it, and from the task iterating
        the run (inside the ``async for``) they raise ``AgentError`` rather
        than wait for themselves. After ``break`` the event loop closes the
        abandoned run; a later mutation waits for that. If you keep the
        ``Run`` object, close it (``aclose`` or ``async with``) first.
        """
        factory = self._require_factory()
        messages = _as_messages(input)
        return Run(lambda owner: self._run(factory, messages, owner, abort=abort,
                                           observe=observe))

    async def stop(self, run_id: str | None = None, *, reason: str = "",
                   by: str = "") -> Entry | None:
        """Ask the session's live run (``durable.LiveRuns``) to stop, from any process.

        Appends a durable stop record for the active run (for ``run_id`` only if
        that one is active); the process that owns the run sees it and ends the
        run with stop reason ``stopped``, keeping what was generated as an
        aborted message. Returns the record, or None when no such run is active.
        """
        return await request_stop(self._store, self._session_id, run_id, reason=reason, by=by)

    # -- durable tool execution (durable/_effects.py) --------------------------

    def continue_run(self) -> Run:
        """Continue a run a crash or an approval cut short, in any process.

        Reloads the session first (decisions made elsewhere count), then
        finishes the turn at the leaf: calls that never started run, in-doubt
        calls follow their tool's ``replay`` policy, approved calls run, denied
        ones get a result saying so; then the model's next turn, with receipts
        as in ``run``. With nothing to continue it yields only ``RunStarted``.
        """
        factory = self._require_factory()
        return Run(lambda owner: self._run(factory, [], owner, resume=True))

    async def approve(self, call_id: str, *, reason: str = "", by: str = "") -> Entry:
        """Approve a pending call; the first decision in log order counts.

        Raises ``ApprovalError`` if the call is not pending, ``DecisionConflict``
        if another process decided it first. Continue with ``continue_run()``.
        """
        return await self._decide(call_id, approved=True, reason=reason, by=by)

    async def deny(self, call_id: str, reason: str, *, by: str = "") -> Entry:
        """Deny a pending call; on ``continue_run`` the model is told it did not run, and why."""
        return await self._decide(call_id, approved=False, reason=reason, by=by)

    def pending_approvals(self) -> list[effects.PendingApproval]:
        """Calls at the leaf awaiting a decision (as loaded; ``approve`` reloads)."""
        return effects.pending(self)

    def in_doubt(self) -> list[effects.CallState]:
        """Calls on the active path that started and may or may not have had their effect."""
        return effects.in_doubt(self)

    def tool_calls(self) -> list[effects.CallState]:
        """The calls of the turn at the leaf, classified (never started, in doubt, ...)."""
        return effects.call_states(self)

    async def _decide(self, call_id: str, *, approved: bool, reason: str, by: str) -> Entry:
        """Append a decision for ``call_id``'s pending request under the first-decision rule."""
        self._check_not_inside_run("decide on")
        async with self._lock:
            await self._reload()
            decision = effects.decision_for(self, call_id, approved=approved, reason=reason,
                                            by=by)
            (mine,) = await self._append([decision])
            await self._reload()
            effects.check_first(self, mine)
            return mine

    async def _reload(self) -> None:
        """Take in what other processes appended; follow them if they extended our leaf.

        The index is rebuilt in the store's order, which decides between decisions.
        """
        entries = await load(self._store, self._session_id)
        leaf = self._tree.leaf_id
        known = {e.id for e in self._tree}
        tree = TreeIndex(entries, session_id=self._session_id)
        for entry in entries:
            if entry.id not in known and entry.parent_id == leaf:
                leaf = entry.id
        tree.set_leaf(leaf)
        self._tree = tree
        self._synced_id = entries[-1].id if entries else None  # what refresh reads after (S32)

    def _require_factory(self) -> Factory:
        if self._factory is None:
            raise NoLoopError(
                f"session {self._session_id!r} was opened without a factory, so it has no "
                "agent loop to run; pass durable.model(...) or another factory to open()"
            )
        return self._factory

    # -- internals -------------------------------------------------------------

    async def _append(
        self, items: Sequence[Message | Entry], *, shielded: bool = True
    ) -> list[Entry]:
        batch = _chained(items, self._tree.leaf_id)
        if not batch:
            return []
        # Hold copies of what the store keeps, not the caller's objects: a
        # dict the caller mutates later must not change this agent's view.
        if len(batch) > _CHECK_INLINE:  # long enough to stall the event loop
            batch = await asyncio.to_thread(stored_form, batch, session_id=self._session_id)
        else:
            batch = stored_form(batch, session_id=self._session_id)
        if not shielded:
            await self._write(batch)
            self._add(batch)
            return batch
        write = asyncio.ensure_future(self._write(batch))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # The write may already be on disk: finish it so memory matches the
            # store, then let the cancellation continue.
            try:
                await write
            except Exception:
                # The caller only learns it was cancelled; say what became of the write.
                log.exception("session %s: an append interrupted by cancellation failed; "
                              "its %d entries may not be stored", self._session_id, len(batch))
                raise asyncio.CancelledError() from None
            self._add(batch)
            raise
        self._add(batch)
        return batch

    async def _write(self, batch: list[Entry]) -> None:
        """Store ``batch``, retrying."""
        with trace.store_span("append", self._store, self._session_id, batch):
            try:
                await self._store.append_entries(self._session_id, batch)
            except StoreUnavailable as exc:
                await retry_append(self._store, self._session_id, batch, exc)

    def _check_not_inside_run(self, verb: str) -> None:
        # The run holds the lock while its consumer handles an event; a
        # mutation from that consumer would wait for itself forever. A run
        # left by ``break`` (its generator gone) is being closed by the
        # event loop, so waiting for it is fine.
        owner = self._run_owner() if self._run_owner is not None else None
        if owner is not None and self._run_task is asyncio.current_task():
            raise AgentError(
                f"cannot {verb} session {self._session_id!r} from inside its own run: the "
                "run holds the session until it ends; leave the loop first (or use another "
                "task, which waits for the run)"
            )

    def _add(self, batch: Sequence[Entry]) -> None:
        for entry in batch:
            self._tree.add(entry)

    async def _repair(self) -> None:
        path = self._tree.path()
        held = effects.held_calls(path)  # the ledger's to settle, on resume (S20)
        results = [r for r in orphaned_results(path) if r.tool_call_id not in held]
        if results:
            async with self._lock:
                self.repaired = tuple(await self._append(results))
            log.info("session %s: answered %d interrupted tool call(s)",
                     self._session_id, len(results))

    async def _run(
        self, factory: Factory, input: list[Message], owner: list[weakref.ref[Any]],
        resume: bool = False, *, abort: asyncio.Event | None = None,
        observe: Callable[[RunEvent], None] | None = None,
    ) -> AsyncGenerator[RunEvent, None]:
        if self._compaction is not None and not resume:
            await maybe_compact(self, self._compaction, factory, input)
        async with self._lock:
            self._run_task = asyncio.current_task()
            self._run_owner = owner[0]
            try:
                turn: ResumeTurn | None = None
                if resume:
                    await self._reload()
                    plan = effects.resume_plan(self)
                    if plan is None:
                        yield RunStarted(session_id=self._session_id, entries=())
                        return
                    context, turn = plan
                else:
                    effects.check_settled(self)
                    context = build_context(self._tree.path())
                input_entries = await self._append(input)
                yield RunStarted(session_id=self._session_id, entries=tuple(input_entries))
                # The loop runs in its own task so that however the consumer
                # leaves (break, aclose, cancellation) the loop only ever sees
                # the abort signal, winds down, and its tail gets stored.
                pump = _Pump(self, factory, context, input, input_entries, resume=turn,
                             abort=abort, observe=observe)
                channel = pump.channel
                items = channel.items
                take = items.popleft
                try:
                    while True:
                        # What is buffered is handed over inline: a method
                        # call per event costs a fair share of the event.
                        while items:
                            yield take()
                        waiter = channel.waiter()
                        if waiter is None:
                            break
                        await waiter
                finally:
                    await pump.detach()
                if self._title is not None and not resume:
                    titled = await title_after_first_exchange(
                        self._session_id, self.metadata, self.messages(), self._title)
                    if titled:
                        await self._append(titled)
            finally:
                self._run_task = self._run_owner = None

    def _publish(self, events: list[LifecycleEvent], result: Any) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        publish = publisher.publish if hasattr(publisher, "publish") else publisher
        first_error: BaseException | None = None
        for event in events:
            try:
                publish(event)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise PublishError(
                f"session {self._session_id!r}: the publisher raised "
                f"{type(first_error).__name__}: {first_error} (the change itself is stored)",
                result,
            ) from first_error

    def watch(self, after: str | None = None) -> AsyncIterator[Entry]:
        """Follow this session as any agent, in any process, appends to it.

        The entries after entry ``after`` (None: from the first), then new
        ones as they are stored; see ``WatchableStore.watch``. This agent's
        own view (tree, leaf) does not change. Raises ``AgentError`` when the
        store cannot watch.
        """
        if not isinstance(self._store, WatchableStore):
            raise AgentError(f"session {self._session_id!r}: {type(self._store).__name__} "
                             f"offers no watch(); use a store that does (every built-in one)")
        return self._store.watch(self._session_id, after)


# How far the loop may run ahead of a slow consumer. Everything queued is
# already stored; the slack lets a burst of stream deltas reach the consumer
# without a task switch per event.
_QUEUE_SIZE = 256


class _Pump:
    """Drives the inner loop in its own task, storing before forwarding."""

    def __init__(
        self,
        agent: DurableAgent,
        factory: Factory,
        context: list[Message],
        input: list[Message],
        input_entries: list[Entry],
        *,
        resume: ResumeTurn | None,
        abort: asyncio.Event | None = None,
        observe: Callable[[RunEvent], None] | None = None,
    ) -> None:
        self._agent = agent
        self._observe = observe
        self._tree, self._session_id = agent._tree, agent._session_id
        self._resume = resume
        self._ledger: effects.Ledger | None = None
        # A run that started with nothing to track (S41): its gate, its loop's
        # tools, and a copy of them as they were when last found untracked.
        self._plain: effects.PlainGate | None = None
        self._tools: dict[str, Tool] = {}
        self._untracked: dict[str, Tool] = {}
        self._abort = asyncio.Event() if abort is None else abort
        self.channel: Channel[RunEvent] = Channel(_QUEUE_SIZE)
        self._pending_input = list(input_entries)
        self._detached = False
        main = self._main(factory, context, input)
        self._span: list[Any] = []
        if trace.tracer() is not None:
            main = traced_run(main, self._session_id, agent._store, input_entries, self._span)
        self._task = asyncio.create_task(main)

    async def detach(self) -> None:
        """The consumer is done: abort the loop if it still runs and wait for its tail."""
        if self._task.done():
            return
        self._detached = True
        self._abort.set()
        self.channel.clear()  # unblock a producer waiting for the consumer
        # Keep the session until the tail is stored, even through repeated
        # cancellation: releasing it early would let the next mutation
        # interleave with the tail.
        cancelled = False
        while not self._task.done():
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    def _events(self, factory: Factory, context: list[Message],
                input: list[Message]) -> AsyncIterator[AgentEvent]:
        loop = factory()
        agent = self._agent
        budget = agent._budget
        check = None if budget is None else model_check(
            BudgetTracker(budget, agent._store, agent._session_id), agent._append)
        if isinstance(loop, AgentLoop):
            approval = agent._approval
            # A lambda, not the bound method: a reload replaces the tree.
            blobs = blob_reader(agent._store, self._session_id,
                                lambda: agent._tree.path())  # noqa: PLW0108
            if self._resume is None and effects.nothing_to_track(loop.tools, approval):
                gate = effects.PlainGate()
                self._plain, self._tools, self._untracked = gate, loop.tools, dict(loop.tools)
                return loop.run(context, input, abort=self._abort, gate=gate, blobs=blobs,
                                before_model=check)
            self._ledger = effects.Ledger(agent, agent._append, loop.tools, approval)
            return loop.run(context, input, abort=self._abort, gate=self._ledger,
                            resume=self._resume, blobs=blobs, before_model=check)
        if self._resume is not None:
            raise AgentError(
                f"session {self._agent.session_id!r}: continue_run() needs a loop that runs "
                f"tools itself (durable.model); {type(loop).__name__} cannot finish "
                "the calls left open"
            )
        if check is not None:  # a loop with no hook: checked once, before it starts
            return checked_first(check, loop.run(context, input, abort=self._abort), input)
        return loop.run(context, input, abort=self._abort)

    async def _main(self, factory: Factory, context: list[Message], input: list[Message]) -> None:
        events: AsyncIterator[AgentEvent] | None = None
        channel = self.channel
        items = channel.items
        put = items.append
        limit = channel.limit
        try:
            events = self._events(factory, context, input)
            events = events if not self._span else traced_events(events, self._span[0])
            events = events if self._observe is None else _observed(events, self._observe)
            ledger = self._ledger
            # Channel.put inline: this runs for every event of the run. Once
            # the consumer left, what is put is dropped when the buffer fills.
            observe = self._observe
            put = put if observe is None else _observing(put, observe)
            async for event in events:
                if isinstance(event, MessageEnd):
                    receipt = self._store(event.message)
                    if not isinstance(receipt, StoredMessageEnd):
                        receipt = await receipt
                    put(receipt)
                    ledger = self._ledger  # a plain run may have taken one (S41)
                else:
                    put(event)
                if channel.getter is not None:
                    channel.wake()
                if ledger is not None and ledger.notices:
                    for notice in ledger.drain():
                        put(notice)
                if len(items) >= limit:
                    await channel.room()
            channel.close()
        except Exception as exc:
            if self._detached:
                log.exception(
                    "session %s: storing an aborted run's tail failed; crash repair will "
                    "answer its open tool calls on next open", self._agent.session_id)
            channel.close(exc)
        finally:
            if events is not None:
                await _aclose(events)

    def _store(self, message: Message, *, plain: bool = False
               ) -> StoredMessageEnd | Awaitable[StoredMessageEnd]:
        """Store ``message`` and give its receipt, or an awaitable of it.

        The usual message, one entry on a store that takes it at once (the
        memory store), is stored here, without a coroutine; the run's input
        and a message whose calls the ledger records go through ``_storing``
        (``plain``: that is done).
        """
        if not plain and (self._pending_input or (
                isinstance(message, AssistantMessage)
                and (self._ledger is not None
                     or (self._plain is not None and self._tools != self._untracked
                         and self._track_from_now() is not None))
                and _calls_tools(message))):
            return self._storing(message)
        tree, store, session_id = self._tree, self._agent._store, self._session_id
        entry = MessageEntry(id=new_id(), parent_id=tree.leaf_id, timestamp=utcnow(),
                             message=message)
        # One check gives the copy held; the store checks what it is given.
        held = check_entry(entry, session_id)[1]
        if trace.tracer() is not None:
            return self._stored_after(traced_append(store, session_id, held), message, held)
        return self._stored_after(store.append_entries(session_id, (held,)), message, held)

    async def _stored_after(self, write: Awaitable[None], message: Message, held: Entry,
                            *, retrying: bool = False) -> StoredMessageEnd:
        # The pump task is never cancelled (detach shields it): no shield here.
        agent = self._agent
        try:
            await write
        except StoreUnavailable as exc:
            if retrying:
                raise
            await retry_append(agent._store, agent._session_id, (held,), exc)
        agent._tree.add(held)
        return StoredMessageEnd(message, (held,))

    async def _storing(self, message: Message) -> StoredMessageEnd:
        pending = self._pending_input
        if pending and _same_input(pending[0], message):
            return StoredMessageEnd(message=message, entries=(pending.pop(0),))
        if isinstance(message, AssistantMessage) and _calls_tools(message):
            ledger = self._ledger
            if ledger is None and self._plain is not None:
                ledger = self._track_from_now()
            records = await ledger.records_for(message) if ledger is not None else []
            if ledger is not None and records:
                written = await self._agent._append([message, *records], shielded=False)
                ledger.stored(written)
                return StoredMessageEnd(message=message, entries=tuple(written))
        receipt = self._store(message, plain=True)
        return receipt if isinstance(receipt, StoredMessageEnd) else await receipt

    def _track_from_now(self) -> effects.Ledger | None:
        """The ledger, made now, if the run's tools changed (a tool added or replaced) so
        that a call can be tracked."""
        gate, tools = self._plain, self._tools
        assert gate is not None
        if tools == self._untracked:  # the same tool objects: the usual case, a C compare
            return None
        approval = self._agent._approval
        if effects.nothing_to_track(tools, approval):
            self._untracked = dict(tools)
            return None
        self._ledger = gate.ledger = effects.Ledger(self._agent, self._agent._append, tools,
                                                    approval)
        self._plain = None
        return self._ledger


class Run:
    """The event stream of one durable run.

    Iterate it (``async for``). Use ``async with agent.run(...) as run`` to be
    sure the run is wound down and its tail stored before the block exits
    even if you stop early.
    """

    __slots__ = ("__weakref__", "_gen")

    def __init__(
        self, start: Callable[[list[weakref.ref[Any]]], AsyncGenerator[RunEvent, None]]
    ) -> None:
        # The run knows its consumer is still there by a weak reference to
        # the generator: a run left with break must stay collectable, which
        # is what closes it.
        owner: list[weakref.ref[Any]] = []
        self._gen = cast("AsyncGeneratorType[RunEvent, None]", start(owner))
        owner.append(weakref.ref(self._gen))

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        # The generator itself: ``async for`` then steps it in C, with no
        # Python call of ours per event.
        return self._gen

    def __anext__(self) -> Awaitable[RunEvent]:
        return self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def collect(self) -> list[RunEvent]:
        """Consume the whole run and return its events."""
        return [event async for event in self]


_MESSAGE_TYPES = (UserMessage, AssistantMessage, ToolResultMessage)


def _as_messages(input: RunInput) -> list[Message]:
    if isinstance(input, str):
        return [UserMessage.of(input)]
    if isinstance(input, _MESSAGE_TYPES):
        return [input]
    messages = list(input)
    for m in messages:
        if not isinstance(m, _MESSAGE_TYPES):
            raise AgentError(f"run input must be a string or messages, got {type(m).__name__}")
    return messages


def _to_entry(item: Message | Entry, parent: str | None) -> Entry:
    if isinstance(item, _MESSAGE_TYPES):
        # Every field given: msgspec's default factories cost a call each.
        return MessageEntry(id=new_id(), parent_id=parent, timestamp=utcnow(), message=item)
    if isinstance(item, OpaqueEntry):
        return rechain_opaque(item, id=new_id(), parent_id=parent)
    return msgspec.structs.replace(item, id=new_id(), parent_id=parent, timestamp=utcnow())


def _chained(items: Sequence[Message | Entry], parent: str | None) -> list[Entry]:
    batch: list[Entry] = []
    for item in items:
        entry = _to_entry(item, parent)
        batch.append(entry)
        parent = entry.id
    return batch


def _calls_tools(message: AssistantMessage) -> bool:
    # ``message.tool_calls`` builds a tuple, any() a generator; this only looks.
    for part in message.content:  # noqa: SIM110
        if isinstance(part, ToolCall):
            return True
    return False


def _same_input(entry: Entry, message: Message) -> bool:
    return isinstance(entry, MessageEntry) and entry.message == message


def _origin(entry: Entry) -> str | None:
    if isinstance(entry, OpaqueEntry):
        origin = msgspec.json.decode(entry.raw).get("origin_id")
        return origin if isinstance(origin, str) else None
    return entry.origin_id


def _rechain(path: Sequence[Entry]) -> list[Entry]:
    ids: dict[str, str] = {}
    out: list[Entry] = []
    parent: str | None = None
    for entry in path:
        new = new_id()
        ids[entry.id] = new
        if isinstance(entry, OpaqueEntry):
            copy: Entry = rechain_opaque(entry, id=new, parent_id=parent)
        else:
            copy = msgspec.structs.replace(entry, id=new, parent_id=parent, origin_id=entry.id)
            if isinstance(copy, CompactionEntry) and copy.first_kept_entry_id in ids:
                copy = msgspec.structs.replace(
                    copy, first_kept_entry_id=ids[copy.first_kept_entry_id]
                )
        out.append(copy)
        parent = new
    return out


async def _observed(events: AsyncIterator[AgentEvent],
                    observe: Callable[[RunEvent], None]) -> AsyncIterator[AgentEvent]:
    """``events``, the stream deltas handed to ``observe`` instead (no hand-off each)."""
    try:
        async for event in events:
            if type(event) is MessageUpdate:
                observe(event)
            else:
                yield event
    finally:
        await _aclose(events)


def _observing(put: Callable[[RunEvent], None],
               observe: Callable[[RunEvent], None]) -> Callable[[RunEvent], None]:
    def observed(event: RunEvent) -> None:
        observe(event)
        put(event)

    return observed


async def _aclose(events: AsyncIterator[AgentEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
