"""Everything the command writes goes through here.

A transcript is untrusted input: a model or a tool can put escape sequences,
bidi overrides or rich markup in it. So text is never handed to rich as
markup, and every character a terminal could act on is shown as an escape
(``\\x1b``, ``\\u202e``) instead of being sent. Our own colours are the only
escape sequences that reach a terminal, and only when it is one.

Lines are written straight to the stream with styles rendered once per
style, not through ``Console.print`` per line: ``show`` of a 100,000-entry
session is then bounded by string formatting, not by rich's layout engine.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import lru_cache
from typing import IO, Any

import msgspec
from rich.color import ColorSystem
from rich.console import Console
from rich.style import Style

from threadline.session._text import backslash, has_hidden, hidden_code_points, pattern

__all__ = ["Out", "Span", "json_bytes", "paged", "stderr", "visible"]

def _utf16(code: int) -> tuple[int, ...]:
    if code <= 0xFFFF:
        return (code,)
    code -= 0x10000
    return (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))


# Every character that a terminal acts on or that hides or reorders text
# (threadline.session._text), as an escape; newline and tab kept where lines are.
_CODES = hidden_code_points()
_VISIBLE = {c: backslash(c) for c in _CODES}
_VISIBLE_KEEP_LINES = {**_VISIBLE, ord("\n"): "\n", ord("\t"): "\t"}
# Inside JSON only non-C0 characters can be raw (the encoder escapes C0); JSON
# spells a character past the BMP as its UTF-16 surrogate pair.
_JSON_ESCAPES = {c: "".join(f"\\u{u:04x}" for u in _utf16(c)) for c in _CODES if c >= 0x20}
_JSON_ANY = pattern(sorted(_JSON_ESCAPES))


def visible(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control or invisible character written as an escape."""
    if not has_hidden(text, lines=keep_lines):
        return text
    return text.translate(_VISIBLE_KEEP_LINES if keep_lines else _VISIBLE)


def json_bytes(data: bytes, *, escape: bool = True) -> bytes:
    """JSON with C1 controls and the characters that hide text as ``\\uXXXX`` escapes.

    The encoder already escapes C0 (ESC, BEL), so no escape sequence can start;
    this covers the rest. The strings decode the same.
    """
    if not escape:
        return data
    if data.isascii():  # JSON's own escapes keep it so whenever it can
        return data
    text = data.decode("utf-8", errors="surrogateescape")
    if _JSON_ANY.search(text) is None:
        return data
    return text.translate(_JSON_ESCAPES).encode("utf-8", errors="surrogateescape")


Span = str | tuple[str, str]
"""Plain text, or ``(text, style)`` with a rich style name such as ``"bold red"``."""


@lru_cache(maxsize=64)
def _ansi(style: str) -> tuple[str, str]:
    rendered = Style.parse(style).render("\x00", color_system=ColorSystem.STANDARD)
    before, _, after = rendered.partition("\x00")
    return before, after


class Out:
    """A text stream that only ever receives escaped text (plus our colours)."""

    def __init__(self, stream: IO[str], *, color: bool) -> None:
        self.stream = stream
        self.color = color

    @classmethod
    def for_stream(cls, stream: IO[str]) -> Out:
        return cls(stream, color=_wants_color(stream))

    @property
    def is_terminal(self) -> bool:
        return _isatty(self.stream)

    def line(self, *spans: Span) -> None:
        if not self.color:  # one escape pass over the whole line
            text = "".join(span if isinstance(span, str) else span[0] for span in spans)
            self.stream.write(visible(text) + "\n")
            return
        parts: list[str] = []
        for span in spans:
            if isinstance(span, str):
                parts.append(visible(span))
            else:
                before, after = _ansi(span[1])
                parts.append(before + visible(span[0]) + after)
        parts.append("\n")
        self.stream.write("".join(parts))

    def table(self, rows: list[tuple[str, ...]]) -> None:
        """Rows of cells in aligned columns, the first row (the heading) bold.

        Cells are measured as printed, so escape them (``visible``) first.
        """
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for n, row in enumerate(rows):
            cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
            self.line(("  ".join([*cells, row[-1]]).rstrip(), "bold" if n == 0 else ""))

    def json(self, obj: Any) -> None:
        """One JSON document on one line."""
        self.raw(json_bytes(msgspec.json.encode(obj)) + b"\n")

    def raw(self, data: bytes) -> None:
        """Bytes that are already safe (or are data the user redirected)."""
        self.stream.flush()
        buffer = getattr(self.stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            self.stream.write(data.decode("utf-8", errors="replace"))

    def console(self, *, wide: bool = False) -> Console:
        """A rich console on this stream for trees, rules and progress bars.

        Markup, emoji codes and highlighting are off: text given to it must be
        ``rich.text.Text`` built from ``visible`` strings. ``wide`` output
        (a tree) is never cut to 80 columns when it goes to a pipe.
        """
        return Console(file=self.stream, markup=False, emoji=False, highlight=False,
                       force_terminal=self.color, no_color=not self.color,
                       width=10_000 if wide and not self.is_terminal else None,
                       soft_wrap=True)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _wants_color(stream: IO[str]) -> bool:
    return (_isatty(stream) and "NO_COLOR" not in os.environ
            and os.environ.get("TERM") != "dumb")


@contextlib.contextmanager
def paged(out: Out, *, enabled: bool = True) -> Iterator[Out]:
    """Send long output through a pager when writing to a terminal, like ``git log``.

    ``$THREADLINE_PAGER``, then ``$PAGER``, then ``less``; ``less`` gets
    ``LESS=FRX`` unless set (quit if one screen, keep colours, no clearing).
    An empty pager or ``cat``, a pipe, or ``enabled=False`` writes directly.
    """
    command = os.environ.get("THREADLINE_PAGER", os.environ.get("PAGER", "less"))
    words = shlex.split(command) if command.strip() else []
    if (not enabled or not out.is_terminal or not words or words[0] == "cat"
            or shutil.which(words[0]) is None):
        yield out
        return
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")
    proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env,
                            text=True, encoding="utf-8", errors="replace")
    assert proc.stdin is not None
    try:
        yield Out(proc.stdin, color=out.color)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the user quit the pager early: not an error
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait()


def stderr() -> Out:
    return Out.for_stream(sys.stderr)
