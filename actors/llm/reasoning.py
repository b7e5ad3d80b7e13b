"""Reasoning is data, never instructions: the blocks a reasoning model writes before its
answer are cut off at the engine, so nothing downstream (the extractor, a streamed
preview, memory) ever reads them.

>>> split_reasoning('<think>maybe {"actions": [...]}</think>The answer is 42.')
('The answer is 42.', 'maybe {"actions": [...]}')
>>> split_reasoning("<thinking>still drafting {")    # never closed: all of it is reasoning
('', 'still drafting {')
>>> split_reasoning("the template opened the block</think>done")
('done', 'the template opened the block')
>>> split_reasoning("Wrap the scratchpad in a <think> tag.")   # the answer mentions one
('Wrap the scratchpad in a <think> tag.', '')

Models write their reasoning first, so only blocks at the start of the reply are
reasoning (one after another, with only space between them); a tag further on is
part of the answer, in words or inside an action's JSON. Linear in the text.
"""

from __future__ import annotations

import json
import re

#: The tags reasoning models wrap their thoughts in (DeepSeek-R1, Qwen3, QwQ: think).
_TAGS = ("think", "thinking", "reasoning")
#: What may come before a block and still count as nothing: space, a byte-order mark,
#: zero-width characters.
_NOTHING = r"[\s\ufeff\u200b-\u200d\u2060]*"
#: A block's opening tag, after nothing.
_OPENING = re.compile(_NOTHING + r"<(" + "|".join(_TAGS) + r")>", re.IGNORECASE)
#: A closing tag of any of them, and of each.
_CLOSING = re.compile(r"</(" + "|".join(_TAGS) + r")>", re.IGNORECASE)
_CLOSER = {tag: re.compile(f"</{tag}>", re.IGNORECASE) for tag in _TAGS}


def split_reasoning(text: str) -> tuple[str, str]:
    """``text`` without the reasoning blocks it starts with, and the reasoning, each stripped.

    A block opened and never closed runs to the end (a reply cut off mid-thought has
    no answer yet). A closing tag with no opening one before it (the chat template
    opened the block inside the prompt) ends reasoning that began at the start of the
    text, unless it is inside the JSON value the text starts with (an answer quoting it).
    """
    if "<" not in text:
        return text.strip(), ""
    thoughts: list[str] = []
    at = 0
    if _OPENING.match(text) is None:
        closing = _CLOSING.search(text)
        if (closing is not None and "<" + closing.group(1).lower() + ">" not in text[:closing.start()].lower()
                and not _inside_json(text, closing.start())):
            thoughts.append(text[:closing.start()])
            at = closing.end()
    while (opening := _OPENING.match(text, at)) is not None:
        closing = _CLOSER[opening.group(1).lower()].search(text, opening.end())
        if closing is None:  # cut off mid-thought: no answer yet
            thoughts.append(text[opening.end():])
            at = len(text)
            break
        thoughts.append(text[opening.end():closing.start()])
        at = closing.end()
    return text[at:].strip(), "\n".join(t.strip() for t in thoughts if t.strip())


_DECODER = json.JSONDecoder()
_LEADING = re.compile(_NOTHING)


def _inside_json(text: str, at: int) -> bool:
    """Whether ``at`` falls inside the JSON value ``text`` starts with (after nothing)."""
    start = _LEADING.match(text).end()  # type: ignore[union-attr]  # it matches the empty string
    if not text.startswith(("{", "["), start):
        return False
    try:
        _, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):  # no JSON there, or nested past what Python reads
        return False
    return end > at
