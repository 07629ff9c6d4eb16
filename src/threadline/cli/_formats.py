"""Export and import formats, by name: ``EXPORTERS`` and ``IMPORTERS``.

An exporter writes one session (its record and tree) as bytes; an importer
turns a file's bytes into sessions. Adding a format is one function and one
dictionary entry here; ``export --format`` and ``import --format`` offer
whatever the dictionaries hold.

The default ``jsonl`` export is threadline's own file format (a
``session_init`` line, then every entry as stored, one per line), so
``import`` reads it back into any store with the same record and the same
entry bytes. ``import`` also takes a session file as the file store keeps
it, whose ``batch`` lines (format version 2) hold several entries each.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path

import msgspec

from threadline.ai._messages import AssistantMessage, ToolResultMessage, UserMessage
from threadline.cli._output import json_bytes, visible
from threadline.errors import CorruptLog
from threadline.integrations.importers import (
    Imported,
    import_agents_sqlite,
    import_claude_code,
    import_pi,
)
from threadline.session._codec import decode_init, decode_lines, encode_init, export_lines
from threadline.session._context import build_context
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
    SessionRecord,
)
from threadline.session._tree import TreeIndex

__all__ = ["EXPORTERS", "IMPORTERS", "PATH_IMPORTERS", "Imported"]

Exporter = Callable[[SessionRecord, TreeIndex, bool], bytes]
"""(record, tree, to a terminal) -> the bytes to write."""


def _export_jsonl(record: SessionRecord, tree: TreeIndex, terminal: bool) -> bytes:
    # To a file or a pipe: every entry's stored bytes exactly, one per line (a
    # file store's batch lines opened up, so every store exports a session
    # the same; JSON escapes ESC and BEL already); to a terminal, C1 and bidi
    # escaped too.
    data = encode_init(record) + b"\n" + export_lines(tree.entries)
    return json_bytes(data, escape=terminal)


def _export_messages(record: SessionRecord, tree: TreeIndex, terminal: bool) -> bytes:
    data = msgspec.json.format(msgspec.json.encode(build_context(tree.path()))) + b"\n"
    return json_bytes(data)


def _md_text(text: str) -> str:
    # Shown literally: no raw HTML reaches a Markdown renderer, no control
    # character reaches a terminal.
    return html.escape(visible(text, keep_lines=True), quote=False)


def _fenced(text: str, lang: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{visible(text, keep_lines=True)}\n{fence}"


def _md_entry(entry: Entry) -> list[str]:
    if isinstance(entry, MessageEntry):
        m = entry.message
        if isinstance(m, UserMessage):
            return ["## User", _md_text(m.text)]
        if isinstance(m, AssistantMessage):
            out = ["## Assistant"] + ([_md_text(m.text)] if m.text else [])
            for call in m.tool_calls:
                args = msgspec.json.format(msgspec.json.encode(call.arguments)).decode()
                out += [f"Tool call `{visible(call.name)}`:", _fenced(args, "json")]
            if m.stop_reason == "error":
                out.append(f"> **Error:** {_md_text(m.error_message or 'no message')}")
            return out
        if isinstance(m, ToolResultMessage):
            label = " (error)" if m.is_error else ""
            label += f" ({m.synthesized})" if m.synthesized else ""
            return [f"### Tool result `{visible(m.tool_name)}`{label}", _fenced(m.text)]
    if isinstance(entry, CompactionEntry):
        return ["## Summary of the earlier conversation", _md_text(entry.summary)]
    if isinstance(entry, BranchSummaryEntry):
        return ["## Summary of another branch", _md_text(entry.summary)]
    if isinstance(entry, CustomMessageEntry | CustomEntry):
        return [f"*custom entry `{visible(entry.kind)}`*"]
    if isinstance(entry, OpaqueEntry):
        return [f"*entry of unknown type `{visible(entry.type)}`*"]
    return []


def _export_markdown(record: SessionRecord, tree: TreeIndex, terminal: bool) -> bytes:
    head = [f"# Session `{visible(record.id)}`",
            f"Created {record.created_at.isoformat()}"
            + (f", forked from `{visible(record.parent_id)}`" if record.parent_id else "")
            + ". The active path:"]
    blocks = head + [block for entry in tree.path() for block in _md_entry(entry)]
    return ("\n\n".join(blocks) + "\n").encode()


EXPORTERS: dict[str, Exporter] = {
    "jsonl": _export_jsonl,
    "messages": _export_messages,
    "markdown": _export_markdown,
}


Importer = Callable[[bytes, str], list[Imported]]
"""(file bytes, file name for errors) -> the sessions in it."""

_INIT = b'{"type":"session_init"'


def _import_threadline(data: bytes, name: str) -> list[Imported]:
    """One or more sessions, each a ``session_init`` line followed by its entries."""
    lines = data.split(b"\n")  # never a universal-newline split: see docs/design.md
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise CorruptLog("the file is empty; expected a session_init line", path=name, line=1)
    starts = [i for i, line in enumerate(lines) if i == 0 or line.startswith(_INIT)]
    found: list[Imported] = []
    for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        record = decode_init(lines[start], path=name, lineno=start + 1)
        # One decode per session: the codec reads batch lines as well.
        body = b"".join(line + b"\n" for line in lines[start + 1:end])
        entries = decode_lines(body, session_id=record.id, path=name, first_line=start + 2)
        found.append(Imported(record, entries))
    return found


IMPORTERS: dict[str, Importer] = {
    "threadline": _import_threadline,
    "pi": import_pi,
    "claude-code": import_claude_code,
}

PATH_IMPORTERS: dict[str, Callable[[Path], list[Imported]]] = {
    # A database is read where it lies, not as bytes.
    "openai-agents-sqlite": import_agents_sqlite,
}
