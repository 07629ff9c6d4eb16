"""Everything the command writes goes through here (S28).

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
import re
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

__all__ = ["Out", "Span", "json_bytes", "paged", "stderr", "visible"]

# C0, DEL and C1 controls, and the invisible characters that reorder or hide
# text (bidi embeddings, overrides and isolates, line/paragraph separators).
_INVISIBLE = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F,
              0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF]
_VISIBLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _INVISIBLE}
_VISIBLE_KEEP_LINES = {**_VISIBLE, ord("\n"): "\n", ord("\t"): "\t"}
# Most text has none of them: one regex scan is far cheaper than ``translate``.
_ANY = re.compile("[" + "".join(re.escape(chr(c)) for c in _INVISIBLE) + "]")
_ANY_BUT_LINES = re.compile(
    "[" + "".join(re.escape(chr(c)) for c in _INVISIBLE if chr(c) not in "\n\t") + "]")
# Inside JSON only non-C0 characters can be raw (the encoder escapes C0).
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _INVISIBLE if c >= 0x20}


def visible(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control or invisible character written as an escape."""
    if (_ANY_BUT_LINES if keep_lines else _ANY).search(text) is None:
        return text
    return text.translate(_VISIBLE_KEEP_LINES if keep_lines else _VISIBLE)


def json_bytes(data: bytes, *, escape: bool = True) -> bytes:
    """JSON with C1 controls and bidi characters as ``\\uXXXX`` escapes.

    The encoder already escapes C0 (ESC, BEL), so no escape sequence can start;
    this covers the rest. The strings decode the same.
    """
    if not escape:
        return data
    text = data.decode("utf-8", errors="surrogateescape")
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
        parts: list[str] = []
        for span in spans:
            if isinstance(span, str):
                parts.append(visible(span))
            elif self.color:
                before, after = _ansi(span[1])
                parts.append(before + visible(span[0]) + after)
            else:
                parts.append(visible(span[0]))
        parts.append("\n")
        self.stream.write("".join(parts))

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
