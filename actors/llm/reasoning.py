"""Reasoning is data, never instructions: the blocks a reasoning model writes before its
answer are cut off at the engine, so nothing downstream (the extractor, a streamed
preview, memory) ever reads them.

>>> split_reasoning('<think>maybe {"actions": [...]}</think>The answer is 42.')
('The answer is 42.', 'maybe {"actions": [...]}')
>>> split_reasoning("<thinking>still drafting {")    # never closed: all of it is reasoning
('', 'still drafting {')
>>> split_reasoning("the template opened the block</think>done")
('done', 'the template opened the block')

Linear in the text: one lower-cased copy, and each tag's next place is looked up only
once the scan has passed it (no backtracking, however many blocks).
"""

from __future__ import annotations

#: The tags reasoning models wrap their thoughts in (DeepSeek-R1, Qwen3, QwQ: think).
_TAGS = ("think", "thinking", "reasoning")
_OPEN = tuple(f"<{tag}>" for tag in _TAGS)


def split_reasoning(text: str) -> tuple[str, str]:
    """``text`` without its reasoning blocks, and the reasoning, each stripped.

    A block opened and never closed runs to the end (a reply cut off mid-thought has
    no answer yet). A closing tag with no opening one (the chat template opened the
    block inside the prompt) ends reasoning that began at the start of the text.
    """
    if "<" not in text:
        return text.strip(), ""
    lower = text.lower()
    opens = _Finder(lower, _OPEN)
    answer: list[str] = []
    thoughts: list[str] = []
    at = 0
    close_at, close_tag = _Finder(lower, tuple(f"</{tag}>" for tag in _TAGS)).next(0)
    open_at, _ = opens.next(0)
    if close_at != -1 and (open_at == -1 or close_at < open_at):
        thoughts.append(text[:close_at])
        at = close_at + len(close_tag)
    while True:
        start, tag = opens.next(at)
        if start == -1:
            answer.append(text[at:])
            break
        answer.append(text[at:start])
        closer = "</" + tag[1:]
        end = lower.find(closer, start + len(tag))
        if end == -1:
            thoughts.append(text[start + len(tag):])
            break
        thoughts.append(text[start + len(tag):end])
        at = end + len(closer)
    return "".join(answer).strip(), "\n".join(t.strip() for t in thoughts if t.strip())


class _Finder:
    """The first of several needles from a position that only moves forward; each
    needle's next place is remembered until the position passes it."""

    def __init__(self, text: str, needles: tuple[str, ...]) -> None:
        self.text = text
        self.places = {needle: -2 for needle in needles}  # -2: not looked up yet

    def next(self, at: int) -> tuple[int, str]:
        best, which = -1, ""
        for needle, place in self.places.items():
            if place == -2 or (place != -1 and place < at):
                place = self.places[needle] = self.text.find(needle, at)
            if place != -1 and (best == -1 or place < best):
                best, which = place, needle
        return best, which
