"""Token usage and cost, added up from the log.

Every model call the library makes leaves its provider-reported ``Usage`` in
the log: an assistant message carries it, a compaction entry made by
``compact_with`` keeps its summary call's in ``details["usage"]``, and any
other call (a generated title, an application's own side call) is a
``threadline.usage`` custom entry holding a ``UsageRecord``. Nothing else is
counted, and nothing is estimated.

Forks. A fork copies its parent's active path, and each copy keeps
``origin_id`` (the entry it copies). A copy never counts as spending: the
provider billed its original once, in the session that made the call. So the
session-wide scopes leave copies out, and summing ``session`` over every
session of a fork tree gives exactly what the providers reported. ``path``
is the exception on purpose: it is what the conversation as it now reads cost
to produce, the part paid before the fork included.

Prices are the application's: a table per provider and model, per million
tokens of each kind, in whatever currency it chooses. No price ships with the
library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias, cast

import msgspec

from threadline.ai._messages import AssistantMessage, Usage
from threadline.errors import ConfigError
from threadline.session._entries import (
    CompactionEntry,
    CustomEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    register_custom,
)
from threadline.session._tree import TreeIndex
from threadline.stores._contract import CatalogStore, Store


class _Agent(Protocol):
    """What ``usage`` reads of a ``DurableAgent`` (named here, not imported: it imports us)."""

    @property
    def session_id(self) -> str: ...
    @property
    def store(self) -> Store: ...
    @property
    def entries(self) -> list[Entry]: ...
    @property
    def tree(self) -> object: ...
    def path(self) -> list[Entry]: ...

__all__ = [
    "USAGE_KIND",
    "Cost",
    "Price",
    "PriceTable",
    "Scope",
    "UsageItem",
    "UsageRecord",
    "UsageReport",
    "cost_of",
    "group_key",
    "read_prices",
    "usage",
    "usage_items",
]

USAGE_KIND = "threadline.usage"

Scope: TypeAlias = Literal["path", "branch", "session", "with_forks"]
SCOPES: tuple[Scope, ...] = ("path", "branch", "session", "with_forks")

Source: TypeAlias = Literal["message", "compaction", "record"]


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The usage of a model call made outside the transcript (a title, a side question).

    Append it as ``CustomEntry(kind="threadline.usage", data=UsageRecord(...))``;
    ``purpose`` says what the call was for (``"title"``, ...).
    """

    provider: str = ""
    model: str = ""
    usage: Usage = Usage()
    purpose: str = ""


register_custom(USAGE_KIND, UsageRecord)


