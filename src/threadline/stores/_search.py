"""What search indexes, and the query rules every searchable store shares.

One entry gives one indexed text (``indexed_text``), or none:

- a message's user and assistant text, the names of the tools an assistant
  called and the name of the tool a result answers;
- the summary of a compaction or of a branch;
- the text of a custom message (the model reads it as a user message).

Not indexed: tool arguments and tool results, reasoning (thinking) parts,
images, custom entries, and sealed or erased entries. Arguments and results
are machine text (JSON, file contents, fetched pages, command output) that is
often far bigger than the conversation, would drown its words in the ranking
and the index size, and holds data the user never saw or typed: secrets read
by a tool, other people's files. What a tool found reaches the user through
the assistant's answer, and that is indexed. Reasoning is left out for the
same reason: the user did not see it.

The PostgreSQL store computes the same text in SQL (``postgres/_search.py``);
the two are checked against each other by the conformance part.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple, TypeVar

from threadline.ai._messages import AssistantMessage, TextPart, ToolCall, ToolResultMessage
from threadline.errors import ConfigError
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
)
from threadline.session._metadata import fold_metadata
from threadline.stores._contract import SearchHit

__all__ = [
    "MAX_QUERY_TERMS",
    "Query",
    "check_search",
    "indexed_text",
    "marked",
    "path_keys",
    "query_terms",
    "rank_of",
    "scan_search",
    "snippet_of",
    "word_spans",
    "words",
]

MAX_QUERY_TERMS = 32
"""More words than this in one query is refused (``ConfigError``)."""
MAX_LIMIT = 1000
K = TypeVar("K")

_WORD = re.compile(r"\w+")


def indexed_text(entry: Entry) -> str | None:
    """The text search indexes for ``entry``, or None if nothing of it is indexed."""
    if isinstance(entry, MessageEntry):
        message = entry.message
        if isinstance(message, ToolResultMessage):
            return message.tool_name or None
        parts: list[str] = []
        for part in message.content:
            if isinstance(part, TextPart):
                parts.append(part.text)
            elif isinstance(part, ToolCall) and isinstance(message, AssistantMessage):
                parts.append(part.name)
        text = "\n".join(p for p in parts if p)
        return text or None
    if isinstance(entry, CompactionEntry | BranchSummaryEntry):
        return entry.summary or None
    if isinstance(entry, CustomMessageEntry):
        text = "\n".join(p.text for p in entry.content if isinstance(p, TextPart) and p.text)
        return text or None
    return None


def query_terms(query: str) -> list[str]:
    """The words of ``query``, lower-cased: a hit holds every one of them.

    A query has no operators: quotes, ``-``, ``*``, ``AND`` and the like are
    plain text (punctuation separates words), so no query can fail to parse.
    """
    if not isinstance(query, str):
        raise ConfigError(f"a search query is a string, got {type(query).__name__}")
    terms = [t.lower() for t in _WORD.findall(query.replace("_", " "))]
    if not terms:
        raise ConfigError(f"a search query needs at least one word, got {query[:80]!r}")
    if len(terms) > MAX_QUERY_TERMS:
        raise ConfigError(f"a search query has at most {MAX_QUERY_TERMS} words, "
                          f"got {len(terms)}")
    return list(dict.fromkeys(terms))


class Query(NamedTuple):
    """A search, checked: what every store's ``search`` runs."""

    terms: list[str]
    owner: str | None
    tenant: str | None
    limit: int
    active_path: bool


def check_search(query: str, owner: str | None, tenant: str | None, limit: int,
                 active_path: bool) -> Query:
    """Check ``search``'s arguments (``ConfigError``)."""
    for name, value in (("owner", owner), ("tenant", tenant)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"search {name} is a string or None, got {type(value).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"search limit is an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    return Query(query_terms(query), owner, tenant, limit, bool(active_path))


def words(text: str) -> list[str]:
    """``text``'s words as search matches them (lower-cased)."""
    return [t.lower() for t in _WORD.findall(text.replace("_", " "))]


def word_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text``'s words are, as (start, end) offsets."""
    return [m.span() for m in _WORD.finditer(text.replace("_", " "))]


def marked(snippet: str, terms: Sequence[str]) -> list[tuple[str, bool]]:
    """``snippet`` cut into pieces, each saying whether it is a word the query matched
    (for an output to highlight, after escaping each piece its own way)."""
    wanted = set(terms)
    pieces: list[tuple[str, bool]] = []
    done = 0
    for start, end in word_spans(snippet):
        if snippet[start:end].lower() in wanted:
            pieces += [(snippet[done:start], False), (snippet[start:end], True)]
            done = end
    pieces.append((snippet[done:], False))
    return [p for p in pieces if p[0]]


def snippet_of(text: str, terms: Sequence[str], width: int = 16) -> str:
    """About ``width`` words of ``text`` around the first word that matches a term."""
    spans = word_spans(text)
    wanted = set(terms)
    first = next((i for i, (a, b) in enumerate(spans) if text[a:b].lower() in wanted), 0)
    lo = max(0, first - width // 3)
    hi = min(len(spans), lo + width)
    if not spans:
        return ""
    start = 0 if lo == 0 else spans[lo][0]
    end = len(text) if hi == len(spans) else spans[hi - 1][1]
    return ("…" if lo else "") + text[start:end] + ("…" if hi < len(spans) else "")


def path_keys(parents: dict[K, K | None]) -> set[K]:
    """The ids on the path from the last of ``parents`` (in insertion order) to its root.

    ``parents`` maps each entry id, in append order, to its parent's id. A
    parent that is not there ends the path (the tree treats it as a root).
    """
    path: set[K] = set()
    at = next(reversed(parents), None)
    while at is not None and at not in path and at in parents:
        path.add(at)
        at = parents[at]
    return path


def rank_of(found: Sequence[str], terms: Sequence[str]) -> float:
    """The rank of an entry whose words are ``found`` (all of ``terms`` among them):
    how often the terms occur, against the square root of its length."""
    return sum(found.count(t) for t in terms) / math.sqrt(len(found))


def scan_search(sessions: Iterable[tuple[str, Sequence[Entry]]], q: Query) -> list[SearchHit]:
    """Search by reading every entry: the memory store's way (no index to keep)."""
    found: list[tuple[float, str, int, SearchHit]] = []
    for sid, entries in sessions:
        meta = fold_metadata(entries)
        if ((q.owner is not None and meta.owner != q.owner)
                or (q.tenant is not None and meta.tenant != q.tenant)):
            continue
        path = path_keys({e.id: e.parent_id for e in entries}) if q.active_path else None
        for n, entry in enumerate(entries):
            text = indexed_text(entry)
            if text is None or (path is not None and entry.id not in path):
                continue
            ws = words(text)
            if set(q.terms).issubset(ws):
                rank = rank_of(ws, q.terms)
                found.append((-rank, sid, n, SearchHit(session_id=sid, entry_id=entry.id,
                                                       snippet=snippet_of(text, q.terms),
                                                       rank=rank)))
    found.sort(key=lambda f: f[:3])
    return [f[3] for f in found[:q.limit]]
