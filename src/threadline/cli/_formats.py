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

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    TextPart,
    ToolResultMessage,
    UserMessage,
)
from threadline.cli._bundle import blob_line, decode_blob_line, import_threadline, read_bundle
from threadline.cli._output import json_bytes, visible
from threadline.integrations.importers import (
    Imported,
    import_agents_sqlite,
    import_claude_code,
    import_pi,
)
from threadline.integrations.importers._common import detect
from threadline.session._context import build_context
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    ErasedEntry,
    MessageEntry,
    OpaqueEntry,
    SealedEntry,
    SessionRecord,
)
from threadline.session._tree import TreeIndex
from threadline.stores.file._format import encode_init, export_lines

__all__ = ["EXPORTERS", "IMPORTERS", "PATH_IMPORTERS", "Imported", "blob_line",
           "decode_blob_line", "detect", "import_threadline"]

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
    # Shown literally: no raw HTML reaches a Markdown renderer (escaped as
    # HTML), no code span, link or image starts (their characters escaped
    # as Markdown), no control character reaches a terminal.
    escaped = html.escape(visible(text, keep_lines=True), quote=False)
    return _MD_ACTIVE.sub(r"\\\g<0>", escaped)


_MD_ACTIVE = re.compile(r"[\\`\[\]]")


def _code(text: str) -> str:
    """``text`` as one inline code span, whatever backticks it holds.

    The fence is one backtick longer than the longest run inside, so no
    backtick in the text can end the span early (CommonMark), and a space
    on each side (which a renderer strips) keeps a backtick at either end
    from joining the fence.
    """
    text = visible(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fenced(text: str, lang: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{visible(text, keep_lines=True)}\n{fence}"


def _md_attachments(content: tuple[object, ...]) -> list[str]:
    return [f"Attachment: {_code(p.name or 'unnamed')} ({_md_text(p.media_type)}, "
            f"{p.size:,} bytes, sha256 {_code(p.sha256)})"
            for p in content if isinstance(p, BlobPart)]


def _md_message(m: object) -> list[str]:
    if isinstance(m, UserMessage):
        return ["## User", _md_text(m.text), *_md_attachments(m.content)]
    if isinstance(m, AssistantMessage):
        out = ["## Assistant"] + ([_md_text(m.text)] if m.text else [])
        for call in m.tool_calls:
            args = msgspec.json.format(msgspec.json.encode(call.arguments)).decode()
            out += [f"Tool call {_code(call.name)}:", _fenced(args, "json")]
        if m.stop_reason == "error":
            out.append(f"> **Error:** {_md_text(m.error_message or 'no message')}")
        return out
    if isinstance(m, ToolResultMessage):
        label = " (error)" if m.is_error else ""
        label += f" ({m.synthesized})" if m.synthesized else ""
        return [f"### Tool result {_code(m.tool_name)}{label}", _fenced(m.text),
                *_md_attachments(m.content)]
    return []


def _md_entry(entry: Entry) -> list[str]:
    if isinstance(entry, MessageEntry):
        return _md_message(entry.message)
    if isinstance(entry, CompactionEntry):
        return ["## Summary of the earlier conversation", _md_text(entry.summary)]
    if isinstance(entry, BranchSummaryEntry):
        return ["## Summary of another branch", _md_text(entry.summary)]
    if isinstance(entry, CustomMessageEntry):
        # The model is sent this as user content, so a reader sees it too.
        text = "".join(p.text for p in entry.content if isinstance(p, TextPart))
        hidden = "" if entry.display else " (not shown to the user)"
        return [f"## Custom message {_code(entry.kind)}{hidden}", _md_text(text)]
    if isinstance(entry, CustomEntry):
        return [f"*custom entry {_code(entry.kind)}*"]
    if isinstance(entry, ErasedEntry | SealedEntry):
        gone = ("[erased]", "its content is gone") if isinstance(entry, ErasedEntry) else (
            "[locked]", "encrypted, no key given")
        return [f"*{gone[0]} {_code(entry.of)} entry: {gone[1]}*"]
    if isinstance(entry, OpaqueEntry):
        return [f"*entry of unknown type {_code(entry.type)}*"]
    return []


def _export_markdown(record: SessionRecord, tree: TreeIndex, terminal: bool) -> bytes:
    head = [f"# Session {_code(record.id)}",
            f"Created {record.created_at.isoformat()}"
            + (f", forked from {_code(record.parent_id)}" if record.parent_id else "")
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

IMPORTERS: dict[str, Importer] = {
    "threadline": import_threadline,
    "pi": import_pi,
    "claude-code": import_claude_code,
}

PATH_IMPORTERS: dict[str, Callable[[Path], list[Imported]]] = {
    # A database is read where it lies, not as bytes; a bundle is a folder or a tar.
    "openai-agents-sqlite": import_agents_sqlite,
    "bundle": read_bundle,
}
