"""HTML for a session and for the session list.

A transcript is untrusted: a model or a tool can put any text in it, and so
can whoever chose a session id. Every stored string reaches the page through
``_e`` (``html.escape`` with quotes), is placed only in element text or in a
quoted attribute, and is never turned into a link target; links point only at
pages of the viewer itself, with the id percent-encoded into a query string.
The pages carry no inline script, and the export states a Content-Security-Policy
in a ``<meta>`` tag so even a file opened from disk runs nothing.

This module is pure: entries in, a string out. It needs only the standard
library, so ``threadline export --format html`` works without the viewer extra.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from html import escape
from typing import Any, NamedTuple
from urllib.parse import quote

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    BlobPart,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
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
from threadline.session._text import backslash, has_hidden, hidden_code_points
from threadline.session._tree import TreeIndex
from threadline.viewer._common import shown_by_default

__all__ = [
    "CSS",
    "CUSTOM_RENDERERS",
    "IMAGE_TYPES",
    "PAGE_ENTRIES",
    "BlobSource",
    "Layout",
    "blob_sources",
    "document",
    "document_for",
    "list_body",
    "paging",
    "render_html",
    "session_body",
    "session_href",
]

CustomRenderer = Callable[[CustomEntry[Any]], str]

CUSTOM_RENDERERS: dict[str, CustomRenderer] = {}
"""Hook: custom-entry kind -> function returning the HTML *body* of such an entry.

A kind without a renderer is shown generically (its kind and its data as
JSON), so entries added by newer code, such as tool-ledger records, are
visible before anyone writes a renderer for them. A renderer must escape
what it takes from the entry (``html.escape``).
"""

# Images are shown only for raster types a browser cannot execute, and only
# when the payload is really base64: the data lands in an attribute.
_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
IMAGE_TYPES = _IMAGE_TYPES
"""The only types drawn as images (in ``<img>``, served inline): raster formats
a browser decodes as pixels. An SVG is not among them: it can carry script."""
_CLIP = 120
_PAIR_REACH = 500  # entries searched up from a result for its call
_ANSWER_REACH = 64  # entries searched down from a call for its results

PAGE_ENTRIES = 500
"""Stored entries on one page of a session; the model's view shows as many messages."""


# Control characters are drawn as their Unicode pictures (ESC as ␛), so a
# terminal escape pasted from the page stays inert and is seen for what it
# is; every other character that reorders or hides text (bidi overrides,
# zero-width and tag characters, ...) as the command shows it, ``\u202e``.
_VISIBLE: dict[int, str] = {c: backslash(c) for c in hidden_code_points()} | {
    c: chr(0x2400 + c) for c in range(32)} | {127: "\u2421"}
del _VISIBLE[9], _VISIBLE[10]


def _e(value: object) -> str:
    text = str(value)
    if has_hidden(text, lines=True):
        text = text.translate(_VISIBLE)
    return escape(text, quote=True)


def session_href(session_id: str) -> str:
    return "/session?id=" + quote(session_id, safe="")


def _short(entry_id: str) -> str:
    return entry_id[-6:]


def _clip(text: str, width: int = _CLIP) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(ts: datetime | None) -> str:
    if ts is None:
        return ""
    return f'<time datetime="{_e(ts.isoformat())}">{_e(f"{ts:%Y-%m-%d %H:%M:%S}")}</time>'


def _json(value: Any) -> str:
    if isinstance(value, msgspec.Raw):
        raw = bytes(value)
    else:
        try:
            raw = msgspec.json.encode(value)
        except (TypeError, msgspec.EncodeError):
            return _e(repr(value))
    try:
        pretty = msgspec.json.format(raw, indent=2)
    except msgspec.DecodeError:
        pretty = raw
    return _e(pretty.decode("utf-8", "replace"))


def _text(text: str, cls: str = "text") -> str:
    return f'<pre class="{cls}">{_e(text)}</pre>' if text else ""


def _image(part: ImagePart) -> str:
    mime = part.mime_type.lower()
    data = part.data.strip()
    try:
        ok = mime in _IMAGE_TYPES and bool(base64.b64decode(data, validate=True))
    except ValueError:
        ok = False
    if not ok:
        return f'<p class="note">[image {_e(part.mime_type)}, not shown]</p>'
    return f'<img class="image" alt="image" src="data:{mime};base64,{data}">'


BlobSource = Callable[[BlobPart], "str | None"]
"""Where a page finds an attachment: the viewer's ``/blob`` URL, or a data URL for
an image of a self-contained export; None draws a note in its place."""

_blob_source: ContextVar[BlobSource | None] = ContextVar("blob_source", default=None)


