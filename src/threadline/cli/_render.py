"""What an entry looks like on screen, and the short ids that name entries.

``describe`` returns spans for ``Out.line``, which escapes them; the tree is
drawn from the same spans, a line at a time. The short id
shown is the shortest tail (six characters at least) that tells the
session's entries apart, and ``resolve`` accepts exactly that, so what the
screen shows can be typed back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import msgspec
from rich.text import Text

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    TextPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.cli._approvals import describe_record
from threadline.cli._output import Span, visible
from threadline.errors import ConfigError, EntryNotFound
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
)
from threadline.session._tree import TreeIndex
from threadline.viewer._common import shown_by_default

__all__ = ["Abbrev", "attachments", "count", "describe", "hidden_note", "resolve", "short",
           "size_text", "spans_text", "tree_lines"]

_MIN_SHORT = 6


def short(entry_id: str, length: int = _MIN_SHORT) -> str:
    """The random tail of a UUIDv7 id: enough to tell entries apart on screen."""
    return entry_id[-length:]


class Abbrev:
    """The short-id length for one session: the shortest unique tail, at least six."""

    def __init__(self, ids: Iterable[str]) -> None:
        unique = set(ids)
        longest = max((len(i) for i in unique), default=_MIN_SHORT)
        self.length = _MIN_SHORT
        while self.length < longest and len({i[-self.length:] for i in unique}) < len(unique):
            self.length += 1

    def __call__(self, entry_id: str) -> str:
        return entry_id[-self.length:]


def resolve(tree: TreeIndex, text: str) -> str:
    """The id of the entry ``text`` names: the full id, or a unique prefix or tail."""
    if text in tree:
        return text
    found = [e.id for e in tree if e.id.endswith(text) or e.id.startswith(text)] if text else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise EntryNotFound(f"no entry {text!r} in session {tree.session_id!r}")
    shown = ", ".join(repr(i) for i in found[:4]) + (", ..." if len(found) > 4 else "")
    raise ConfigError(f"entry {text!r} is ambiguous in session {tree.session_id!r}: it matches "
                      f"{len(found)} entries ({shown}); give more characters")


def _clip(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _arguments(call: ToolCall) -> str:
    try:
        return msgspec.json.encode(call.arguments).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(call.arguments)


def size_text(n: int) -> str:
    """``512 B``, ``2.0 KiB``, ``20.0 MiB``: a byte count people read."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def attachments(content: Iterable[object]) -> list[Span]:
    """A span per attachment: ``[image/png 2.0 MiB 3fa9c1d2e0b4 "chart.png"]``.

    The name is the user's text and may be hostile: ``Out.line`` escapes it,
    and it is cut and put in quotes so it cannot pass for the fields around it.
    """
    out: list[Span] = []
    for p in content:
        if isinstance(p, BlobPart):
            name = f' "{_clip(p.name, 60)}"' if p.name else ""
            out.append((f" [{p.media_type} {size_text(p.size)} {p.sha256[:12]}{name}]", "cyan"))
        elif isinstance(p, ImagePart):
            # An image stored inside its entry (before blobs; migrate-blobs moves it out).
            out.append((f" [{p.mime_type} {size_text(len(p.data) * 3 // 4)} inline]", "cyan"))
    return out


def _describe_message(m: object, width: int | None) -> list[Span]:
    if isinstance(m, UserMessage):
        return [("user ", "bold cyan"), _clip(m.text, width), *attachments(m.content)]
    if isinstance(m, AssistantMessage):
        out: list[Span] = [("assistant ", "bold green")]
        if m.text:
            out.append(_clip(m.text, width))
        out += [(f" ⚙ {call.name}({_clip(_arguments(call), width)})", "yellow")
                for call in m.tool_calls]
        if m.stop_reason == "error":
            out.append((f" [error: {_clip(m.error_message or 'no message', width)}]",
                        "bold red"))
        elif m.stop_reason == "aborted":
            out.append((" [aborted]", "red"))
        return out
    if isinstance(m, ToolResultMessage):
        style = "red" if m.is_error else "magenta"
        out = [(f"tool {m.tool_name} → ", f"bold {style}")]
        if m.synthesized:
            out.append((f"[{m.synthesized}] ", "bold red"))
        out.append(_clip(m.text, width))
        out.extend(attachments(m.content))
        return out
    return [(type(m).__name__, "dim")]


