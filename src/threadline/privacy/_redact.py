"""Redaction: rules that find personal data in text, and a store layer that applies them.

A rule finds spans of text; ``Redactor`` replaces each span with
``[redacted:<rule>]`` in every string an entry carries to a model or a
reader: message text, thinking, tool-call arguments (keys kept, values
redacted), tool results and their details, custom message content,
summaries and error text. The marker is the record: it says, in place, that
something was removed and by which rule, and ``Redactor.entry`` also
returns the count per rule.

``RedactingStore`` applies a redactor on the way in (``on="write"``, opt-in:
the raw value is gone from the store for good, so nothing needs it later)
or on the way out (``on="read"``: the store keeps the raw value and every
read through the layer is redacted; the command line's ``--redact`` and
the viewer read this way).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import msgspec

from threadline.ai._messages import (
    AssistantMessage,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import ConfigError
from threadline.session._entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    SessionRecord,
)
from threadline.stores._contract import EntryLog, SessionPage, Store
from threadline.stores._rules import check_entries, check_session_id

__all__ = [
    "CARD",
    "EMAIL",
    "PHONE",
    "Detector",
    "RedactingStore",
    "Redactor",
    "Rule",
    "luhn",
]

Span = tuple[int, int, str]
"""Start, end (as ``str`` indexes) and the rule's name."""


@runtime_checkable
class Detector(Protocol):
    """Anything that finds personal data in text: a rule below, or a real PII detector.

    ``name`` is what markers say when ``find`` names no rule of its own;
    ``find(text)`` returns ``(start, end, rule)`` spans (``rule`` may be the
    detector's entity type, for example ``"person"``). An adapter for a
    detector such as Presidio is a few lines: call it, map its results.
    """

    @property
    def name(self) -> str: ...

    def find(self, text: str) -> Iterable[Span]: ...


class Rule:
    """A regular expression, optionally confirmed by ``check`` on each match."""

    def __init__(self, name: str, pattern: str | re.Pattern[str],
                 check: Callable[[str], bool] | None = None) -> None:
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_-]{1,40}", name):
            raise ConfigError(f"a redaction rule's name is 1 to 40 of a-z, 0-9, _ and -, "
                              f"got {name!r}")
        self._name = name
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.check = check

    @property
    def name(self) -> str:
        return self._name

    def find(self, text: str) -> Iterable[Span]:
        for m in self.pattern.finditer(text):
            if self.check is None or self.check(m.group()):
                yield m.start(), m.end(), self._name

    def __repr__(self) -> str:
        return f"Rule({self._name!r})"


def luhn(text: str) -> bool:
    """Whether the digits of ``text`` (13 to 19 of them) pass the Luhn check."""
    digits = [int(c) for c in text if "0" <= c <= "9"]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        doubled = d * 2 if i % 2 else d
        total += doubled - 9 if doubled > 9 else doubled
    return total % 10 == 0


def _phone_digits(text: str) -> bool:
    return 7 <= sum("0" <= c <= "9" for c in text) <= 15


# Bounded repeats throughout: a rule runs over hostile text too, and an
# unbounded one could take quadratic time on a long run without a match.
EMAIL = Rule("email", r"(?<![\w.%+-])[\w.%+-]{1,64}@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.){1,8}"
                      r"[^\W\d_]{2,24}(?![\w-])")
"""An e-mail address (the local part and the domain may be internationalized)."""

CARD = Rule("card", r"(?<!\d)(?<!\d[.,-])(?:\d[ -]?){12,18}\d(?!\d|[.,-]\d)", luhn)
"""A payment card number: 13 to 19 digits, spaces or dashes between, passing Luhn."""

PHONE = Rule("phone", r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{1,4})"
                      r"{1,4}|\(\d{3}\) ?\d{3}[ .-]\d{4}|\d{3}[ .-]\d{3}[ .-]\d{4})(?![\w])",
              _phone_digits)
"""A phone number: international (``+`` and a country code) or North American."""

DEFAULT_RULES: tuple[Detector, ...] = (EMAIL, CARD, PHONE)


