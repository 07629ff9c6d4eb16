"""The characters a display of stored text must never draw as they are.

A transcript is untrusted, and some characters change what a reader sees
without being seen: controls (C0, DEL, C1) a terminal acts on, bidi
embeddings, overrides and isolates that reorder a line, and characters that
draw nothing at all (zero-width spaces and joiners, the soft hyphen, tag
characters that spell invisible ASCII, variation selectors past the BMP that
can carry hidden bytes, fillers). The command and the viewer show each of
them as an escape such as ``\\u202e``; this module is the one list of them.
"""

from __future__ import annotations

import re

__all__ = ["HIDDEN", "backslash", "has_hidden", "hidden_code_points", "pattern"]


def hidden_code_points() -> list[int]:
    ranges = [
        (0x00, 0x1F), (0x7F, 0x9F),  # C0, DEL, C1
        (0xAD, 0xAD),  # soft hyphen
        (0x034F, 0x034F),  # combining grapheme joiner
        (0x061C, 0x061C),  # Arabic letter mark
        (0x115F, 0x1160), (0x3164, 0x3164), (0xFFA0, 0xFFA0),  # Hangul fillers
        (0x17B4, 0x17B5),  # Khmer inherent vowels
        (0x180E, 0x180E),  # Mongolian vowel separator
        (0x200B, 0x200F),  # zero-width space, joiners, LRM, RLM
        (0x2028, 0x202E),  # line and paragraph separators, bidi embeddings and overrides
        (0x2060, 0x206F),  # word joiner, invisible operators, isolates, deprecated formats
        (0xFEFF, 0xFEFF),  # zero-width no-break space
        (0xFFF9, 0xFFFB),  # interlinear annotation
        (0x1D173, 0x1D17A),  # musical formatting
        (0xE0000, 0xE007F),  # tag characters
        (0xE0100, 0xE01EF),  # variation selectors 17-256
    ]
    return [c for lo, hi in ranges for c in range(lo, hi + 1)]


def backslash(code: int) -> str:
    """The escape shown for ``code``: ``\\x1b``, ``\\u202e`` or ``\\U000e0041``."""
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def pattern(codes: list[int]) -> re.Pattern[str]:
    """A regular expression matching any one of ``codes`` (sorted)."""
    spans: list[str] = []
    start = prev = codes[0]
    for code in [*codes[1:], -1]:
        if code == prev + 1:
            prev = code
            continue
        spans.append(re.escape(chr(start)) + ("" if prev == start else "-" + re.escape(chr(prev))))
        start = prev = code
    return re.compile("[" + "".join(spans) + "]")


HIDDEN = pattern(hidden_code_points())
"""Matches any one of the characters; most text has none, and one scan says so."""


# ``str.isprintable`` is false for every hidden character but these: its C loop
# clears most text at once, and these few are looked for by name.
_PRINTABLE_BMP = [chr(c) for c in hidden_code_points() if c <= 0xFFFF and chr(c).isprintable()]
_PRINTABLE_ASTRAL = pattern([c for c in hidden_code_points()
                             if c > 0xFFFF and chr(c).isprintable()])


def has_hidden(text: str, *, lines: bool = False) -> bool:
    """Whether ``text`` holds a character of the list (newline and tab aside with
    ``lines``, for text shown with its lines)."""
    if lines and ("\n" in text or "\t" in text):
        text = text.replace("\n", "").replace("\t", "")
    if text.isprintable():
        if text.isascii():
            return False
        # (A character past the BMP takes two UTF-16 units: none, no search.)
        return any(c in text for c in _PRINTABLE_BMP) or (
            len(text.encode("utf-16-le")) > 2 * len(text)
            and _PRINTABLE_ASTRAL.search(text) is not None)
    return HIDDEN.search(text) is not None
