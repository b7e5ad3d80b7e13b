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

import re

#: The tags reasoning models wrap their thoughts in (DeepSeek-R1, Qwen3, QwQ: think).
_TAGS = ("think", "thinking", "reasoning")
#: A block's opening tag, after nothing but space.
_OPENING = re.compile(r"\s*<(" + "|".join(_TAGS) + r")>", re.IGNORECASE)
#: A closing tag of any of them, and of each.
_CLOSING = re.compile(r"</(" + "|".join(_TAGS) + r")>", re.IGNORECASE)
_CLOSER = {tag: re.compile(f"</{tag}>", re.IGNORECASE) for tag in _TAGS}


def split_reasoning(text: str) -> tuple[str, str]:
    """``text`` without the reasoning blocks it starts with, and the reasoning, each stripped.

    A block opened and never closed runs to the end (a reply cut off mid-thought has
    no answer yet). A closing tag with no opening one before it (the chat template
    opened the block inside the prompt) ends reasoning that began at the start of the
    text, unless the text starts as an answer in JSON does.
    """
    if "<" not in text:
        return text.strip(), ""
    thoughts: list[str] = []
    at = 0
    opening = _OPENING.match(text)
    if opening is None and not text.lstrip().startswith(("{", "[")):
        closing = _CLOSING.search(text)
        if closing is not None and "<" + closing.group(1).lower() + ">" not in text[:closing.start()].lower():
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