class Redactor:
    """Applies ``rules`` (by default e-mail, card and phone) to text and entries.

    Where spans of several rules overlap, the one starting first wins (the
    longer one at the same start), so a card number is never also a phone.
    """

    def __init__(self, rules: Sequence[Detector] = DEFAULT_RULES) -> None:
        rules = tuple(rules)
        if not rules or not all(isinstance(r, Detector) for r in rules):
            raise ConfigError("Redactor needs one or more rules, each with a name and "
                              "find(text)")
        self.rules = rules

    def __repr__(self) -> str:
        return f"Redactor({[r.name for r in self.rules]})"

    def text(self, text: str, counts: Counter[str] | None = None) -> str:
        """``text`` with every span found replaced by ``[redacted:<rule>]``."""
        spans: list[Span] = []
        for rule in self.rules:
            for start, end, name in rule.find(text):
                if 0 <= start < end <= len(text):
                    spans.append((start, end, _rule_name(name or rule.name)))
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], -s[1]))
        out: list[str] = []
        at = 0
        for start, end, name in spans:
            if start < at:
                continue  # inside a span already replaced
            out += [text[at:start], f"[redacted:{name}]"]
            at = end
            if counts is not None:
                counts[name] += 1
        out.append(text[at:])
        return "".join(out)

    def entry(self, entry: Entry) -> tuple[Entry, Counter[str]]:
        """``entry`` with its text redacted, and how many spans each rule replaced.

        An entry with nothing to redact comes back as itself. Ids, parents,
        times, tool names and call ids are never changed: the tree and the
        pairing of calls with results stay as they were.
        """
        counts: Counter[str] = Counter()
        out = self._entry(entry, counts)
        return (out if counts else entry), counts

    def _entry(self, entry: Entry, counts: Counter[str]) -> Entry:
        if isinstance(entry, MessageEntry):
            return msgspec.structs.replace(entry, message=self._message(entry.message, counts))
        if isinstance(entry, CustomMessageEntry):
            return msgspec.structs.replace(
                entry, content=tuple(self._part(p, counts) for p in entry.content),
                details=self._value(entry.details, counts))
        if isinstance(entry, CompactionEntry):
            return msgspec.structs.replace(entry, summary=self.text(entry.summary, counts),
                                           details=self._value(entry.details, counts))
        if isinstance(entry, BranchSummaryEntry):
            return msgspec.structs.replace(entry, summary=self.text(entry.summary, counts),
                                           details=self._value(entry.details, counts))
        if isinstance(entry, CustomEntry) and not isinstance(entry.data, msgspec.Raw):
            data = self._value(msgspec.to_builtins(entry.data), counts)
            if counts:
                try:
                    return msgspec.structs.replace(
                        entry, data=msgspec.convert(data, type(entry.data)))
                except (msgspec.ValidationError, TypeError):
                    counts.clear()  # a redacted value its class refuses: leave it whole
        # Sealed, erased, opaque and raw custom entries carry no text this can read.
        return entry

    def _message(self, m: Message, counts: Counter[str]) -> Message:
        if isinstance(m, UserMessage):
            return msgspec.structs.replace(m, content=tuple(self._part(p, counts)
                                                            for p in m.content))
        if isinstance(m, AssistantMessage):
            error = None if m.error_message is None else self.text(m.error_message, counts)
            return msgspec.structs.replace(m, content=tuple(self._part(p, counts)
                                                            for p in m.content),
                                           error_message=error)
        assert isinstance(m, ToolResultMessage)
        return msgspec.structs.replace(m, content=tuple(self._part(p, counts)
                                                        for p in m.content),
                                       details=self._value(m.details, counts))

    def _part(self, p: Any, counts: Counter[str]) -> Any:
        if isinstance(p, TextPart):
            return msgspec.structs.replace(p, text=self.text(p.text, counts))
        if isinstance(p, ThinkingPart) and not p.redacted:
            thinking = self.text(p.thinking, counts)
            if thinking == p.thinking:
                return p
            # A signature vouches for the text as the provider wrote it: changed,
            # it would be refused, so the part goes back as plain text instead.
            return msgspec.structs.replace(p, thinking=thinking, signature=None)
        if isinstance(p, ToolCall):
            return msgspec.structs.replace(p, arguments=self._value(p.arguments, counts))
        return p  # an image: no text to find

    def _value(self, value: Any, counts: Counter[str]) -> Any:
        if isinstance(value, str):
            return self.text(value, counts)
        if isinstance(value, dict):
            return {k: self._value(v, counts) for k, v in value.items()}
        if isinstance(value, list):
            return [self._value(v, counts) for v in value]
        if isinstance(value, tuple):
            return tuple(self._value(v, counts) for v in value)
        return value


def _rule_name(name: str) -> str:
    # A detector's own label goes into stored text: keep it to a safe alphabet.
    cleaned = re.sub(r"[^a-z0-9_-]", "_", str(name).lower())[:40]
    return cleaned or "pii"


# -- the store layer ---------------------------------------------------------------------

_OPTIONAL = ("load_session", "list_sessions", "delete_session", "append_linear",
             "load_entries_after", "watch", "prune_session", "erase_subject", "unseal")


