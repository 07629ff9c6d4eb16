"""OpenAI Agents SDK ``SQLiteSession`` databases as threadline sessions.

The SDK keeps one row per session in ``agent_sessions`` and one JSON item
per row in ``agent_messages``, in ``id`` order. Items are a linear history,
so they become one chain. User messages, assistant output text, function
calls and their outputs map onto threadline messages (an image given
inline as a data URL too); every other item
(system or developer instructions, reasoning, hosted-tool calls, ...) is
kept raw in its place.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    ImagePart,
    Message,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from threadline.errors import ConfigError, CorruptLog
from threadline.integrations.importers._common import (
    Collector,
    Imported,
    entry_id,
    parse_time,
)
from threadline.session._entries import Entry, MessageEntry, SessionRecord

__all__ = ["import_agents_sqlite"]

FMT = "openai_agents"


class _Unmapped(Exception):
    pass


def _text_parts(content: Any, kind: str, found: Collector,
                field: str) -> tuple[UserContent, ...]:
    """Text given as a string or as parts of type ``kind``.

    A part's other fields, and the list form itself, go to the extra entry so
    the item's exact shape is on record."""
    if isinstance(content, str):
        return (TextPart(text=content),)
    out: list[UserContent] = []
    found.drop({f"{field}.form": "list"}, set(), "")
    for i, part in enumerate(content):
        image = _data_image(part) if kind == "input_text" else None
        if image is not None:
            found.drop(part, {"type", "image_url"}, f"{field}.{i}.")
            out.append(image)
            continue
        if part.get("type") != kind:
            raise _Unmapped
        found.drop(part, {"type", "text"}, f"{field}.{i}.")
        out.append(TextPart(text=part["text"]))
    return tuple(out)


def _data_image(part: dict[str, Any]) -> ImagePart | None:
    """An ``input_image`` given inline as a base64 data URL (a URL or file id stays raw)."""
    url = part.get("image_url")
    if part.get("type") != "input_image" or not isinstance(url, str):
        return None
    head, sep, data = url.partition(",")
    if not (sep and head.startswith("data:") and head.endswith(";base64")):
        return None
    return ImagePart(data=data, mime_type=head[5:-7] or "application/octet-stream")


def _item(item: dict[str, Any], names: dict[str, str], found: Collector) -> Message:
    kind = item.get("type", "message")

    def drop(mapped: set[str]) -> None:
        found.drop(item, mapped, "")

    if kind == "message" and item.get("role") == "user":
        drop({"type", "role", "content"})
        return UserMessage(content=_text_parts(item["content"], "input_text", found, "content"))
    if kind == "message" and item.get("role") == "assistant":
        drop({"type", "role", "content"})
        parts = _text_parts(item["content"], "output_text", found, "content")
        return AssistantMessage(content=tuple(p for p in parts if isinstance(p, TextPart)))
    if kind == "function_call":
        drop({"type", "call_id", "name", "arguments"})
        arguments = msgspec.json.decode(item.get("arguments") or "{}")
        if not isinstance(arguments, dict):
            raise _Unmapped
        names[item["call_id"]] = item["name"]
        return AssistantMessage(stop_reason="tool_use", content=(
            ToolCall(id=item["call_id"], name=item["name"], arguments=arguments),))
    if kind == "function_call_output":
        drop({"type", "call_id", "output"})
        output = item["output"]
        return ToolResultMessage(
            tool_call_id=item["call_id"], tool_name=names.get(item["call_id"], ""),
            content=_text_parts(output, "input_text", found, "output"))
    raise _Unmapped


def _session(db: sqlite3.Connection, path: str, sid: str, created: Any,
             messages_table: str) -> Imported:
    rows = db.execute(f"SELECT id, message_data, created_at FROM {messages_table} "
                      "WHERE session_id = ? ORDER BY id", (sid,)).fetchall()
    entries: list[Entry] = []
    names: dict[str, str] = {}
    found = Collector(FMT, path)
    for row_id, data, stamp in rows:
        where = f"{messages_table} row id {row_id}"
        text = data.encode() if isinstance(data, str) else bytes(data)
        try:
            item = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise CorruptLog(f"{where}: not JSON: {exc}", path=path, session_id=sid) from exc
        if not isinstance(item, dict):
            raise CorruptLog(f"{where}: expected a JSON object", path=path, session_id=sid)
        tid = entry_id(FMT, sid, str(row_id))
        parent = entries[-1].id if entries else None
        ts = parse_time(stamp, where=f"{path} {where}", line=None)
        try:
            message = _item(item, names, found)
        except _Unmapped:
            found.forget()
            entries.append(found.keep_raw(str(item.get("type", "message")), text, id=tid,
                                          parent_id=parent, timestamp=ts))
            continue
        except (KeyError, TypeError, ValueError, AttributeError, msgspec.DecodeError,
                msgspec.ValidationError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise CorruptLog(f"{where}: {detail}", path=path, session_id=sid) from exc
        entries.append(MessageEntry(message=message, id=tid, parent_id=parent, timestamp=ts))
        entries += found.extra(entries[-1])
    record = SessionRecord(id=sid, created_at=parse_time(created, where=path, line=None))
    return found.imported(record, entries)


def import_agents_sqlite(path: str | Path, *, sessions_table: str = "agent_sessions",
                         messages_table: str = "agent_messages") -> list[Imported]:
    """Every session in an Agents SDK ``SQLiteSession`` database file.

    The file is opened read-only; the table names are the SDK's defaults
    unless the application chose its own.
    """
    name = str(path)
    if not Path(path).is_file():
        raise ConfigError(f"{name}: no such SQLite file")
    for table in (sessions_table, messages_table):
        if not table.replace("_", "").isalnum():
            raise ConfigError(f"{name}: {table!r} is not a plain table name")
    try:
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise ConfigError(f"{name}: cannot open as SQLite: {exc}") from exc
    try:
        sessions = db.execute(f"SELECT session_id, created_at FROM {sessions_table} "
                              "ORDER BY created_at, session_id").fetchall()
        return [_session(db, name, sid, created, messages_table) for sid, created in sessions]
    except sqlite3.Error as exc:
        raise CorruptLog(f"not an Agents SDK session database ({exc})", path=name) from exc
    finally:
        db.close()