def describe(entry: Entry, width: int | None = 70) -> list[Span]:
    """One line for an entry: who said what (unescaped; ``Out.line`` escapes).

    Text is cut to ``width`` characters; ``None`` keeps it whole (a pipe).
    """
    if isinstance(entry, MessageEntry):
        return _describe_message(entry.message, width)
    if isinstance(entry, CompactionEntry):
        return [("compaction ", "bold blue"), _clip(entry.summary, width)]
    if isinstance(entry, BranchSummaryEntry):
        return [("branch summary ", "bold blue"), _clip(entry.summary, width)]
    if isinstance(entry, CustomMessageEntry):
        text = "".join(p.text for p in entry.content if isinstance(p, TextPart))
        return [(f"custom message ({entry.kind}) ", "bold blue"), _clip(text, width),
                *attachments(entry.content)]
    if isinstance(entry, CustomEntry):
        return describe_record(entry) or [(f"custom ({entry.kind})", "dim")]
    if isinstance(entry, ErasedEntry):
        return [("[erased] ", "bold red"), (_sealed(entry.of, entry.kind), "dim")]
    if isinstance(entry, SealedEntry):
        return [("[locked] ", "bold yellow"), (_sealed(entry.of, entry.kind), "dim")]
    if isinstance(entry, OpaqueEntry):
        return [(f"unknown entry type {entry.type!r}", "dim")]
    return [(type(entry).__name__, "dim")]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a number and its noun, in the right form."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {plural or (noun[:-1] + 'ies' if noun.endswith('y') else noun + 's')}"


def hidden_note(hidden: int) -> list[Span]:
    """The line saying how many custom entries a view left out, and how to see them."""
    return [(f"… {count(hidden, 'custom entry')} hidden (--custom shows "
             f"{'it' if hidden == 1 else 'them'})", "dim")]


def _sealed(of: str, kind: str | None) -> str:
    return f"{of.replace('_', ' ')} ({kind})" if kind else of.replace("_", " ")


def spans_text(spans: Iterable[Span]) -> Text:
    """Escaped spans as a rich ``Text`` (never parsed as markup)."""
    out = Text()
    for span in spans:
        if isinstance(span, str):
            out.append(visible(span))
        else:
            out.append(visible(span[0]), style=span[1])
    return out


class _Level(NamedTuple):
    """Lines still to draw: the chains that start at ``starts``, under ``prefix``."""

    prefix: str
    starts: list[Entry]


def tree_lines(tree: TreeIndex, *, leaf_id: str | None = None, custom: bool = False,
               width: int | None = 70) -> Iterator[list[Span]]:
    """The entry tree, a line at a time: a linear run stays at one level, each fork
    in the road indents, and the active path and its leaf are marked.

    Custom entries an application or an importer stored are left out unless
    ``custom`` (threadline's own records, and a leaf, always show); the last
    line then says how many. Lines are made as they are written, so a long
    session costs its lines and no layout.
    """
    leaf_id = tree.leaf_id if leaf_id is None else leaf_id
    active = {e.id for e in tree.path(leaf_id)} if leaf_id else set()
    abbrev = Abbrev(e.id for e in tree)
    hidden = 0

    def label(prefix: str, last: bool, entry: Entry) -> list[Span]:
        on_path = entry.id in active
        spans: list[Span] = [prefix + ("└── " if last else "├── "),
                             ("● " if on_path else "○ ", "green" if on_path else "dim"),
                             (abbrev(entry.id) + " ", "dim"), *describe(entry, width)]
        if entry.id == leaf_id:
            spans.append(("  ← leaf", "bold green"))
        return spans

    def level(at: _Level) -> Iterator[list[Span] | _Level]:
        nonlocal hidden
        forks = at.starts
        if len(at.starts) == 1:
            chain = [at.starts[0]]
            kids = tree.children(chain[-1].id)
            while len(kids) == 1:
                chain.append(kids[0])
                kids = tree.children(chain[-1].id)
            shown = [e for e in chain if custom or e.id == leaf_id or shown_by_default(e)]
            hidden += len(chain) - len(shown)
            forks = kids if len(kids) > 1 else []
            for i, entry in enumerate(shown):
                yield label(at.prefix, i == len(shown) - 1 and not forks, entry)
        for i, kid in enumerate(forks):
            last = i == len(forks) - 1
            yield [at.prefix + ("└── " if last else "├── "), ("branch", "dim italic")]
            yield _Level(at.prefix + ("    " if last else "│   "), [kid])

    # An explicit stack of levels: a 100,000-entry chain or fork depth cannot
    # overflow Python's.
    stack = [level(_Level("", tree.roots()))]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, _Level):
            stack.append(level(item))
        else:
            yield item
    if hidden:
        yield hidden_note(hidden)
