"""Splitting a reply into Telegram messages.

Telegram counts length in UTF-16 code units. A split falls at a paragraph, else
a line, else a space; never inside a code block (unless one block alone is too
long, in which case it is closed and reopened around the cut) and never inside
a character or an emoji sequence::

    >>> [len(c) for c in split_message("a" * 5000 + " " + "b" * 10)]
    [4096, 915]
"""

from __future__ import annotations

from autoresponse.interfaces.telegram.settings import TELEGRAM_MESSAGE_UTF16

FENCE = "```"
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
    """Move a cut back so it does not split an emoji sequence or a modifier from its base."""
    while at > 1 and (text[at] in _JOINERS or text[at - 1] == "\u200d"
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
    # ... or inside one overlong block, at a line end ...
    at = text.rfind("\n", 0, fit + 1)
    if at > 0:
        return at
    # ... or, in one overlong line, at the last safe character.
    return _safe_hard_cut(text, fit)


def split_message(text: str, limit: int = TELEGRAM_MESSAGE_UTF16) -> list[str]:
    """Chunks of at most ``limit`` UTF-16 units, in order, that read as the original."""
    chunks: list[str] = []
    rest = text
    closing = "\n" + FENCE
    while utf16_len(rest) > limit:
        at = _cut(rest, limit - len(closing))
        head, tail = rest[:at], rest[at:]
        if _inside_code(rest, at):
            # Close the block here and reopen it, with its language, in the next chunk.
            opening = rest[rest.rfind(FENCE, 0, at):].split("\n", 1)[0]
            head = head.rstrip("\n") + closing
            tail = opening + "\n" + tail.removeprefix("\n")
        else:
            head, tail = head.rstrip(), tail.lstrip("\n ")
        if head.strip():
            chunks.append(head)
        rest = tail
    if rest.strip():
        chunks.append(rest)
    return chunks
