"""How one SDK item is kept in the log, and how items are read back from a path.

An item that says something in threadline's message model (a user or
assistant message, a function call, its output) is stored as that message
entry, so ``threadline show``, ``export``, the viewer and threadline's own
model context see it; what the message does not hold (the item's id, its
status, annotations, the list form of its content) goes into one small
``openai_agents.rest`` entry right after it: the item with the message's
strings taken out, and where they go back. An item in its plainest form
(``{"role": "user", "content": "..."}``) needs none. Any other item
(reasoning, hosted tool calls, ...) is one ``openai_agents.item`` entry
holding the item as added. So each item's text is stored once.

Items come back equal to what was added: each one is rebuilt from its
entries before it is stored, and one that would not come back equal is kept
whole instead. Sessions written before this layout (every item whole, then a
message entry saying the same) read as they did.

Pure: items in, entries out, and back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec

from threadline.ai import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.session import CustomEntry, Entry, MessageEntry, register_custom

__all__ = ["ITEM_KIND", "REST_KIND", "Read", "entries_for", "read_items", "to_message"]

ITEM_KIND = "openai_agents.item"
"""The custom entry kind that holds one SDK item whole (one that is no message)."""
REST_KIND = "openai_agents.rest"
"""The custom entry kind that holds what the message before it does not of its item."""

Path = list[str | int]


class _Item(msgspec.Struct, frozen=True):
    item: dict[str, Any]


class _Rest(msgspec.Struct, frozen=True, omit_defaults=True):
    item: dict[str, Any]
    """The item, each string the message holds replaced by null."""
    holes: list[Path] = []
    """Where the message's strings go back, in the order ``_strings`` gives them."""


register_custom(ITEM_KIND, _Item)
register_custom(REST_KIND, _Rest)


class Read(NamedTuple):
    """One item on the path, and the first entry it was stored in (a pop goes above it)."""

    item: dict[str, Any]
    first: Entry


def to_message(item: dict[str, Any], tool_names: dict[str, str]) -> Message | None:
    """The threadline message ``item`` reads as, or None for an item type with none.

    ``tool_names`` maps call ids to tool names; a function call adds to it.
    """
    kind = item.get("type", "message")
    role = item.get("role")
    if kind == "message" and role in ("user", "assistant"):
        texts = _texts(item.get("content"))
        if texts is None:
            return None
        parts = tuple(TextPart(text=t) for t in texts)
        return UserMessage(content=parts) if role == "user" else AssistantMessage(content=parts)
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            return None
        tool_names[call_id] = name
        return AssistantMessage(content=(ToolCall(id=call_id, name=name,
                                                  arguments=_arguments(item.get("arguments"))),),
                                stop_reason="tool_use")
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            return None
        return ToolResultMessage(tool_call_id=call_id, tool_name=tool_names.get(call_id, ""),
                                 content=(TextPart(text=output),))
    return None


def _texts(content: Any) -> list[str] | None:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list) or not content:
        return None
    out: list[str] = []
    for part in content:
        text = part.get("refusal" if part.get("type") == "refusal" else "text") \
            if isinstance(part, dict) else None
        if not isinstance(text, str):
            return None
        out.append(text)
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_value": parsed}
    return {}


def _strings(message: Message) -> list[str]:
    """The strings of the message that stand for strings of its item (their holes)."""
    if isinstance(message, ToolResultMessage):
        return [message.text]
    if isinstance(message, AssistantMessage) and message.tool_calls:
        return []  # a call's arguments are a string in the item: kept there
    return [p.text for p in message.content if isinstance(p, TextPart)]


def _plain(message: Message) -> dict[str, Any] | None:
    """The item in its plainest form, which needs no rest entry."""
    if isinstance(message, UserMessage) and len(message.content) == 1:
        return {"role": "user", "content": message.text}
    if isinstance(message, ToolResultMessage):
        return {"type": "function_call_output", "call_id": message.tool_call_id,
                "output": message.text}
    return None


def _walk(value: Any, path: Path) -> Iterator[tuple[Path, str]]:
    """Every string in ``value`` with where it is, depth first, in order."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _walk(inner, [*path, key])
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _walk(inner, [*path, i])


def _put(target: Any, path: Path, value: Any) -> None:
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def _same(a: Any, b: Any) -> bool:
    # As JSON, key order aside: True and 1, 1 and 1.0 are different items.
    return msgspec.json.encode(a, order="sorted") == msgspec.json.encode(b, order="sorted")


def rebuild(message: Message, rest: _Rest | None) -> dict[str, Any] | None:
    """The item a message entry (and the rest entry after it) stands for."""
    if rest is None:
        return _plain(message)
    item: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(rest.item))
    strings = _strings(message)
    if len(strings) != len(rest.holes):
        return None
    for path, value in zip(rest.holes, strings, strict=True):
        _put(item, path, value)
    return item


def entries_for(item: dict[str, Any], tool_names: dict[str, str]) -> list[Entry]:
    """The entries that keep ``item``, chained among themselves."""
    message = to_message(item, tool_names)
    if message is None:
        return [CustomEntry(kind=ITEM_KIND, data=_Item(item))]
    plain = _plain(message)
    if plain is not None and _same(plain, item):
        return [MessageEntry(message=message)]
    rest = _rest(item, _strings(message))
    head = MessageEntry(message=message)
    if rest is not None and _same(rebuild(message, rest), item):
        return [head, CustomEntry(kind=REST_KIND, data=rest, parent_id=head.id)]
    # Cannot be taken apart exactly: kept whole, with the message after it as
    # sessions kept every item before (read_items knows that layout).
    whole = CustomEntry(kind=ITEM_KIND, data=_Item(item))
    return [whole, MessageEntry(message=message, parent_id=whole.id)]


def _rest(item: dict[str, Any], strings: Sequence[str]) -> _Rest | None:
    holes: list[Path] = []
    found = _walk(item, [])
    for wanted in strings:
        for path, value in found:
            if value == wanted:
                holes.append(path)
                break
        else:
            return None
    template: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(item))
    for path in holes:
        _put(template, path, None)
    return _Rest(item=template, holes=holes)


def read_items(path: Iterable[Entry]) -> Iterator[Read]:
    """The items stored on ``path``, oldest first (any entry that is none is passed over)."""
    pending: Entry | None = None  # a message entry whose rest entry may follow
    companion_of: str | None = None  # an earlier layout's whole item, whose message follows
    for entry in path:
        if pending is not None:
            rest = entry.data if (isinstance(entry, CustomEntry) and entry.kind == REST_KIND
                                  and entry.parent_id == pending.id
                                  and isinstance(entry.data, _Rest)) else None
            assert isinstance(pending, MessageEntry)
            item = rebuild(pending.message, rest)
            if item is not None:
                yield Read(item, pending)
            pending = None
            if rest is not None:
                continue
        if isinstance(entry, CustomEntry) and entry.kind == ITEM_KIND \
                and isinstance(entry.data, _Item):
            yield Read(entry.data.item, entry)
            # A whole item threadline has a message for came with that message.
            companion_of = entry.id if to_message(entry.data.item, {}) is not None else None
            continue
        if isinstance(entry, MessageEntry):
            if companion_of is not None and entry.parent_id == companion_of:
                companion_of = None
                continue
            pending = entry
        companion_of = None
    if pending is not None:
        assert isinstance(pending, MessageEntry)
        item = rebuild(pending.message, None)
        if item is not None:
            yield Read(item, pending)
