"""Counting a post X's way, and cutting a reply into posts that fit.

X weighs text (twitter-text, version 3): most Latin, Greek, Cyrillic, Hebrew and
Arabic characters and common punctuation weigh 1; everything else, CJK and emoji
included, weighs 2; an emoji sequence (a family, a flag, a skin tone) weighs 2 in
all; a link weighs 23 however long it is. A post may weigh 280::

    >>> weighted_length("hello")
    5
    >>> weighted_length("日本語"), weighted_length("👍"), weighted_length("👨‍👩‍👧")
    (6, 2, 2)
    >>> weighted_length("see https://example.com/" + "a" * 100)
    27
    >>> [weighted_length(p) for p in split_post("word " * 120)]
    [279, 279, 39]

Where we cannot be sure how X counts a piece (a bare domain such as ``example.com``,
which X links only for some endings), we count the larger of the two readings, so a
chunk we make may be a little short but is never refused as too long.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

from autoresponse.interfaces.x.settings import X_POST_WEIGHT, X_URL_WEIGHT

#: Code points that weigh 1 (twitter-text's ranges); every other weighs 2.
_LIGHT = ((0x0000, 0x10FF), (0x2000, 0x200D), (0x2010, 0x201F), (0x2032, 0x2037))

_PICTOGRAPH = ("[\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328"
               "\u23cf\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe"
               "\u2600-\u27bf\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d"
               "\u3297\u3299\U0001f000-\U0001faff]")
_MODIFIER = "(?:\ufe0f|[\U0001f3fb-\U0001f3ff]|[\U000e0020-\U000e007f])"
_EMOJI = (f"[\U0001f1e6-\U0001f1ff]{{2}}"  # a flag: two regional indicators
          f"|[0-9#*]\ufe0f?\u20e3"  # a keycap
          f"|{_PICTOGRAPH}{_MODIFIER}*(?:\u200d{_PICTOGRAPH}{_MODIFIER}*)*")  # ZWJ sequences
#: Trailing punctuation is not part of a link ("see https://x.com/a." ends at "a").
_LINK = r"https?://\S*[^\s.,;:!?'\"()\[\]{}<>]"
_BARE_DOMAIN = r"(?<![\w@.])(?:[a-z0-9-]+\.)+[a-z]{2,24}(?:/\S*[^\s.,;:!?'\"()\[\]{}<>])?(?![\w@])"
_UNIT = re.compile(f"(?P<link>{_LINK})|(?P<bare>{_BARE_DOMAIN})|(?P<emoji>{_EMOJI})|(?P<char>.)",
                   re.DOTALL | re.IGNORECASE)
_HOST_WITH_TLD = re.compile(r".+\.[a-z]{2,}", re.IGNORECASE)


def _char_weight(char: str) -> int:
    point = ord(char)
    return 1 if any(low <= point <= high for low, high in _LIGHT) else 2


def _chars_weight(text: str) -> int:
    return sum(_char_weight(c) for c in text)


def units(text: str) -> list[tuple[str, int]]:
    """``text`` as the pieces X weighs (a link, an emoji sequence, a character), with weights."""
    found: list[tuple[str, int]] = []
    for match in _UNIT.finditer(text):
        piece = match.group()
        if match.lastgroup == "link":
            host = urlsplit(piece).hostname or ""
            # X links a URL with a real domain: 23. Anything else, count it both ways.
            weight = X_URL_WEIGHT if _HOST_WITH_TLD.fullmatch(host) else max(X_URL_WEIGHT, _chars_weight(piece))
        elif match.lastgroup == "bare":
            weight = max(X_URL_WEIGHT, _chars_weight(piece))
        elif match.lastgroup == "emoji":
            weight = 2
        else:
            weight = _char_weight(piece)
        found.append((piece, weight))
    return found


def weighted_length(text: str) -> int:
    """The length X counts for ``text`` (after NFC normalization, as X does)."""
    return sum(weight for _, weight in units(unicodedata.normalize("NFC", text)))


def _hard_split(word: str, limit: int) -> list[str]:
    """A word too heavy for one post, cut between the pieces X weighs (never inside an
    emoji sequence or a link)."""
    pieces: list[str] = []
    current, weight = "", 0
    for piece, piece_weight in units(word):
        if current and weight + piece_weight > limit:
            pieces.append(current)
            current, weight = "", 0
        current += piece
        weight += piece_weight
    if current:
        pieces.append(current)
    return pieces


def split_post(text: str, limit: int = X_POST_WEIGHT) -> list[str]:
    """Posts of at most ``limit`` weighted characters, in order, cut between words."""
    text = unicodedata.normalize("NFC", text).strip()
    posts: list[str] = []
    current, weight = "", 0
    space = ""
    # Links and emoji sequences never hold whitespace, so words weigh independently.
    for token in re.findall(r"\s+|\S+", text):
        if token.isspace():
            space = token
            continue
        token_weight = weighted_length(token)
        if current and weight + _chars_weight(space) + token_weight <= limit:
            current += space + token
            weight += _chars_weight(space) + token_weight
            continue
        if current:
            posts.append(current)
        current, weight = "", 0
        if token_weight > limit:
            *whole, token = _hard_split(token, limit)
            posts.extend(whole)
            token_weight = weighted_length(token)
        current, weight = token, token_weight
    if current:
        posts.append(current)
    return posts