@contextmanager
def blob_sources(source: BlobSource) -> Iterator[None]:
    """Draw the attachments of the pages rendered inside with ``source``."""
    token = _blob_source.set(source)
    try:
        yield
    finally:
        _blob_source.reset(token)


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1024 else f"{n / 1024:,.1f} KiB" if n < 1 << 20 else (
        f"{n / (1 << 20):,.1f} MiB")


def _blob(part: BlobPart) -> str:
    """An image as an image, any other file as a download link, never inline markup.

    Only the image types a browser decodes as pixels go in ``<img>``; an SVG
    (which can hold script) or an HTML file is a link the viewer serves as a
    download (``Content-Disposition: attachment``).
    """
    label = f"{part.name or 'attachment'} ({part.media_type}, {_size(part.size)})"
    source = _blob_source.get()
    url = source(part) if source is not None else None
    if url is not None and part.media_type in _IMAGE_TYPES:
        return f'<img class="image" alt="{_e(label)}" src="{_e(url)}">'
    if url is not None:
        return f'<p class="attachment"><a href="{_e(url)}" download>{_e(label)}</a></p>'
    return f'<p class="note">[{_e(label)}]</p>'


def _parts(parts: Iterable[TextPart | ImagePart | BlobPart | ThinkingPart | ToolCall]) -> str:
    out: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append(_text(part.text))
        elif isinstance(part, ImagePart):
            out.append(_image(part))
        elif isinstance(part, BlobPart):
            out.append(_blob(part))
        elif isinstance(part, ThinkingPart):
            text = "[redacted]" if part.redacted else part.thinking
            out.append(f'<details class="thinking"><summary>thinking</summary>{_text(text)}'
                       "</details>")
    return "".join(out)


# --- tool calls and their results -----------------------------------------

class _Pairs:
    """Tool results matched to the call they answer, for the entries a page draws.

    A result answers the nearest call with its id among its ancestors (ids
    may repeat across turns), so a result on one branch never pairs with a
    call on another. A result sits right after its call or a few entries
    later, so each drawn result looks up for its call and each drawn call
    looks down for its results, within a bound each way: a page costs what it
    draws, and a log full of unmatched results stays cheap.
    """

    def __init__(self, tree: TreeIndex, drawn: Iterable[Entry]) -> None:
        self.results: dict[tuple[str, str], list[MessageEntry]] = {}
        self.call_of: dict[str, str] = {}  # result entry id -> assistant entry id
        for entry in drawn:
            if not isinstance(entry, MessageEntry):
                continue
            message = entry.message
            if isinstance(message, ToolResultMessage):
                owner = self._owner(tree, entry, message.tool_call_id)
                if owner is not None:
                    self.call_of[entry.id] = owner
            elif isinstance(message, AssistantMessage) and message.tool_calls:
                self._answers(tree, entry, {c.id for c in message.tool_calls})

    @staticmethod
    def _owner(tree: TreeIndex, entry: Entry, call_id: str) -> str | None:
        seen: set[str] = set()
        parent = entry.parent_id
        while (parent is not None and parent in tree and parent not in seen
               and len(seen) < _PAIR_REACH):
            seen.add(parent)
            up = tree.get(parent)
            if isinstance(up, MessageEntry) and isinstance(up.message, AssistantMessage) and any(
                c.id == call_id for c in up.message.tool_calls
            ):
                return up.id
            parent = up.parent_id
        return None

    def _answers(self, tree: TreeIndex, call: MessageEntry, ids: set[str]) -> None:
        """The results below ``call`` that answer its calls (not a nearer call's)."""
        found: list[MessageEntry] = []
        stack: list[tuple[Entry, frozenset[str]]] = [
            (kid, frozenset(ids)) for kid in reversed(tree.children(call.id))]
        visited = 0
        while stack and visited < _ANSWER_REACH:
            entry, open_ids = stack.pop()
            visited += 1
            message = entry.message if isinstance(entry, MessageEntry) else None
            if isinstance(message, ToolResultMessage) and message.tool_call_id in open_ids:
                assert isinstance(entry, MessageEntry)
                found.append(entry)
            elif isinstance(message, AssistantMessage) and message.tool_calls:
                open_ids = open_ids - {c.id for c in message.tool_calls}  # a nearer call
            if open_ids:
                stack.extend((kid, open_ids) for kid in reversed(tree.children(entry.id)))
        if any(len([r for r in found if r.message.tool_call_id == i]) > 1  # type: ignore[union-attr]
               for i in ids):
            order = {e.id: n for n, e in enumerate(tree)}  # the model sees the first stored
            found.sort(key=lambda e: order[e.id])
        for result in found:
            assert isinstance(result.message, ToolResultMessage)
            self.results.setdefault((call.id, result.message.tool_call_id), []).append(result)


