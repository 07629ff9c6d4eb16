"""What an entry looks like on screen, and the short ids that name entries.

``describe`` returns spans for ``Out.line``, which escapes them; the tree is
a rich ``Tree`` of ``Text`` built from the same escaped spans. The short id
shown is the shortest tail (six characters at least) that tells the
session's entries apart, and ``resolve`` accepts exactly that, so what the
screen shows can be typed back.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from rich.tree import Tree

from threadline.ai._messages import AssistantMessage, ToolResultMessage, UserMessage
from threadline.cli._approvals import describe_record
from threadline.cli._output import Span, visible
from threadline.errors import ConfigError, EntryNotFound
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    OpaqueEntry,
)
from threadline.session._tree import TreeIndex

__all__ = ["Abbrev", "describe", "resolve", "session_tree", "short", "spans_text"]

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


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _describe_message(m: object, width: int) -> list[Span]:
    if isinstance(m, UserMessage):
        return [("user ", "bold cyan"), _clip(m.text, width)]
    if isinstance(m, AssistantMessage):
        out: list[Span] = [("assistant ", "bold green")]
        if m.text:
            out.append(_clip(m.text, width))
        out += [(f" ⚙ {call.name}({_clip(str(call.arguments), 30)})", "yellow")
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
        return out
    return [(type(m).__name__, "dim")]


def describe(entry: Entry, width: int = 70) -> list[Span]:
    """One line for an entry: who said what (unescaped; ``Out.line`` escapes)."""
    if isinstance(entry, MessageEntry):
        return _describe_message(entry.message, width)
    if isinstance(entry, CompactionEntry):
        return [("compaction ", "bold blue"), _clip(entry.summary, width)]
    if isinstance(entry, BranchSummaryEntry):
        return [("branch summary ", "bold blue"), _clip(entry.summary, width)]
    if isinstance(entry, CustomMessageEntry):
        return [(f"custom message ({entry.kind}) ", "bold blue")]
    if isinstance(entry, CustomEntry):
        return describe_record(entry) or [(f"custom ({entry.kind})", "dim")]
    if isinstance(entry, OpaqueEntry):
        return [(f"unknown entry type {entry.type!r}", "dim")]
    return [(type(entry).__name__, "dim")]


def spans_text(spans: Iterable[Span]) -> Text:
    """Escaped spans as a rich ``Text`` (never parsed as markup)."""
    out = Text()
    for span in spans:
        if isinstance(span, str):
            out.append(visible(span))
        else:
            out.append(visible(span[0]), style=span[1])
    return out


def session_tree(tree: TreeIndex, *, title: str, leaf_id: str | None = None) -> Tree:
    """The entry tree: a linear run stays at one level, each fork in the road indents.

    The active leaf is marked, and so is every entry on the active path.
    """
    leaf_id = tree.leaf_id if leaf_id is None else leaf_id
    active = {e.id for e in tree.path(leaf_id)} if leaf_id else set()
    abbrev = Abbrev(e.id for e in tree)
    root = Tree(spans_text([(title, "bold")]))

    def label(entry: Entry) -> Text:
        on_path = entry.id in active
        spans: list[Span] = [("● " if on_path else "○ ", "green" if on_path else "dim"),
                             (abbrev(entry.id) + " ", "dim"), *describe(entry)]
        if entry.id == leaf_id:
            spans.append(("  ← leaf", "bold green"))
        return spans_text(spans)

    # Iterative, so a 100,000-entry chain cannot overflow the stack.
    stack: list[tuple[Tree, list[Entry]]] = [(root, tree.roots())]
    while stack:
        node, chain_starts = stack.pop()
        for start in chain_starts:
            parent = node.add(Text("branch", style="dim italic")) if len(chain_starts) > 1 else node
            current: Entry | None = start
            while current is not None:
                parent.add(label(current))
                kids = tree.children(current.id)
                if len(kids) == 1:
                    current = kids[0]
                    continue
                if kids:
                    stack.append((parent, kids))
                current = None
    return root
