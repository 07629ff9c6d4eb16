"""A session's budget, checked before each model call.

The check reads what the store holds, not a counter in this process: before
each model call of a run, the session's log is read from the last entry seen
(``load_entries_after`` on a ``LinearStore``, the whole log otherwise), the
stored usage added up as ``usage(scope="session")`` does, and the call's own
input estimated (``estimate_tokens`` over the request, priced as input).
When that would go over the budget, a ``threadline.budget`` record is
appended and the run ends with ``BudgetExceeded`` (stop reason ``budget``).

It is a check, not a reservation: two processes running on one session at
the same moment may each pass it once before either call's usage is stored,
so a session can go over by what the calls in flight at that moment use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec

from threadline.agent._events import AgentEnd, AgentEvent, AgentStart, MessageEnd, MessageStart
from threadline.ai import _trace as trace
from threadline.ai._messages import Message, Usage
from threadline.ai._model import ModelInfo, Request
from threadline.durable._compaction import estimate_tokens
from threadline.durable._usage import PriceTable, UsageItem, cost_of, price_for, usage_items
from threadline.errors import BudgetExceeded, ConfigError, EntryNotFound
from threadline.session._entries import CustomEntry, Entry, register_custom
from threadline.stores._contract import LinearStore, Store

__all__ = ["BUDGET_KIND", "Budget", "BudgetStop", "BudgetTracker"]

BUDGET_KIND = "threadline.budget"


@dataclass(frozen=True, slots=True)
class Budget:
    """The most one session may spend: tokens, cost, or both.

    ``max_tokens`` bounds ``Usage.total_tokens`` (input, output and cache)
    over every call stored in the session (``usage(scope="session")``: a
    fork's copies of its parent's calls are not its spending). ``max_cost``
    bounds the cost at ``prices`` (required with it); a call to a model the
    table has no price for is refused, since its cost cannot be known.
    ``estimate``: count the next call's input, estimated from its request,
    before making it (off: refuse only once the stored total has reached
    the bound).
    """

    max_tokens: int | None = None
    max_cost: float | None = None
    prices: PriceTable | None = None
    estimate: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens is None and self.max_cost is None:
            raise ConfigError("a Budget needs max_tokens, max_cost or both")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ConfigError(f"budget max_tokens must be >= 0, got {self.max_tokens}")
        if self.max_cost is not None and not self.max_cost >= 0:
            raise ConfigError(f"budget max_cost must be >= 0, got {self.max_cost}")
        if self.max_cost is not None and self.prices is None:
            raise ConfigError("a Budget with max_cost needs prices=")


class BudgetStop(msgspec.Struct, frozen=True, kw_only=True):
    """The stored record of a run stopped by its budget (a ``threadline.budget`` entry)."""

    limit: Literal["tokens", "cost"]
    maximum: float
    spent: float
    estimate: float
    model: str = ""
    """``provider:model`` of the call that was not made."""


register_custom(BUDGET_KIND, BudgetStop)


class BudgetTracker:
    """The stored spending of one session, read on from where it last looked."""

    def __init__(self, budget: Budget, store: Store, session_id: str) -> None:
        self.budget = budget
        self._store = store
        self.session_id = self._session_id = session_id
        self._last: str | None = None
        self._seen: set[str] = set()
        self._items: list[UsageItem] = []

    async def spent(self) -> list[UsageItem]:
        """Every call's usage the session holds now (copies from a parent left out)."""
        store, sid = self._store, self._session_id
        new: list[Entry]
        with trace.store_span("load", store, sid) as span:
            if isinstance(store, LinearStore):
                try:
                    new = await store.load_entries_after(sid, self._last)
                except EntryNotFound:  # the log was rebuilt under us: read it all again
                    self._last, self._seen, self._items = None, set(), []
                    new = await store.load_entries_after(sid, None)
            else:
                self._seen, self._items = set(), []
                new = list(await store.load_entries(sid))
            trace.loaded(span, new)
        fresh = [e for e in new if e.id not in self._seen]
        self._seen.update(e.id for e in fresh)
        self._items.extend(i for i in usage_items(sid, fresh) if not i.copied)
        if new:
            self._last = new[-1].id
        return self._items

    async def refusal(self, request: Request | None, info: ModelInfo | None
                      ) -> BudgetStop | None:
        """What stops the next call, or None to make it."""
        budget = self.budget
        items = await self.spent()
        est = (sum(estimate_tokens(m) for m in request.messages) + _system(request)
               if request is not None and budget.estimate else 0)
        model = f"{info.provider}:{info.id}" if info is not None else ""
        if budget.max_tokens is not None:
            used = sum((i.usage for i in items), Usage()).total_tokens
            if used + est > budget.max_tokens or used >= budget.max_tokens:
                return BudgetStop(limit="tokens", maximum=float(budget.max_tokens),
                                  spent=float(used), estimate=float(est), model=model)
        if budget.max_cost is not None:
            prices = budget.prices
            assert prices is not None
            cost = 0.0
            for item in items:
                price = price_for(prices, item.provider, item.model)
                if price is None:
                    raise ConfigError(
                        f"session {self._session_id!r}: the budget's price table has no price "
                        f"for {item.model_key!r}, so its spending cannot be known")
                cost += cost_of(item.usage, price)
            next_price = price_for(prices, info.provider, info.id) if info is not None else None
            if info is not None and next_price is None:
                raise ConfigError(
                    f"session {self._session_id!r}: the budget's price table has no price "
                    f"for {model!r}, the model this run calls")
            next_cost = 0.0 if next_price is None else cost_of(Usage(input_tokens=est), next_price)
            if cost + next_cost > budget.max_cost or cost >= budget.max_cost:
                return BudgetStop(limit="cost", maximum=float(budget.max_cost),
                                  spent=cost, estimate=next_cost, model=model)
        return None