def _result_state(result: ToolResultMessage | None) -> str:
    """One of a fixed set of words (it is used as a CSS class, unescaped)."""
    if result is None:
        return "pending"
    if result.synthesized:
        # Decoding admits only the two literals, but a struct built in memory
        # is not checked: never let its value through.
        return result.synthesized if result.synthesized in ("aborted", "interrupted") \
            else "synthesized"
    return "error" if result.is_error else "ok"


def _tool_call(entry_id: str, index: int, call: ToolCall, results: Sequence[MessageEntry]) -> str:
    first = results[0].message if results else None
    result = first if isinstance(first, ToolResultMessage) else None
    state = _result_state(result)
    out = [
        f'<details class="tool {state}" id="{_e(f"t-{entry_id}-{index}")}">',
        f'<summary><span class="tool-name">{_e(call.name)}</span> '
        f'<span class="badge {state}">{state}</span> '
        f'<span class="dim">{_e(_clip(_args_line(call), 80))}</span></summary>',
        f'<div class="label">arguments</div><pre class="json">{_json(call.arguments)}</pre>',
    ]
    if result is None:
        out.append('<p class="note">no result stored on this branch</p>')
    else:
        out.append(f'<div class="label">result <a class="eid" href="#{_e("e-" + results[0].id)}">'
                   f"{_e(_short(results[0].id))}</a></div>")
        out.append(_parts(result.content) or '<p class="note">(empty)</p>')
        if result.details is not None:
            out.append(f'<pre class="json">{_json(result.details)}</pre>')
    if len(results) > 1:
        out.append(f'<p class="note">{_count(len(results) - 1, "more result", "more results")} '
                   'stored for this call; '
                   "the model sees the first</p>")
    out.append("</details>")
    return "".join(out)


def _args_line(call: ToolCall) -> str:
    return _compact(call.arguments)


def _compact(value: Any) -> str:
    try:
        raw = bytes(value) if isinstance(value, msgspec.Raw) else msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return repr(value)
    return raw.decode("utf-8", "replace")


# --- one entry ---------------------------------------------------------------

def _message_body(entry: MessageEntry, pairs: _Pairs | None) -> tuple[str, str]:
    m = entry.message
    if isinstance(m, UserMessage):
        return "user", _parts(m.content)
    if isinstance(m, AssistantMessage):
        body = [_parts(m.content)]
        for i, call in enumerate(m.tool_calls):
            found = pairs.results.get((entry.id, call.id), []) if pairs else []
            body.append(_tool_call(entry.id, i, call, found))
        if m.stop_reason in ("error", "aborted"):
            body.append(f'<p class="error">{_e(m.stop_reason)}: {_e(m.error_message or "")}</p>')
        meta = " · ".join(x for x in (m.provider, m.model) if x)
        return "assistant", "".join(body) + (f'<p class="dim">{_e(meta)}</p>' if meta else "")
    state = _result_state(m)
    owner = pairs.call_of.get(entry.id) if pairs else None
    head = (f'<span class="tool-name">{_e(m.tool_name)}</span> '
            f'<span class="badge {state}">{state}</span>')
    if owner is not None:
        # Shown in full with its call; here only a pointer back.
        return "tool", (f'<p class="dim">{head} result of the call in '
                        f'<a class="eid" href="#{_e("e-" + owner)}">{_e(_short(owner))}</a></p>')
    return "tool", (f'<p>{head} <span class="note">no matching call on this branch</span></p>'
                    + _parts(m.content))


