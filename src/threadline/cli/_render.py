"""Terminal rendering of entries and session trees (rich)."""

from __future__ import annotations

from rich.text import Text
from rich.tree import Tree

from threadline.ai._messages import AssistantMessage, ToolResultMessage, UserMessage
from threadline.cli._approvals import describe_record
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

__all__ = ["describe", "session_tree", "short"]


def short(entry_id: str) -> str:
    """The random tail of a UUIDv7 id: enough to tell entries apart on screen."""
    return entry_id[-6:]


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(entry: Entry, width: int = 70) -> Text:
    """One line for an entry: who said what."""
    out = Text()
    if isinstance(entry, MessageEntry):
        m = entry.message
        if isinstance(m, UserMessage):
            out.append("user ", style="bold cyan")
            out.append(_clip(m.text, width))
        elif isinstance(m, AssistantMessage):
            out.append("assistant ", style="bold green")
            if m.text:
                out.append(_clip(m.text, width))
            for call in m.tool_calls:
                out.append(f" ⚙ {call.name}({_clip(str(call.arguments), 30)})", style="yellow")
            if m.stop_reason in ("error", "aborted"):
                out.append(f" [{m.stop_reason}]", style="red")
        elif isinstance(m, ToolResultMessage):
            style = "red" if m.is_error else "magenta"
            out.append(f"tool {m.tool_name} → ", style=f"bold {style}")
            if m.synthesized:
                out.append(f"[{m.synthesized}] ", style="bold red")
            out.append(_clip(m.text, width))
    elif isinstance(entry, CompactionEntry):
        out.append("compaction ", style="bold blue")
        out.append(_clip(entry.summary, width))
    elif isinstance(entry, BranchSummaryEntry):
        out.append("branch summary ", style="bold blue")
        out.append(_clip(entry.summary, width))
    elif isinstance(entry, CustomMessageEntry):
        out.append(f"custom message ({entry.kind}) ", style="bold blue")
    elif isinstance(entry, CustomEntry):
        out.append_text(describe_record(entry) or Text(f"custom ({entry.kind})", style="dim"))
    elif isinstance(entry, OpaqueEntry):
        out.append(f"unknown entry type {entry.type!r}", style="dim")
    return out


def session_tree(tree: TreeIndex, *, title: str | Text, leaf_id: str | None = None) -> Tree:
    """The entry tree: a linear run stays at one level, each fork in the road indents.

    The active leaf is marked, and so is every entry on the active path.
    """
    leaf_id = tree.leaf_id if leaf_id is None else leaf_id
    active = {e.id for e in tree.path(leaf_id)} if leaf_id else set()
    root = Tree(title if isinstance(title, Text) else Text(title, style="bold"))

    def label(entry: Entry) -> Text:
        mark = "●" if entry.id in active else "○"
        t = Text(f"{mark} ", style="green" if entry.id in active else "dim")
        t.append(short(entry.id) + " ", style="dim")
        t.append_text(describe(entry))
        if entry.id == leaf_id:
            t.append("  ← leaf", style="bold green")
        return t

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