def _system(request: Request) -> int:
    return len((request.system or "").encode()) // 4


def exceeded(session_id: str, stop: BudgetStop) -> BudgetExceeded:
    return BudgetExceeded(session_id, stop.limit, stop.spent, stop.estimate, stop.maximum)


def stop_entry(stop: BudgetStop) -> CustomEntry[BudgetStop]:
    return CustomEntry(kind=BUDGET_KIND, data=stop)


Check: TypeAlias = Callable[[Request | None, ModelInfo | None],
                         Awaitable[BaseException | None]]
"""A ``BeforeModelCall`` that also takes no request (a loop with no hook, checked once)."""


def model_check(tracker: BudgetTracker, append: Callable[[list[Entry]], Awaitable[object]]
                ) -> Check:
    """The loop's ``before_model`` hook: refuse a call over budget, storing why first."""

    async def check(request: Request | None, info: ModelInfo | None) -> BaseException | None:
        try:
            stop = await tracker.refusal(request, info)
            if stop is None:
                return None
            await append([stop_entry(stop)])
        except Exception as exc:  # the loop ends the run with it (AgentEnd.error)
            return exc
        return exceeded(tracker.session_id, stop)

    return check


async def refused_run(error: BaseException, input: Sequence[Message]
                      ) -> AsyncIterator[AgentEvent]:
    """A run of a loop that takes no hook, ended by the budget before it started."""
    yield AgentStart()
    for message in input:
        yield MessageStart(message)
        yield MessageEnd(message)
    yield AgentEnd(tuple(input), error)


async def checked_first(check: Check, events: AsyncIterator[AgentEvent], input: list[Message]
                        ) -> AsyncIterator[AgentEvent]:
    """``events`` of a loop that takes no hook, checked once before it starts."""
    try:
        refused = await check(None, None)
        source = events if refused is None else refused_run(refused, input)
        async for event in source:
            yield event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