def _entry_body(entry: Entry, pairs: _Pairs | None) -> tuple[str, str]:
    """(label, inner HTML) for one entry."""
    if isinstance(entry, MessageEntry):
        return _message_body(entry, pairs)
    if isinstance(entry, CompactionEntry):
        keep = entry.first_kept_entry_id
        return "compaction", (
            '<div class="label">the model sees this summary instead of the entries before '
            f'<a class="eid" href="#{_e("e-" + keep)}">{_e(_short(keep))}</a>'
            + (f" ({entry.tokens_before} tokens before)" if entry.tokens_before else "")
            + "</div>" + _text(entry.summary)
        )
    if isinstance(entry, BranchSummaryEntry):
        return "branch summary", (
            f'<div class="label">summary of the branch that ended at '
            f'<a class="eid" href="#{_e("e-" + entry.from_id)}">{_e(_short(entry.from_id))}</a>'
            "</div>" + _text(entry.summary)
        )
    if isinstance(entry, CustomMessageEntry):
        note = "" if entry.display else ' <span class="note">(hidden from users)</span>'
        return "custom message", (f'<p class="dim">kind {_e(entry.kind)}{note}</p>'
                                  + _parts(entry.content))
    if isinstance(entry, CustomEntry):
        renderer = CUSTOM_RENDERERS.get(entry.kind)
        if renderer is not None:
            return f"custom · {entry.kind}", renderer(entry)
        return f"custom · {entry.kind}", (
            f'<details id="{_e("d-" + entry.id)}"><summary>data '
            f'<span class="dim">{_e(_clip(_compact(entry.data), 90))}</span></summary>'
            f'<pre class="json">{_json(entry.data)}</pre></details>'
        )
    if isinstance(entry, ErasedEntry):
        return f"[erased] {_sealed_label(entry.of, entry.kind)}", (
            '<p class="note">erased: its subject\'s key was destroyed, its content is gone</p>')
    if isinstance(entry, SealedEntry):
        return f"[locked] {_sealed_label(entry.of, entry.kind)}", (
            '<p class="note">locked: encrypted, and this viewer has no key to open it (or its '
            "envelope is damaged; <code>threadline check</code> says which)</p>")
    assert isinstance(entry, OpaqueEntry)
    return f"unknown type · {entry.type}", (
        '<p class="note">stored by a newer version; kept as is</p>'
        f'<details><summary>raw</summary><pre class="json">{_json(msgspec.Raw(entry.raw))}'
        "</pre></details>"
    )


def _sealed_label(of: str, kind: str | None) -> str:
    return f"{of.replace('_', ' ')} · {kind}" if kind else of.replace("_", " ")


def _entry(entry: Entry, pairs: _Pairs, active: set[str], folded: set[str]) -> str:
    label, body = _entry_body(entry, pairs)
    kind = label.split(" ", 1)[0].strip("[]")
    classes = ["entry", f"k-{kind}"]
    flags = ""
    if entry.id in active:
        classes.append("active")
    if entry.id in folded:
        classes.append("folded")
        flags = '<span class="badge folded">in summary</span>'
    return (
        f'<article class="{" ".join(classes)}" id="{_e("e-" + entry.id)}">'
        f'<div class="meta"><span class="who">{_e(label)}</span>{flags}'
        f'<a class="eid" href="#{_e("e-" + entry.id)}" title="{_e(entry.id)}">'
        f"{_e(_short(entry.id))}</a>{_time(entry.timestamp)}</div>"
        f"{body}</article>"
    )


def _summary_line(entry: Entry) -> str:
    label, _ = _entry_body(entry, None)
    if isinstance(entry, MessageEntry):
        text = getattr(entry.message, "text", "")
    elif isinstance(entry, CompactionEntry | BranchSummaryEntry):
        text = entry.summary
    else:
        text = ""
    return f"{label}: {_clip(text, 70)}" if text else label


# --- the tree ------------------------------------------------------------------

def _folded(path: Sequence[Entry]) -> set[str]:
    """Entries on ``path`` the model no longer sees because a compaction replaced them."""
    for i in range(len(path) - 1, -1, -1):
        entry = path[i]
        if isinstance(entry, CompactionEntry):
            kept = next((j for j in range(i) if path[j].id == entry.first_kept_entry_id), i)
            return {e.id for e in path[:kept]}
    return set()


class _Open(NamedTuple):
    """A block the walk enters: a fork (``kid`` None) or one branch of it."""

    kid: Entry | None
    active: bool = False


_CLOSE = "close"


