"""Splitting a reply into Telegram messages.

Telegram counts length in UTF-16 code units. A split falls at a paragraph, else
a line, else a space; never inside a code block (unless one block alone is too
long, in which case it is closed and reopened around the cut) and never inside
a character or an emoji sequence::

    >>> [len(c) for c in split_message("a" * 5000 + " " + "b" * 10)]
    [4092, 919]
"""

from __future__ import annotations

import re

from autoresponse.interfaces.telegram.settings import TELEGRAM_MESSAGE_UTF16, TELEGRAM_MIN_CHUNK_UTF16

FENCE = "```"
_CLOSING = "\n" + FENCE
#: A code block's language tag ("python", "c++"): what a reopened block repeats of its fence line.
_LANGUAGE = re.compile(r"[\w+#.-]{1,24}")
_JOINERS = {"\u200d", "\ufe0f", "\ufe0e", "\u20e3"}  # ZWJ, variation selectors, keycap


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _fit(text: str, limit: int) -> int:
    """The longest prefix length (in characters) that fits in ``limit`` UTF-16 units."""
    units = 0
    for i, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return i
    return len(text)


def _inside_code(text: str, at: int) -> bool:
    return text.count(FENCE, 0, at) % 2 == 1


def _safe_hard_cut(text: str, at: int) -> int:
    """Move a cut back so it does not split an emoji sequence or a modifier from its base;
    by half the chunk at most (a run of joiners is no emoji, and must not make chunks of one)."""
    least = max(1, at // 2)
    while at > least and (text[at] in _JOINERS or text[at - 1] == "\u200d"
                      or 0x1F3FB <= ord(text[at]) <= 0x1F3FF):
        at -= 1
    return at


def _cut(text: str, limit: int) -> int:
    fit = _fit(text, limit)
    for separator in ("\n\n", "\n", " "):
        at = text.rfind(separator, 0, fit + 1)
        while at > 0 and _inside_code(text, at):
            at = text.rfind(separator, 0, at)
        if at > 0:
            return at
    # No separator outside a code block: cut before the block that does not fit ...
    start = text.rfind(FENCE, 0, fit)
    if start > 0 and _inside_code(text, start + len(FENCE)):
        return start
    # ... or inside one overlong block, at a line end past its fence line (a cut there would
    # leave the block empty, and reopening it give back all that was cut) ...
    at = text.rfind("\n", 0, fit + 1)
    if at > 0 and "\n" in text[max(0, text.rfind(FENCE, 0, at)):at]:
        return at
    # ... or, in one overlong line, at the last safe character.
    return _safe_hard_cut(text, fit)


def _opening(text: str, at: int) -> str:
    """The fence that reopens, after a cut at ``at``, the code block the cut is in: "```" and
    its language tag, if its fence line is one; never the block's text, which follows anyway."""
    start = text.rfind(FENCE, 0, at) + len(FENCE)
    line, newline, _ = text[start:at].partition("\n")
    return FENCE + line if newline and _LANGUAGE.fullmatch(line) else FENCE


def _split_at(text: str, at: int) -> tuple[str, str]:
    """``text`` cut at ``at``: a code block the cut is in is closed and reopened around it."""
    head, tail = text[:at], text[at:]
    if _inside_code(text, at):
        return head.rstrip("\n") + _CLOSING, _opening(text, at) + "\n" + tail.removeprefix("\n")
    return head.rstrip(), tail.lstrip("\n ")


def split_message(text: str, limit: int = TELEGRAM_MESSAGE_UTF16) -> list[str]:
    """Chunks of at most ``limit`` UTF-16 units, in order, that read as the original."""
    if limit < TELEGRAM_MIN_CHUNK_UTF16:
        raise ValueError(f"chunks of {limit} UTF-16 units are too short (at least {TELEGRAM_MIN_CHUNK_UTF16})")
    chunks: list[str] = []
    rest = text
    while utf16_len(rest) > limit:
        head, tail = _split_at(rest, _cut(rest, limit - len(_CLOSING)))
        # Every pass must shorten the rest, or it never ends: where reopening a block gives
        # back as much as was cut (a cut at its fence line), cut inside its text instead ...
        if len(tail) >= len(rest):
            head, tail = _split_at(rest, _safe_hard_cut(rest, _fit(rest, limit - len(_CLOSING))))
        if len(tail) >= len(rest):  # ... and where no cut is safe (a run of joiners), anywhere.
            at = _fit(rest, limit)
            head, tail = rest[:at], rest[at:]
        if head.strip():
            chunks.append(head)
        rest = tail
    if rest.strip():
        chunks.append(rest)
    return chunks