class UsageItem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model call's usage, where it is stored."""

    session_id: str
    entry_id: str
    timestamp: datetime | None
    provider: str
    model: str
    usage: Usage
    source: Source = "message"
    """``message`` (an assistant reply), ``compaction`` (a summary call) or
    ``record`` (a ``UsageRecord``)."""
    copied: bool = False
    """A fork's copy of an entry of its parent (counted only by scope ``path``)."""

    @property
    def model_key(self) -> str:
        return f"{self.provider}:{self.model}"


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one model costs per million tokens of each kind, in the application's currency.

    ``cache_read`` and ``cache_write`` default to the ``input`` price. Reasoning
    tokens are part of the output tokens providers report, so they have no
    price of their own.
    """

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_read", "cache_write"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and value != float("inf")):
                raise ConfigError(f"price {name} must be a finite number >= 0, got {value!r}")


PriceTable: TypeAlias = Mapping[str, Mapping[str, Price]]
"""provider -> model -> ``Price``; a model ``"*"`` prices every other model of that provider."""


def read_prices(data: bytes | str) -> dict[str, dict[str, Price]]:
    """A price table from JSON: ``{"openai": {"gpt-x": {"input": 2.5, "output": 10}}}``."""
    try:
        return msgspec.json.decode(data, type=dict[str, dict[str, Price]])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"price table: {exc}") from exc


def price_for(prices: PriceTable, provider: str, model: str) -> Price | None:
    models = prices.get(provider)
    if models is None:
        return None
    return models.get(model) or models.get("*")


def cost_of(usage: Usage, price: Price) -> float:
    """What ``usage`` costs at ``price``."""
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    return (usage.input_tokens * price.input + usage.output_tokens * price.output
            + usage.cache_read_tokens * read + usage.cache_write_tokens * write) / 1_000_000


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    """The priced part of a report: the total, per ``provider:model``, and what has no price."""

    total: float
    by_model: dict[str, float]
    unpriced: tuple[str, ...] = ()
    """``provider:model`` keys with usage that the table has no price for (not in ``total``)."""


class UsageReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``usage()`` found: every call's usage in ``items``, in log order."""

    session_id: str
    scope: Scope
    items: tuple[UsageItem, ...]
    sessions: tuple[str, ...] = ()
    """The sessions read (more than one for ``with_forks``)."""

    @property
    def total(self) -> Usage:
        total = Usage()
        for item in self.items:
            total = total + item.usage
        return total

    @property
    def calls(self) -> int:
        return len(self.items)

    def by(self, key: Literal["model", "day", "session", "source"]) -> dict[str, Usage]:
        """Totals grouped by ``provider:model``, UTC day (``YYYY-MM-DD``), session or source."""
        groups: dict[str, Usage] = {}
        for item in self.items:
            name = group_key(item, key)
            groups[name] = groups.get(name, Usage()) + item.usage
        return groups

    def cost(self, prices: PriceTable) -> Cost:
        """The cost of every item at ``prices``; a model with no price is listed, not guessed."""
        by_model: dict[str, float] = {}
        unpriced: list[str] = []
        for name, used in self.by("model").items():
            provider, _, model = name.partition(":")
            price = price_for(prices, provider, model)
            if price is None:
                unpriced.append(name)
            else:
                by_model[name] = cost_of(used, price)
        return Cost(total=sum(by_model.values()), by_model=by_model, unpriced=tuple(unpriced))

    def cost_by(self, key: Literal["model", "day", "session", "source"],
                prices: PriceTable) -> dict[str, float]:
        """The priced cost grouped as ``by(key)``; unpriced calls count nothing."""
        groups: dict[str, float] = {}
        for item in self.items:
            price = price_for(prices, item.provider, item.model)
            name = group_key(item, key)
            groups[name] = groups.get(name, 0.0) + (
                0.0 if price is None else cost_of(item.usage, price))
        return groups


def group_key(item: UsageItem, key: str) -> str:
    """The group ``item`` falls in for ``UsageReport.by(key)``."""
    if key == "model":
        return item.model_key
    if key == "day":
        return item.timestamp.date().isoformat() if item.timestamp is not None else "unknown"
    if key == "session":
        return item.session_id
    if key == "source":
        return item.source
    raise ConfigError(f"usage can be grouped by model, day, session or source, not {key!r}")


def usage_items(session_id: str, entries: Iterable[Entry]) -> list[UsageItem]:
    """Every call's usage stored in ``entries``, copies marked ``copied``."""
    items: list[UsageItem] = []
    for entry in entries:
        if isinstance(entry, OpaqueEntry):
            continue
        item = _item(session_id, entry)
        if item is not None:
            items.append(item)
    return items


def _item(session_id: str, entry: Entry) -> UsageItem | None:
    assert not isinstance(entry, OpaqueEntry)
    source: Source
    if isinstance(entry, MessageEntry):
        message = entry.message
        if not isinstance(message, AssistantMessage) or message.usage == _NONE:
            return None
        provider, model, used, source = message.provider, message.model, message.usage, "message"
    elif isinstance(entry, CompactionEntry):
        record = _compaction_usage(entry.details)
        if record is None:
            return None
        provider, model, used, source = record.provider, record.model, record.usage, "compaction"
    elif isinstance(entry, CustomEntry) and entry.kind == USAGE_KIND:
        data = entry.data
        if isinstance(data, msgspec.Raw):  # decoded before this module registered the kind
            try:
                data = msgspec.json.decode(data, type=UsageRecord)
            except msgspec.MsgspecError:
                return None
        if not isinstance(data, UsageRecord):
            return None
        provider, model, used, source = data.provider, data.model, data.usage, "record"
    else:
        return None
    return UsageItem(session_id=session_id, entry_id=entry.id, timestamp=entry.timestamp,
                     provider=provider, model=model, usage=used, source=source,
                     copied=entry.origin_id is not None)


