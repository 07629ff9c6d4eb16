"""Claude Code transcripts (``~/.claude/projects/<dir>/<session>.jsonl``).

Each line is one record: ``user`` and ``assistant`` lines carry an Anthropic
Messages API message and link by ``uuid``/``parentUuid``; sidechains (a
sub-agent's conversation) start their own root; ``summary``,
``file-history-snapshot`` and other lines without a ``uuid`` have no place in
the tree and are kept raw after the line before them. A compaction is a
``compact_boundary`` system line (kept raw, hung under the entry it logically
follows) and then a user line flagged ``isCompactSummary``, which becomes a
threadline compaction keeping nothing before it, as Claude Code does.

A user line holding several blocks (tool results, then text) becomes one
entry per block, chained, so each tool result is its own message.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import PurePath
from typing import Any

import msgspec

from threadline.ai._messages import (
    AssistantContent,
    AssistantMessage,
    ImagePart,
    Message,
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
from threadline.session._entries import CompactionEntry, Entry, MessageEntry, SessionRecord

__all__ = ["import_claude_code"]

FMT = "claude_code"
_STOP: dict[str | None, StopReason] = {"end_turn": "stop", "stop_sequence": "stop",
                                       "max_tokens": "length", "tool_use": "tool_use",
                                       "pause_turn": "stop", "refusal": "stop"}
# What a mapped line's envelope turns into; its other fields (cwd, gitBranch,
# version, ...) go to the extra entry after it.
_MAPPED_TOP = {"type", "uuid", "parentUuid", "timestamp", "message", "isCompactSummary",
               "toolUseResult"}


class _Unmapped(Exception):
    """A content block threadline has no type for: the line is kept raw."""


def _image(block: dict[str, Any]) -> ImagePart:
    source = block["source"]
    if source.get("type") != "base64":
        raise _Unmapped
    return ImagePart(data=source["data"], mime_type=source["media_type"])


# The keys of each content block that have a place in threadline's parts.
_KEYS = {"text": {"type", "text"}, "image": {"type", "source"},
         "thinking": {"type", "thinking", "signature"}, "redacted_thinking": {"type", "data"},
         "tool_use": {"type", "id", "name", "input"},
         "tool_result": {"type", "tool_use_id", "content", "is_error"}}


def _user_parts(content: Any, lines: Lines, at: str) -> tuple[UserContent, ...]:
    if isinstance(content, str):
        return (TextPart(text=content),)
    out: list[UserContent] = []
    for i, block in enumerate(content):
        if block["type"] == "text":
            out.append(TextPart(text=block["text"]))
        elif block["type"] == "image":
            out.append(_image(block))
        else:
            raise _Unmapped
        lines.drop(block, _KEYS[block["type"]], f"{at}content.{i}.")
    return tuple(out)


def _assistant_parts(content: Any, lines: Lines) -> tuple[AssistantContent, ...]:
    if isinstance(content, str):
        return (TextPart(text=content),)
    out: list[AssistantContent] = []
    for i, block in enumerate(content):
        kind = block["type"]
        if kind == "text":
            out.append(TextPart(text=block["text"]))
        elif kind == "thinking":
            out.append(ThinkingPart(thinking=block["thinking"], signature=block.get("signature"),
                                    provider="anthropic"))
        elif kind == "redacted_thinking":
            out.append(ThinkingPart(thinking="", signature=block["data"], redacted=True,
                                    provider="anthropic"))
        elif kind == "tool_use":
            out.append(ToolCall(id=block["id"], name=block["name"],
                                arguments=dict(block.get("input") or {})))
        else:
            raise _Unmapped
        lines.drop(block, _KEYS[kind], f"message.content.{i}.")
    return tuple(out)


class _Reader:
    def __init__(self, lines: Lines, sid: str, first_time: datetime) -> None:
        self.lines, self.sid, self.first_time = lines, sid, first_time
        self.last_of: dict[str, str] = {}  # source uuid -> id of the last entry made from it
        self.tool_names: dict[str, str] = {}
        self.prev: str | None = None
        self.entries: list[Entry] = []

    def line(self, lineno: int, raw: bytes, obj: dict[str, Any]) -> None:
        ts = parse_time(obj["timestamp"], where=self.lines.name, line=lineno) \
            if "timestamp" in obj else None
        uid = obj.get("uuid")
        if not isinstance(uid, str) and obj.get("type") in ("user", "assistant"):
            # A message has a place in the tree only by its uuid; kept raw it
            # would drop out of the model's context unnoticed.
            raise self.lines.fail(lineno, f"{obj.get('type')!r} line has no string 'uuid'")
        if not isinstance(uid, str):
            # No place in the tree: kept after whatever came before it.
            tid = entry_id(FMT, self.sid, f"line-{lineno}")
            stamp = ts or (self.entries[-1].timestamp if self.entries else None) or self.first_time
            self._add([self.lines.keep_raw(str(obj.get("type")), raw, id=tid,
                                           parent_id=self.prev, timestamp=stamp)], uid=None)
            return
        if ts is None:
            raise self.lines.fail(lineno, "line has a uuid but no timestamp")
        source_parent = obj.get("parentUuid") or obj.get("logicalParentUuid")
        parent = self.last_of.get(source_parent) if isinstance(source_parent, str) else None
        if source_parent is not None and parent is None:
            # A resumed or trimmed transcript can point outside this file.
            self.lines.notes.append(f"{self.lines.name} line {lineno}: parent "
                                    f"{source_parent!r} is not in the file; the line starts "
                                    "a new root")
            self.lines.drop({"parentUuid": source_parent}, set(), "")
        if uid in self.last_of:
            raise self.lines.fail(lineno, f"uuid {uid!r} appears twice")
        try:
            made = self._map(obj, uid, parent, ts)
        except _Unmapped:
            made = None
            self.lines.forget()
        except (KeyError, TypeError, ValueError, AttributeError, msgspec.ValidationError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise self.lines.fail(lineno, f"{obj.get('type')!r} line: {detail}") from exc
        if made is None:
            made = [self.lines.keep_raw(str(obj.get("type")), raw,
                                        id=entry_id(FMT, self.sid, uid), parent_id=parent,
                                        timestamp=ts)]
        else:
            self.lines.drop(obj, _MAPPED_TOP, "")
            made += self.lines.extra(made[-1])
        self._add(made, uid=uid)

    def _add(self, made: list[Entry], uid: str | None) -> None:
        self.entries += made
        self.prev = made[-1].id
        if uid is not None:
            self.last_of[uid] = made[-1].id

    def _map(self, obj: dict[str, Any], uid: str, parent: str | None,
             ts: datetime) -> list[Entry] | None:
        kind = obj.get("type")
        m: dict[str, Any] = obj["message"] if kind in ("user", "assistant") else {}
        if kind == "assistant":
            self.lines.drop(m, {"id", "type", "role", "model", "content", "stop_reason",
                                "stop_sequence", "usage"}, "message.")
            message: Message = self._assistant(m)
            return [MessageEntry(message=message, id=entry_id(FMT, self.sid, uid),
                                 parent_id=parent, timestamp=ts)]
        if kind != "user":
            return None  # system lines and anything newer
        if obj.get("isCompactSummary"):
            parts = _user_parts(m["content"], self.lines, "message.")
            text = "".join(p.text for p in parts if isinstance(p, TextPart))
            tid = entry_id(FMT, self.sid, uid)
            return [CompactionEntry(summary=text, first_kept_entry_id=tid, id=tid,
                                    parent_id=parent, timestamp=ts)]
        self.lines.drop(m, {"role", "content"}, "message.")
        return self._user(m["content"], obj.get("toolUseResult"), uid, parent, ts)

    def _assistant(self, m: dict[str, Any]) -> AssistantMessage:
        parts = _assistant_parts(m["content"], self.lines)
        for part in parts:
            if isinstance(part, ToolCall):
                self.tool_names[part.id] = part.name
        u = m.get("usage") or {}
        self.lines.drop(u, {"input_tokens", "output_tokens", "cache_read_input_tokens",
                            "cache_creation_input_tokens"}, "message.usage.")
        usage = Usage(input_tokens=int(u.get("input_tokens") or 0),
                      output_tokens=int(u.get("output_tokens") or 0),
                      cache_read_tokens=int(u.get("cache_read_input_tokens") or 0),
                      cache_write_tokens=int(u.get("cache_creation_input_tokens") or 0))
        # Claude Code stores streamed blocks before the stop reason is known.
        stop = _STOP.get(m.get("stop_reason")) or (
            "tool_use" if any(isinstance(p, ToolCall) for p in parts) else "stop")
        return AssistantMessage(content=parts, model=str(m.get("model", "")),
                                provider="anthropic", api="anthropic-messages", usage=usage,
                                stop_reason=stop, response_id=m.get("id"))

    def _user(self, content: Any, tool_use_result: Any, uid: str, parent: str | None,
              ts: datetime) -> list[Entry]:
        blocks: list[Any] = [content] if isinstance(content, str) else list(content)
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        messages: list[Message] = []
        for block in results:
            at = f"message.content.{blocks.index(block)}."
            self.lines.drop(block, _KEYS["tool_result"], at)
            messages.append(ToolResultMessage(
                tool_call_id=block["tool_use_id"],
                tool_name=self.tool_names.get(block["tool_use_id"], ""),
                content=_user_parts(block.get("content") or (), self.lines, at),
                is_error=bool(block.get("is_error", False)),
                # The tool's structured output, when one result is all the line holds.
                details=tool_use_result if len(results) == 1 else None))
        if tool_use_result is not None and len(results) != 1:
            self.lines.drop({"toolUseResult": tool_use_result}, set(), "")
        rest = [b for b in blocks if b not in results]
        if rest or not messages:
            messages.append(UserMessage(content=_user_parts(
                rest[0] if len(rest) == 1 and isinstance(rest[0], str) else rest, self.lines,
                "message.")))
        out: list[Entry] = []
        for i, message in enumerate(messages):
            source = uid if i == len(messages) - 1 else f"{uid}#{i}"
            out.append(MessageEntry(message=message, id=entry_id(FMT, self.sid, source),
                                    parent_id=out[-1].id if out else parent, timestamp=ts))
        return out


def import_claude_code(data: bytes, name: str) -> list[Imported]:
    """Read one Claude Code transcript (its bytes; ``name`` is used in errors).

    The session id is the transcript's ``sessionId`` (the file name's stem
    when no line carries one).
    """
    other = not_the_format(name, data, "claude-code")
    if other is not None:
        raise other
    lines = Lines("claude_code", data, name)
    rows = list(lines)
    if not rows:
        raise lines.fail(1, "the file holds no transcript lines")
    if not any(isinstance(o.get("uuid"), str) for _, _, o in rows):
        raise lines.fail(rows[0][0], "no line has a 'uuid', so this is no Claude Code "
                                     "transcript")
    sid = next((o["sessionId"] for _, _, o in rows if isinstance(o.get("sessionId"), str)),
               PurePath(name).stem)
    # A leading summary line has no time of its own: it gets the transcript's first.
    first = next(((n, o["timestamp"]) for n, _, o in rows if "timestamp" in o), (1, 0))
    reader = _Reader(lines, sid, parse_time(first[1], where=name, line=first[0]))
    for lineno, raw, obj in rows:
        reader.line(lineno, raw, obj)
    created = min(e.timestamp for e in reader.entries if e.timestamp is not None)
    return [lines.imported(SessionRecord(id=sid, created_at=created), reader.entries)]