class Layout:
    """A session's stored log in the order the page draws it, cut into pages.

    The walk draws a chain of single children flat; where an entry has
    several children each branch gets its own collapsible block, open when
    it holds the active path. It is iterative, so a deep or hand-made log
    cannot exhaust the stack. Custom entries an application or importer
    stored are left out unless ``custom`` (they still carry their children).
    A page holds ``per_page`` drawn entries (all of them for None), and
    pages are counted in the walk's order; the leaf's page is the default.
    """

    def __init__(self, tree: TreeIndex, *, custom: bool = False,
                 per_page: int | None = PAGE_ENTRIES) -> None:
        self.tree = tree
        path = tree.path()
        self.path = path
        self.active = {e.id for e in path}
        self.items: list[Entry | _Open | str] = []
        self.hidden = 0
        self.cycle = 0
        shown = self._walk(custom)
        self.entries = shown
        self.drawn = [item for item in self.items if not isinstance(item, _Open | str)]
        self.per_page = per_page or max(shown, 1)
        self.pages = max(1, -(-shown // self.per_page))
        on_path = [i for i, item in enumerate(self.drawn) if item.id in self.active]
        self.leaf_page = on_path[-1] // self.per_page + 1 if on_path else self.pages

    def _walk(self, custom: bool) -> int:
        tree, out = self.tree, self.items
        seen: set[str] = set()
        shown = 0
        stack: list[Entry | _Open | str] = []
        roots = tree.roots()
        if len(roots) == 1:
            stack.append(roots[0])
        elif roots:
            self._fork(stack, roots)
        while stack:
            item = stack.pop()
            if isinstance(item, _Open | str):
                out.append(item)
                continue
            entry: Entry | None = item
            while entry is not None and entry.id not in seen:
                seen.add(entry.id)
                if custom or shown_by_default(entry):
                    out.append(entry)
                    shown += 1
                else:
                    self.hidden += 1
                kids = tree.children(entry.id)
                if len(kids) == 1:
                    entry = kids[0]
                    continue
                if kids:
                    self._fork(stack, kids)
                entry = None
        self.cycle = len(tree) - len(seen)
        return shown

    def _fork(self, stack: list[Entry | _Open | str], kids: Sequence[Entry]) -> None:
        """Queue one block per sibling branch, drawn in append order."""
        items: list[Entry | _Open | str] = [_Open(None)]
        for kid in kids:
            items += [_Open(kid, kid.id in self.active), kid, _CLOSE]
        items.append(_CLOSE)
        stack.extend(reversed(items))  # the stack pops from its end

    def html(self, page: int) -> str:
        """The stored log's entries on ``page`` (1-based), inside the blocks that hold them."""
        lo = (page - 1) * self.per_page
        hi = lo + self.per_page
        pairs = _Pairs(self.tree, self.drawn[lo:hi])
        folded = _folded(self.path)
        out: list[str] = []
        opened: list[list[Any]] = []  # [block, drawn yet]
        n = 0
        for item in self.items:
            if isinstance(item, _Open):
                opened.append([item, False])
            elif isinstance(item, str):
                block, drawn = opened.pop()
                if drawn:
                    out.append("</details>" if block.kid is not None else "</div>")
            elif n >= hi:
                break
            else:
                if n >= lo:
                    # A block is drawn only once it holds an entry of this page.
                    for held in opened:
                        if not held[1]:
                            out.append(_open_html(held[0]))
                            held[1] = True
                    out.append(_entry(item, pairs, self.active, folded))
                n += 1
        for block, drawn in reversed(opened):
            if drawn:
                out.append("</details>" if block.kid is not None else "</div>")
        if self.cycle and page == self.pages:
            out.append(f'<p class="note">{_count(self.cycle, "entry", "entries")} form a cycle '
                       "of parent links and are not shown</p>")
        return "".join(out)


def _open_html(block: _Open) -> str:
    if block.kid is None:
        return '<div class="fork">'
    on = block.active
    return (f'<details class="branch{" active" if on else ""}" id="{_e("b-" + block.kid.id)}"'
            f'{" open" if on else ""}><summary>'
            f'{"active branch" if on else "branch"} · {_e(_summary_line(block.kid))}</summary>')


def _count(n: int, noun: str, plural: str) -> str:
    return f"1 {noun}" if n == 1 else f"{n:,} {plural}"


# --- what the model sees ---------------------------------------------------------

def _context(path: Sequence[Entry], limit: int | None) -> str:
    """The model's view of ``path``: its last ``limit`` messages (all for None).

    A long path is read from its tail only: four entries a message is more
    than any session needs, and the view of the tail ends as the whole
    path's does.
    """
    window = None if limit is None else 4 * limit
    cut = window is not None and len(path) > window
    messages: list[Message] = build_context(path[-window:] if cut and window else path)
    out: list[str] = []
    earlier = 0 if limit is None else max(0, len(messages) - limit)
    if cut:
        out.append('<p class="note">earlier messages not shown</p>')
    elif earlier:
        out.append(f'<p class="note">{_count(earlier, "earlier message", "earlier messages")} '
                   "not shown</p>")
    for m in messages[earlier:]:
        if isinstance(m, UserMessage):
            who, body = "user", _parts(m.content)
        elif isinstance(m, AssistantMessage):
            calls = "".join(
                f'<p><span class="tool-name">{_e(c.name)}</span> '
                f'<span class="dim">{_e(_clip(_args_line(c), 80))}</span></p>'
                for c in m.tool_calls
            )
            who, body = "assistant", _parts(m.content) + calls
        else:
            state = _result_state(m)
            who = "tool"
            body = (f'<p><span class="tool-name">{_e(m.tool_name)}</span> '
                    f'<span class="badge {state}">{state}</span></p>' + _parts(m.content))
        out.append(f'<article class="entry k-{who}"><div class="meta">'
                   f'<span class="who">{who}</span></div>{body}</article>')
    return "".join(out) or '<p class="note">nothing yet</p>'


# --- pages -------------------------------------------------------------------------

def paging(tree: TreeIndex, *, custom: bool = False,
           per_page: int | None = PAGE_ENTRIES) -> tuple[int, int]:
    """(pages, the page that holds the leaf) of a session drawn ``per_page`` entries a page."""
    layout = Layout(tree, custom=custom, per_page=per_page)
    return layout.pages, layout.leaf_page


def session_body(
    tree: TreeIndex,
    record: SessionRecord | None,
    *,
    children: Sequence[SessionRecord] = (),
    linked: bool = True,
    notes: Sequence[str] = (),
    page: int | None = None,
    custom: bool = False,
    per_page: int | None = PAGE_ENTRIES,
    layout: Layout | None = None,
    usage: str = "",
) -> str:
    """The body of a session's page: header, one page of the stored tree, model context.

    ``linked`` makes lineage and page navigation into links to the viewer's
    own pages; an export names the sessions without linking (their pages
    are not in the file). ``notes`` are what the store noticed while loading
    (a torn last line...). ``page`` (1-based; None: the leaf's) picks the
    page of ``per_page`` entries; ``custom`` draws custom entries too.
    ``usage`` is the usage section (``viewer._usage``), drawn under the header.
    """
    sid = tree.session_id
    layout = layout or Layout(tree, custom=custom, per_page=per_page)
    page = min(max(page or layout.leaf_page, 1), layout.pages)

    def ref(other: str) -> str:
        if linked:
            return f'<a class="sid" href="{_e(session_href(other))}">{_e(other)}</a>'
        return f'<code class="sid">{_e(other)}</code>'

    def href(to_page: int | None, show_custom: bool = custom) -> str:
        return (session_href(sid) + (f"&page={to_page}" if to_page else "")
                + ("&custom=1" if show_custom else ""))

    lineage: list[str] = []
    if record is not None and record.parent_id is not None:
        lineage.append(f"forked from {ref(record.parent_id)}")
    if children:
        lineage.append("forks: " + ", ".join(ref(c.id) for c in children))
    branch_count = max(len(tree.leaves()), 1 if len(tree) else 0)
    facts = [_count(len(tree), "entry", "entries"), _count(branch_count, "branch", "branches")]
    if record is not None:
        facts.append(f"created {record.created_at:%Y-%m-%d %H:%M:%S}")
    leaf = tree.leaf_id
    leaf_href = "#" + "e-" + leaf if leaf and (page == layout.leaf_page or not linked) else (
        href(None) + "#e-" + (leaf or ""))
    views = [f"page {page:,} of {layout.pages:,}"] if layout.pages > 1 else []
    if layout.hidden:
        views.append(_count(layout.hidden, "custom entry", "custom entries") + " hidden")
    return (
        '<header class="session" id="head">'
        f'<h1><span class="dim">session</span> <code class="sid">{_e(sid)}</code></h1>'
        f'<p class="facts">{_e(" · ".join(facts))}'
        + (f' · leaf <a class="eid" href="{_e(leaf_href)}">{_e(_short(leaf))}</a>'
           if leaf else "")
        + "</p>"
        + (f'<p class="lineage">{" · ".join(lineage)}</p>' if lineage else "")
        + "".join(f'<p class="note">{_e(n)}</p>' for n in notes)
        + _views(views, layout, page, linked=linked, href=href, custom=custom)
        + "</header>"
        + usage
        + '<div class="columns">'
        f'<section id="tree" class="tree"><h2>Stored log</h2>'
        f"{layout.html(page) or _empty()}</section>"
        '<section id="context" class="context"><h2>What the model sees</h2>'
        '<p class="dim">the active path as the next model call receives it</p>'
        f"{_context(layout.path, per_page)}</section>"
        "</div>"
    )


def _views(views: list[str], layout: Layout, page: int, *, linked: bool,
           href: Callable[..., str], custom: bool) -> str:
    """Where this page sits among the session's pages, and the custom-entry switch."""
    if not views and not custom:
        return ""
    links: list[str] = []
    if linked:
        if page > 1:
            links += [f'<a href="{_e(href(1))}">first</a>',
                      f'<a rel="prev" href="{_e(href(page - 1))}">← earlier</a>']
        if page < layout.pages:
            links += [f'<a rel="next" href="{_e(href(page + 1))}">later →</a>',
                      f'<a href="{_e(href(layout.pages))}">last</a>']
        if layout.hidden:
            links.append(f'<a href="{_e(href(None, True))}">show custom entries</a>')
        elif custom:
            links.append(f'<a href="{_e(href(None, False))}">hide custom entries</a>')
    return (f'<nav class="pages" id="pages"><span>{_e(" · ".join(views))}</span>'
            + "".join(links) + "</nav>")


def _empty() -> str:
    return '<p class="note">no entries yet</p>'


def list_body(
    sessions: Sequence[SessionRecord],
    *,
    query: str,
    next_href: str | None,
    paged: bool,
    can_list: bool,
    titles: Mapping[str, str] | None = None,
) -> str:
    titles = titles or {}
    rows = "".join(
        "<tr>"
        f'<td><a class="sid" href="{_e(session_href(r.id))}">{_e(r.id)}</a></td>'
        f"<td>{_e(titles.get(r.id, ''))}</td>"
        f"<td>{_e_link(r.parent_id)}</td>"
        f"<td>{_time(r.created_at)}</td>"
        "</tr>"
        for r in sessions
    )
    form = (
        '<form class="filter" method="get" action="/">'
        f'<input type="search" name="q" value="{_e(query)}" placeholder="filter by id" '
        'aria-label="filter by id"><button type="submit">Filter</button>'
        + ('<a href="/">clear</a>' if query else "")
        + "</form>"
        '<form class="filter" method="get" action="/session">'
        '<input type="text" name="id" placeholder="open a session id" aria-label="session id">'
        '<button type="submit">Open</button></form>'
    )
    if not can_list:
        return form + '<p class="note">this store cannot list its sessions; open one by id</p>'
    table = (
        '<table class="sessions"><thead><tr><th>session</th><th>title</th><th>forked from</th>'
        f"<th>created</th></tr></thead><tbody>{rows}</tbody></table>"
        if sessions else '<p class="note">no sessions' + (" match" if query else "") + "</p>"
    )
    nav = '<nav class="pages">'
    first = "/?q=" + quote(query, safe="") if query else "/"
    nav += f'<a href="{_e(first)}">first page</a>' if paged else ""
    if next_href:
        nav += f' <a rel="next" href="{_e(next_href)}">older →</a>'
    nav += "</nav>"
    return "<h1>Sessions</h1>" + form + table + nav


def _e_link(session_id: str | None) -> str:
    if session_id is None:
        return ""
    return f'<a class="sid" href="{_e(session_href(session_id))}">{_e(session_id)}</a>'


def document(title: str, body: str, *, head: str = "", live: str = "",
             linked: bool = True) -> str:
    """A whole document. ``head`` adds to ``<head>``; ``live`` is the live-status tag;
    ``linked`` is false for the export, whose top bar has nowhere to go."""
    home = ('<a href="/">threadline</a><form class="search" method="get" action="/search" '
            'role="search"><input type="search" name="q" placeholder="search all sessions" '
            'aria-label="search all sessions"><button type="submit">Search</button></form>'
            if linked else "<span>threadline export</span>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{_e(title)}</title>{head}</head>"
        f'<body><nav class="top">{home}{live}</nav>'
        f"<main>{body}</main></body></html>"
    )


def render_html(tree: TreeIndex, record: SessionRecord | None = None,
                children: Sequence[SessionRecord] = (), *, page: int | None = None,
                per_page: int | None = PAGE_ENTRIES, custom: bool = False) -> str:
    """A session as one self-contained HTML document (``export --format html``).

    It makes no request: the CSS is inline, admitted by its hash in the page's
    Content-Security-Policy, which also forbids every script, so the file runs
    nothing even where it is opened from disk. ``record`` and ``children``
    add the fork lineage, named but not linked. Like the viewer it draws one
    page of ``per_page`` stored entries (the leaf's unless ``page`` says;
    ``per_page=None`` draws them all), without custom entries unless ``custom``.
    """
    return document_for(tree, record, children, page=page,
                        layout=Layout(tree, custom=custom, per_page=per_page))


def document_for(tree: TreeIndex, record: SessionRecord | None,
                 children: Sequence[SessionRecord], *, page: int | None,
                 layout: Layout) -> str:
    """``render_html`` for a layout already made (the command reads its page count)."""
    digest = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'sha256-{digest}'; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    head = (f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">'
            '<meta name="referrer" content="no-referrer">'
            f"<style>{CSS}</style>")
    body = session_body(tree, record, children=children, linked=False, page=page,
                        layout=layout)
    return document(f"session {tree.session_id}", body, head=head, linked=False)


CSS = """
:root{--bg:#f7f7f5;--fg:#1d1d1f;--dim:#6b6b70;--line:#deded9;--card:#fff;--acc:#2457c5;
--user:#e8f0fe;--asst:#fff;--tool:#f3f0fa;--sum:#fff7e0;--ok:#1b7f3b;--err:#b3261e;
--warn:#9a6700;font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg)}
a{color:var(--acc);text-decoration:none}a:hover{text-decoration:underline}
nav.top{display:flex;gap:1rem;align-items:center;padding:.6rem 1.2rem;background:#1d1d1f}
nav.top a,nav.top span{color:#fff;font-weight:600}
#live-state{margin-left:auto;font-size:.8rem;font-weight:500;color:#bbb}
#live-state.on{color:#7ee2a0}
main{max-width:1400px;margin:0 auto;padding:1rem 1.2rem 3rem}
h1{font-size:1.35rem;margin:.4rem 0}h2{font-size:1rem;margin:.2rem 0 .6rem;color:var(--dim);
text-transform:uppercase;letter-spacing:.05em}
code,pre,.sid,.eid{font-family:ui-monospace,"SF Mono",Menlo,Consolas,monospace}
.sid{overflow-wrap:anywhere}.facts,.lineage{margin:.2rem 0;color:var(--dim)}
.columns{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:1.2rem;
margin-top:1rem}@media (max-width:900px){.columns{grid-template-columns:1fr}}
.entry{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--line);
border-radius:6px;padding:.45rem .7rem;margin:.4rem 0}
.entry.active{border-left-color:var(--acc)}
.entry.folded{opacity:.55}
.k-user{background:var(--user)}.k-tool{background:var(--tool)}
.k-compaction,.k-branch{background:var(--sum)}
.meta{display:flex;gap:.6rem;align-items:baseline;font-size:.8rem;color:var(--dim)}
.meta .who{font-weight:600;color:var(--fg)}.meta time{margin-left:auto}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3rem 0;font-size:.86rem}
pre.text{font-family:inherit;font-size:.95rem}
pre.json{background:#f4f4f2;padding:.4rem .5rem;border-radius:4px;max-height:24rem;overflow:auto}
details{margin:.3rem 0}summary{cursor:pointer}
details.tool{border:1px solid var(--line);border-radius:5px;padding:.25rem .5rem;background:#fbfbfa}
details.tool.interrupted,details.tool.aborted,details.tool.pending{border-color:#e7c46a}
details.tool.error{border-color:#e6a19c}
.tool-name{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:600}
.badge{font-size:.72rem;padding:.05rem .4rem;border-radius:9px;background:#e9e9e6;
color:var(--dim);font-weight:600}
.badge.ok{background:#dcf3e3;color:var(--ok)}.badge.error{background:#fbe0de;color:var(--err)}
.badge.interrupted,.badge.aborted,.badge.pending{background:#fdf0cc;color:var(--warn)}
.badge.folded{background:#fff1c2;color:var(--warn)}
.fork{border-left:2px dashed var(--line);margin:.3rem 0 .3rem .6rem;padding-left:.7rem}
details.branch>summary{color:var(--dim);font-size:.85rem;padding:.2rem 0}
details.branch.active>summary{color:var(--acc);font-weight:600}
.label{font-size:.75rem;color:var(--dim);text-transform:uppercase;letter-spacing:.04em;
margin-top:.3rem}
.entry p{margin:.25rem 0}.label a{text-transform:none}
.dim{color:var(--dim)}.note{color:var(--warn);font-size:.85rem}.error{color:var(--err)}
.image{max-width:100%;max-height:20rem;border-radius:4px}
.context .entry{padding:.35rem .6rem}.context pre.text{font-size:.88rem}
table.sessions{border-collapse:collapse;width:100%;background:var(--card);
border:1px solid var(--line);border-radius:6px}
table.sessions th,table.sessions td{text-align:left;padding:.45rem .7rem;
border-bottom:1px solid var(--line)}
table.sessions th{font-size:.8rem;color:var(--dim);text-transform:uppercase}
table.sessions td:first-child{min-width:18rem}table.sessions td:last-child{white-space:nowrap}
form.filter{display:inline-flex;gap:.4rem;margin:.5rem 1rem .8rem 0;align-items:center}
input{font:inherit;padding:.3rem .5rem;border:1px solid var(--line);border-radius:4px;
min-width:16rem}button{font:inherit;padding:.3rem .8rem;border-radius:4px;
border:1px solid var(--acc);background:var(--acc);color:#fff;cursor:pointer}
nav.pages{margin-top:.8rem;display:flex;gap:1rem}
section.usage{margin-top:.8rem}table.usage td.num{text-align:right;white-space:nowrap}
table.usage tr.sum td{font-weight:600}
"""