_NONE = Usage()


def compaction_details(provider: str, model: str, used: Usage) -> dict[str, Any]:
    """What ``compact_with`` adds to a compaction's ``details`` for its summary call."""
    return {"usage": {"provider": provider, "model": model, **msgspec.to_builtins(used)}}


def _compaction_usage(details: Any) -> UsageRecord | None:
    if not isinstance(details, dict):
        return None
    raw = details.get("usage")
    if not isinstance(raw, dict):
        return None
    try:
        fields = {k: v for k, v in raw.items() if k not in ("provider", "model")}
        used = msgspec.convert(fields, Usage)
        return UsageRecord(provider=str(raw.get("provider", "")),
                           model=str(raw.get("model", "")), usage=used)
    except msgspec.MsgspecError:
        return None


def scoped(scope: Scope, session_id: str, entries: Sequence[Entry],
           path: Sequence[Entry] | None = None) -> list[UsageItem]:
    """The items of one session for ``scope`` (``with_forks`` counts as ``session`` here)."""
    if scope in ("path", "branch"):
        on_path = (list(path) if path is not None
                   else TreeIndex(entries, session_id=session_id).path())
        items = usage_items(session_id, on_path)
        return items if scope == "path" else [i for i in items if not i.copied]
    return [i for i in usage_items(session_id, entries) if not i.copied]


async def usage(source: _Agent | Store, session_id: str | None = None, *,
                scope: Scope = "session") -> UsageReport:
    """Token totals of a session from its stored usage.

    ``source`` is a ``DurableAgent`` (its own session; ``path`` and ``branch``
    follow its leaf) or a store with ``session_id`` (the leaf is the last
    appended entry). Scopes:

    - ``path``: the active path, root to leaf, copies from a parent included;
    - ``branch``: the active path's calls made in this session (no copies);
    - ``session``: every call stored in this session, on every branch;
    - ``with_forks``: this session and every session forked from it, at any depth.

    ``session`` and ``with_forks`` read the store, so they count what other
    agents and processes have stored too.
    """
    if scope not in SCOPES:
        raise ConfigError(f"usage scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    agent = cast(_Agent, source) if hasattr(source, "tree") else None
    if agent is not None:
        store: Store = agent.store
        if session_id is not None and session_id != agent.session_id:
            raise ConfigError(f"usage() of agent {agent.session_id!r} was given another "
                              f"session id {session_id!r}; pass the store instead")
        session_id = agent.session_id
    else:
        store = cast(Store, source)
        if session_id is None:
            raise ConfigError("usage(store, session_id): name the session to count")
    if agent is not None and scope in ("path", "branch"):
        items = scoped(scope, session_id, agent.entries, agent.path())
        return UsageReport(session_id=session_id, scope=scope, items=tuple(items),
                           sessions=(session_id,))
    sessions = [session_id]
    if scope == "with_forks":
        sessions = await descendants(store, session_id)
    items = []
    for sid in sessions:
        items.extend(scoped(scope, sid, await store.load_entries(sid)))
    return UsageReport(session_id=session_id, scope=scope, items=tuple(items),
                       sessions=tuple(sessions))


async def descendants(store: Store, session_id: str) -> list[str]:
    """``session_id`` and every session whose lineage leads to it, parents first."""
    if not isinstance(store, CatalogStore):
        raise ConfigError(f"usage with forks needs a store that lists its sessions "
                          f"(CatalogStore); {type(store).__name__} does not")
    await store.load_session(session_id)  # SessionNotFound for an unknown id
    children: dict[str, list[str]] = {}
    cursor: str | None = None
    while True:
        page = await store.list_sessions(limit=1000, cursor=cursor)
        for record in page.sessions:
            if record.parent_id is not None:
                children.setdefault(record.parent_id, []).append(record.id)
        cursor = page.next_cursor
        if cursor is None:
            break
    found, queue = [session_id], [session_id]
    seen = {session_id}
    while queue:
        for child in sorted(children.get(queue.pop(0), ())):
            if child not in seen:
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found
