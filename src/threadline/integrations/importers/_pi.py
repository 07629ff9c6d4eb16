"""pi coding-agent session files (versions 1 to 3) as threadline sessions.

A pi file is a ``session`` header line, then entries linked by
``id``/``parentId`` (version 1 has no links: each entry follows the previous
one, and a compaction names its first kept entry by index). pi's leaf is the
last entry in the file, and so is threadline's, so keeping the order keeps
the leaf. The header becomes the session record plus a raw root entry, so
every pi root hangs under it and no header field is lost.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantContent,
    AssistantMessage,
    ImagePart,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
)
from threadline.integrations.importers._common import (
    Imported,
    Lines,
    entry_id,
    not_the_format,
    parse_time,
)
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    SessionRecord,
)

__all__ = ["import_pi"]

FMT = "pi"
_STOP: dict[str, StopReason] = {"stop": "stop", "length": "length", "toolUse": "tool_use",
                                "error": "error", "aborted": "aborted"}
# pi names a forked session's parent by its file path, <timestamp>_<session id>.jsonl.
_PARENT_FILE = re.compile(r"_([^_/\\]+)\.jsonl$")


def _user_content(value: Any, lines: Lines, at: str) -> tuple[UserContent, ...]:
    if isinstance(value, str):
        return (TextPart(text=value),)
    out: list[UserContent] = []
    for i, part in enumerate(value):
        if part["type"] == "text":
            lines.drop(part, {"type", "text"}, f"{at}content.{i}.")
            out.append(TextPart(text=part["text"]))
        elif part["type"] == "image":
            lines.drop(part, {"type", "data", "mimeType"}, f"{at}content.{i}.")
            out.append(ImagePart(data=part["data"], mime_type=part["mimeType"]))
        else:
            raise ValueError(f"unknown content part {part['type']!r}")
    return tuple(out)


def _assistant_content(parts: list[dict[str, Any]], provider: str,
                       lines: Lines) -> tuple[AssistantContent, ...]:
    out: list[AssistantContent] = []
    for i, part in enumerate(parts):
        kind = part["type"]
        at = f"message.content.{i}."
        if kind == "text":
            lines.drop(part, {"type", "text"}, at)
            out.append(TextPart(text=part["text"]))
        elif kind == "thinking":
            lines.drop(part, {"type", "thinking", "thinkingSignature", "redacted"}, at)
            out.append(ThinkingPart(thinking=part["thinking"],
                                    signature=part.get("thinkingSignature"),
                                    redacted=bool(part.get("redacted", False)),
                                    provider=provider or None))
        elif kind == "toolCall":
            lines.drop(part, {"type", "id", "name", "arguments"}, at)
            out.append(ToolCall(id=part["id"], name=part["name"],
                                arguments=dict(part.get("arguments") or {})))
        else:
            raise ValueError(f"unknown assistant content part {kind!r}")
    return tuple(out)


def _usage(u: dict[str, Any], lines: Lines) -> Usage:
    lines.drop(u, {"input", "output", "cacheRead", "cacheWrite", "totalTokens"},
               "message.usage.")
    return Usage(input_tokens=int(u.get("input", 0)), output_tokens=int(u.get("output", 0)),
                 cache_read_tokens=int(u.get("cacheRead", 0)),
                 cache_write_tokens=int(u.get("cacheWrite", 0)))


def _stop(value: object) -> StopReason:
    if value not in _STOP:
        raise ValueError(f"unknown stopReason {value!r}")
    return _STOP[str(value)]


_MAPPED_ROLES = {"user", "assistant", "toolResult"}


def _message(m: dict[str, Any], lines: Lines) -> Any:
    role = m["role"]
    if role == "user":
        lines.drop(m, {"role", "content"}, "message.")
        return UserMessage(content=_user_content(m["content"], lines, "message."))
    if role == "assistant":
        lines.drop(m, {"role", "content", "api", "provider", "model", "usage", "stopReason",
                       "errorMessage", "responseId"}, "message.")
        provider = str(m.get("provider", ""))
        return AssistantMessage(
            content=_assistant_content(m["content"], provider, lines),
            model=str(m.get("model", "")), provider=provider, api=str(m.get("api", "")),
            usage=_usage(m.get("usage") or {}, lines),
            stop_reason=_stop(m.get("stopReason", "stop")),
            error_message=m.get("errorMessage"), response_id=m.get("responseId"))
    lines.drop(m, {"role", "toolCallId", "toolName", "content", "details", "isError"},
               "message.")
    return ToolResultMessage(tool_call_id=m["toolCallId"], tool_name=m["toolName"],
                             content=_user_content(m.get("content") or [], lines, "message."),
                             is_error=bool(m.get("isError", False)), details=m.get("details"))


class _Reader:
    def __init__(self, lines: Lines, sid: str, version: int, root: str) -> None:
        self.lines, self.sid, self.version, self.root = lines, sid, version, root
        self.by_index: list[str] = [root]  # version 1 compactions count the header as 0
        self.last: dict[str, str] = {root: root}  # mapped source id -> last entry made from it
        self.prev = root
        self._refs: dict[str, str] = {}

    def ref(self, source_id: object) -> str:
        key = str(source_id)
        found = self._refs.get(key)
        if found is None:
            found = self._refs[key] = entry_id(FMT, self.sid, key)
        return found

    def entry(self, lineno: int, raw: bytes, obj: dict[str, Any]) -> list[Entry]:
        if self.version < 2:
            tid, parent = self.ref(f"line-{lineno}"), self.prev
        else:
            if not isinstance(obj.get("id"), str):
                raise self.lines.fail(lineno, "entry has no string 'id'")
            tid = self.ref(obj["id"])
            source_parent = obj.get("parentId")
            parent = self.last.get(self.root if source_parent is None
                                   else self.ref(source_parent), "")
            if not parent:
                raise self.lines.fail(lineno, f"parentId {source_parent!r} names no earlier "
                                              "entry")
        if tid in self.last:
            raise self.lines.fail(lineno, f"entry id {obj.get('id')!r} appears twice")
        ts = parse_time(obj.get("timestamp"), where=self.lines.name, line=lineno)
        head: dict[str, Any] = {"id": tid, "parent_id": parent, "timestamp": ts}
        try:
            made = self._map(obj, raw, head)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError,
                msgspec.ValidationError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise self.lines.fail(lineno, f"{obj.get('type')!r} entry: {detail}") from exc
        out = [made, *self.lines.extra(made)]
        # Children name the source id; they follow whatever this entry became.
        self.by_index.append(tid)
        self.prev = out[-1].id
        self.last[tid] = out[-1].id
        return out

    def _map(self, obj: dict[str, Any], raw: bytes, head: dict[str, Any]) -> Entry:
        kind = obj.get("type")
        base = {"type", "id", "parentId", "timestamp"}
        lines = self.lines
        if kind == "message" and obj["message"].get("role") in _MAPPED_ROLES:
            lines.drop(obj, base | {"message"}, "")
            return MessageEntry(message=_message(obj["message"], lines), **head)
        if kind == "message" and obj["message"].get("role") in ("custom", "hookMessage"):
            m = obj["message"]
            lines.drop(obj, base | {"message"}, "")
            lines.drop(m, {"role", "customType", "content", "display", "details"}, "message.")
            return CustomMessageEntry(kind=m["customType"],
                                      content=_user_content(m["content"], lines, "message."),
                                      display=bool(m.get("display", True)),
                                      details=m.get("details"), **head)
        if kind == "compaction":
            lines.drop(obj, base | {"summary", "firstKeptEntryId", "firstKeptEntryIndex",
                                    "tokensBefore", "details"}, "")
            if "firstKeptEntryIndex" in obj:
                first = self.by_index[int(obj["firstKeptEntryIndex"])]
            else:
                first = self.ref(obj["firstKeptEntryId"])
            return CompactionEntry(summary=obj["summary"], first_kept_entry_id=first,
                                   tokens_before=int(obj.get("tokensBefore", 0)),
                                   details=obj.get("details"), **head)
        if kind == "branch_summary":
            lines.drop(obj, base | {"fromId", "summary", "details"}, "")
            return BranchSummaryEntry(from_id=self.ref(obj["fromId"]), summary=obj["summary"],
                                      details=obj.get("details"), **head)
        if kind == "custom":
            lines.drop(obj, base | {"customType", "data"}, "")
            data = msgspec.Raw(msgspec.json.encode(obj.get("data")))
            return CustomEntry(kind=obj["customType"], data=data, **head)
        if kind == "custom_message":
            lines.drop(obj, base | {"customType", "content", "display", "details"}, "")
            return CustomMessageEntry(kind=obj["customType"],
                                      content=_user_content(obj["content"], lines, ""),
                                      display=bool(obj.get("display", True)),
                                      details=obj.get("details"), **head)
        # model_change, thinking_level_change, label, session_info, bash executions
        # and anything newer: no threadline place, so the line itself is kept.
        lines.forget()
        return lines.keep_raw(str(kind), raw, **head)


def import_pi(data: bytes, name: str) -> list[Imported]:
    """Read one pi session file (its bytes; ``name`` is used in errors)."""
    other = not_the_format(name, data, "pi")
    if other is not None:
        raise other
    lines = Lines("pi", data, name)
    rows = iter(lines)
    first = next(rows, None)
    if first is None:
        raise lines.fail(1, "the file is empty; expected a pi 'session' header line")
    lineno, raw, header = first
    if header.get("type") != "session" or not isinstance(header.get("id"), str):
        raise lines.fail(lineno, "expected a pi 'session' header with a string 'id'")
    version = header.get("version", 1)
    if not isinstance(version, int) or version > 3:
        raise lines.fail(lineno, f"pi session version {version!r} is not supported (1 to 3)")
    sid = header["id"]
    created = parse_time(header.get("timestamp"), where=name, line=lineno)
    parent_file = header.get("parentSession")
    found = _PARENT_FILE.search(parent_file) if isinstance(parent_file, str) else None
    record = SessionRecord(id=sid, parent_id=found.group(1) if found else None,
                           created_at=created)
    root = entry_id(FMT, sid, "session")
    entries: list[Entry] = [lines.keep_raw("session", raw, id=root, parent_id=None,
                                           timestamp=created)]
    reader = _Reader(lines, sid, version, root)
    for n, r, obj in rows:
        entries += reader.entry(n, r, obj)
    return [lines.imported(record, entries)]