class RedactingStore:
    """Wraps ``inner`` so that entries are redacted on the way in or on the way out.

    ``on="write"`` (opt-in): every entry appended is redacted before
    ``inner`` sees it, so the store never holds the raw value. A run that
    needs the value later (a tool that must dial the number) cannot get it
    back: choose this only for data nothing needs. Reads pass through.

    ``on="read"``: the store keeps everything as written, and every entry
    read through this layer (``load_entries``, ``load_entries_after``,
    ``watch``) is redacted; the load's ``diagnostics`` say how many spans
    each rule replaced. Writes pass through unchanged. This is what export,
    the viewer and sharing use.

    Put it outside an ``EncryptedStore`` (``RedactingStore(EncryptedStore(...))``):
    inside, it would see only sealed entries, which it leaves alone.
    """

    def __new__(cls, inner: Store, redactor: Redactor | None = None,
                **options: Any) -> RedactingStore:
        present = frozenset(n for n in _OPTIONAL if callable(getattr(inner, n, None)))
        return super().__new__(_with(present))

    def __init__(self, inner: Store, redactor: Redactor | None = None, *,
                 on: Literal["write", "read"] = "write") -> None:
        if on not in ("write", "read"):
            raise ConfigError(f"RedactingStore on= is 'write' or 'read', got {on!r}")
        self.inner = inner
        self.redactor = redactor if redactor is not None else Redactor()
        self.on = on

    def __repr__(self) -> str:
        return f"RedactingStore({self.inner!r}, on={self.on!r})"

    async def create_session(self, record: SessionRecord) -> None:
        await self.inner.create_session(record)

    async def load_entries(self, session_id: str) -> EntryLog:
        log = await self.inner.load_entries(session_id)
        diagnostics = list(getattr(log, "diagnostics", ()))
        if self.on == "write":
            return log if isinstance(log, EntryLog) else EntryLog(log)
        return self._out(session_id, log, diagnostics)

    async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
        await self.inner.append_entries(session_id, self._in(session_id, entries))

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> RedactingStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _in(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        check_session_id(session_id)
        check_entries(entries, session_id, "append_entries")
        if self.on != "write":
            return list(entries)
        return [self.redactor.entry(e)[0] for e in entries]

    def _out(self, session_id: str, log: Iterable[Entry], diagnostics: list[str]) -> EntryLog:
        total: Counter[str] = Counter()
        out = EntryLog(diagnostics=diagnostics)
        for entry in log:
            redacted, counts = self.redactor.entry(entry)
            total += counts
            out.append(redacted)
        if total:
            rules = ", ".join(f"{name} {n}" for name, n in sorted(total.items()))
            out.diagnostics.append(f"session {session_id!r}: redacted on the way out ({rules})")
        return out

    if TYPE_CHECKING:
        async def load_session(self, session_id: str) -> SessionRecord: ...
        async def list_sessions(self, *, limit: int = 100,
                                cursor: str | None = None) -> SessionPage: ...
        async def delete_session(self, session_id: str) -> None: ...
        async def append_linear(self, session_id: str,
                                entries: Sequence[Entry]) -> list[Entry]: ...
        async def load_entries_after(self, session_id: str,
                                     entry_id: str | None) -> list[Entry]: ...
        def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]: ...


class _Optional(RedactingStore):
    """The optional methods, of which ``_with`` takes those the store beneath has."""

    async def load_session(self, session_id: str) -> SessionRecord:
        return await self.inner.load_session(session_id)  # type: ignore[attr-defined, no-any-return]

    async def list_sessions(self, *, limit: int = 100, cursor: str | None = None) -> SessionPage:
        return await self.inner.list_sessions(  # type: ignore[attr-defined, no-any-return]
            limit=limit, cursor=cursor)

    async def delete_session(self, session_id: str) -> None:
        await self.inner.delete_session(session_id)  # type: ignore[attr-defined]

    async def append_linear(self, session_id: str, entries: Sequence[Entry]) -> list[Entry]:
        stored: list[Entry] = await self.inner.append_linear(  # type: ignore[attr-defined]
            session_id, self._in(session_id, entries))
        return stored

    async def load_entries_after(self, session_id: str, entry_id: str | None) -> list[Entry]:
        got = await self.inner.load_entries_after(  # type: ignore[attr-defined]
            session_id, entry_id)
        return list(got) if self.on == "write" else list(self._out(session_id, got, []))

    def watch(self, session_id: str, after: str | None = None) -> AsyncIterator[Entry]:
        source: AsyncIterator[Entry] = self.inner.watch(  # type: ignore[attr-defined]
            session_id, after)
        return source if self.on == "write" else self._follow(source)

    async def _follow(self, source: AsyncIterator[Entry]) -> AsyncIterator[Entry]:
        try:
            async for entry in source:
                yield self.redactor.entry(entry)[0]
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    async def prune_session(self, session_id: str, choose: Any, *, batch: int = 1000) -> Any:
        return await self.inner.prune_session(  # type: ignore[attr-defined]
            session_id, choose, batch=batch)

    async def erase_subject(self, subject: str) -> Any:
        return await self.inner.erase_subject(subject)  # type: ignore[attr-defined]

    async def unseal(self, session_id: str, entry: Any) -> Entry:
        opened: Entry = await self.inner.unseal(session_id, entry)  # type: ignore[attr-defined]
        return opened if self.on == "write" else self.redactor.entry(opened)[0]


@functools.cache
def _with(present: frozenset[str]) -> type[RedactingStore]:
    methods = {name: _Optional.__dict__[name] for name in present}
    if "watch" in present:
        methods["_follow"] = _Optional.__dict__["_follow"]
    cls = type("RedactingStore", (RedactingStore,), methods)
    cls.__module__ = RedactingStore.__module__
    cls.__qualname__ = RedactingStore.__qualname__
    return cls
