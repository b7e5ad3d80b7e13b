"""Every request fits the model's context window: the reply's reserve (``max_tokens``)
first, then the instructions, then the chat's memory, trimmed from the oldest.

>>> budget = ContextBudget(window=4096, reserve=1200)
>>> budget.room                              # tokens the request itself may use
2800
>>> fitted = budget.fit(prompt, protocol="json_schema")               # doctest: +SKIP

Tokens are estimated from characters (no tokenizer is loaded): conservatively, since
JSON and schema text tokenize worse than prose. A ``json_schema`` response format counts
where the server puts it in the prompt (OpenAI), not where it becomes a grammar beside the
prompt (llama.cpp: ``format_in_prompt`` off); tools always count (a chat template writes
them into the prompt). A turn's own message counts as its protocol sends it: a delivery
turn's output with one line of rules in ``json_schema`` and ``tools``, not the full text
rules of ``current_text``. A server that still says the context
was exceeded gets that request once more, smaller (``smaller``), and where that fits, the
chat's next requests start at that size (``NarrowedChats``): that chat's only, so one
chat the estimate misjudges never narrows every chat's budget, and pays one refused
request, not one a turn.

A window the runtime's own part of a request fills (its instructions, the format rules,
the schema or tools) is the operator's to fix, not the user's: once the server has refused
such a request, and even at ``PROSE_CHARS_PER_TOKEN`` that part fills the window's whole
room, ``fit`` raises ``WindowTooSmall``, which says what to change. Both, since the estimate
runs high: a window it misjudges may hold the instructions, and a refusal may be of memory.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from autoresponse.actors.limits import (
    CHARS_PER_TOKEN,
    CONTEXT_MARGIN_TOKENS,
    LLM_NARROWED_CHATS_REMEMBERED,
)
from autoresponse.actors.llm.engine import LLMError
from autoresponse.actors.prompts import (
    Protocol,
    current_message,
    reask_start,
    render_openai_messages,
    response_format,
    tool_definitions,
)
from autoresponse.messages import PromptRequest, Turn

def estimate_tokens(value: Any) -> int:
    """Tokens a JSON-able value costs in a request, estimated from its characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return 1 + len(text) // CHARS_PER_TOKEN


#: What one picture costs a vision model, about (OpenAI counts 85 to ~1,100 tokens by size):
#: counted so, never by the characters of its data URL.
IMAGE_TOKENS = 1_000


def _messages_tokens(messages: list[dict[str, Any]]) -> int:
    """The messages' tokens, each ``image_url`` part at ``IMAGE_TOKENS``."""
    images, text = 0, []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = [p for p in content if p.get("type") != "image_url"]
            images += len(content) - len(parts)
            message = {**message, "content": parts}
        text.append(message)
    return estimate_tokens(text) + images * IMAGE_TOKENS


def request_tokens(prompt: PromptRequest, protocol: Protocol, *, format_in_prompt: bool = True) -> int:
    """The estimated size of ``prompt`` as sent in ``protocol`` (messages and format; the
    response format only ``format_in_prompt``: a grammar beside the prompt costs none)."""
    size = _messages_tokens(render_openai_messages(prompt, protocol))
    if protocol == "tools":
        size += estimate_tokens(tool_definitions(prompt.allowed_actions))
    elif protocol == "json_schema" and format_in_prompt:
        size += estimate_tokens(response_format(prompt.allowed_actions))
    return size


def runtime_tokens(prompt: PromptRequest, protocol: Protocol, *, format_in_prompt: bool = True) -> int:
    """The estimated size of what the runtime itself adds to a request like ``prompt``: its
    instructions, the format rules, the schema or tools; no memory, an empty message."""
    bare = prompt.model_copy(update={"turns": (), "current_text": "", "system_message": None, "attachments": ()})
    return request_tokens(bare, protocol, format_in_prompt=format_in_prompt)


#: Characters a token in prose, more than ``CHARS_PER_TOKEN``: the least the runtime's own
#: part may cost, so that a window is called too small for it only when it surely is.
PROSE_CHARS_PER_TOKEN = 4

#: How every ``WindowTooSmall`` error starts (an ``LLMFailure`` carries only its words).
WINDOW_TOO_SMALL = "the model's context window is too small for the bot's own instructions"

#: What to change, besides a bigger window, by protocol: the full rules of ``text`` (and the
#: tools a template writes out) cost most; in ``json_schema``, the reply's reserve is left.
_WINDOW_ADVICE = {
    "text": "set AUTORESPONSE_LLM__PROTOCOL=json_schema",
    "tools": "set AUTORESPONSE_LLM__PROTOCOL=json_schema",
    "json_schema": "lower AUTORESPONSE_LLM__MAX_TOKENS",
}


class WindowTooSmall(LLMError):
    """The runtime's own part of every request leaves no room in the model's context
    window for the user's text: a configuration failure, whatever the user sent."""


@dataclass
class ContextBudget:
    """A model's context window and the part of it kept for the reply."""

    window: int
    reserve: int
    #: Below 1 for the one smaller try at a request a server still found too big (``smaller``),
    #: and for the chat's next requests once that fitted (``NarrowedChats``).
    scale: float = 1.0
    #: Whether a ``json_schema`` response format counts as prompt tokens: off where the
    #: server turns it into a grammar beside the prompt (llama.cpp).
    format_in_prompt: bool = True

    def __post_init__(self) -> None:
        # A window smaller than the configured reply: the reply gets a third of it.
        self.reserve = min(self.reserve, self.window // 3)

    @property
    def whole_room(self) -> int:
        """Tokens a request may use at the whole size (``scale`` 1)."""
        return max(0, self.window - self.reserve - CONTEXT_MARGIN_TOKENS)

    @property
    def room(self) -> int:
        return int(self.whole_room * self.scale)

    def tokens(self, prompt: PromptRequest, protocol: Protocol) -> int:
        """``prompt``'s estimated size as sent in ``protocol`` to this budget's server."""
        return request_tokens(prompt, protocol, format_in_prompt=self.format_in_prompt)

    def fit(self, prompt: PromptRequest, protocol: Protocol) -> PromptRequest:
        """``prompt`` with the oldest memory dropped until it fits the room (unchanged if
        it fits already); a re-ask's own exchange goes last, in whole parts, and never its
        question (an estimate: the server has the last word). ``LLMError`` (context
        exceeded) when the turn's own message alone cannot fit: a user's, and the user
        hears it is too long, rather than an answer to half of it; a re-ask's or a delivery
        turn's is the runtime's own, and the error says so (the user did not write it);
        ``WindowTooSmall`` when, the server having refused the request once (``smaller``),
        the runtime's own part alone, counted at its least, fills the whole room."""
        if self.tokens(prompt, protocol) <= self.room:
            return prompt
        turns = list(prompt.turns)
        start = reask_start(prompt)
        own = 0 if start is None else len(turns) - start  # the re-ask's exchange: the last turns

        def fits() -> bool:
            return self.tokens(prompt.model_copy(update={"turns": tuple(turns)}), protocol) <= self.room

        # Memory first, oldest first, never leaving an answer (an assistant or a tool
        # turn) without what it answered.
        while len(turns) > own and not fits():
            del turns[0]
            while len(turns) > own and turns[0].role != "user":
                del turns[0]
        # Then the rejected answers of a re-ask, oldest first, each with the tool turns
        # answering its calls and what was asked after it: the question stays.
        while own > 1 and not fits():
            first = len(turns) - own + 1
            dropped = _answer_length(turns, first)
            del turns[first:first + dropped]
            own -= dropped
        if not fits():
            self._check_own_part(prompt, protocol)
            if estimate_tokens(current_message(prompt, protocol)) > self.room:
                # The turn's own words do not fit, whatever is trimmed: never cut them silently.
                turn = "re-ask" if prompt.reask else "delivery turn"
                whose = "the message" if prompt.system_message is None else f"the runtime's own message of this {turn}"
                raise LLMError(f"{whose} is too long for the model's context window ({self.window} tokens)",
                               context_exceeded=True)
        return prompt.model_copy(update={"turns": tuple(turns)})

    def _check_own_part(self, prompt: PromptRequest, protocol: Protocol) -> None:
        """``WindowTooSmall`` when the runtime's own part of ``prompt``, counted at its
        least, fills the whole room, and the server already refused this chat's request."""
        if self.scale >= 1:
            return
        own = runtime_tokens(prompt, protocol, format_in_prompt=self.format_in_prompt)
        if own * CHARS_PER_TOKEN // PROSE_CHARS_PER_TOKEN >= self.whole_room:
            raise WindowTooSmall(
                f"{WINDOW_TOO_SMALL}: its {self.window} tokens, less {self.reserve} kept for the reply, leave "
                f"{self.whole_room} for a request, and the instructions of the {protocol} protocol take about "
                f"{own}: give the model a bigger context window (llama-server -c), or {_WINDOW_ADVICE[protocol]}",
                context_exceeded=True)

    def smaller(self) -> ContextBudget:
        """This budget a quarter lower: for a request the server said was still too big."""
        return replace(self, scale=self.scale * 0.75)


class NarrowedChats:
    """The chats whose request a server refused as too big and then took smaller, each with
    the budget that fitted: their next requests start there, not at the refused size.

    A chat is forgotten once its memory is empty (a ``/forget``, or its retention passed):
    what made its requests too big is gone, and with no memory a narrower budget has
    nothing to trim. Not after some turns or some time: a chat near the window stays near
    it (its memory is kept full), so trying the whole size again would cost it a refused
    request each time, while the narrower budget costs only some of its oldest memory.
    Past ``most`` chats the one narrowed or asked for longest ago is forgotten.
    """

    def __init__(self, most: int = LLM_NARROWED_CHATS_REMEMBERED) -> None:
        self.most = most
        self._budgets: OrderedDict[str, ContextBudget] = OrderedDict()

    def __len__(self) -> int:
        return len(self._budgets)

    def budget(self, prompt: PromptRequest, whole: ContextBudget) -> ContextBudget:
        """The budget ``prompt``'s chat starts at: the one that last fitted it, else ``whole``."""
        chat = prompt.original_context.chat_key
        narrowed = self._budgets.get(chat)
        if narrowed is None:
            return whole
        if not prompt.turns:  # its memory is empty
            del self._budgets[chat]
            return whole
        self._budgets.move_to_end(chat)
        return narrowed

    def fitted(self, prompt: PromptRequest, budget: ContextBudget) -> None:
        """``prompt``'s chat was refused as too big, and then fitted ``budget``."""
        chat = prompt.original_context.chat_key
        self._budgets[chat] = budget
        self._budgets.move_to_end(chat)
        if len(self._budgets) > self.most:
            self._budgets.popitem(last=False)


def _answer_length(turns: list[Turn], first: int) -> int:
    """The turns of the rejected answer at ``first``: its assistant turn, the tool turns
    after it, and the user turn that asked again (unless the question asked now follows)."""
    end = first + 1
    while end < len(turns) and turns[end].role == "tool":
        end += 1
    if end < len(turns) and turns[end].role == "user":
        end += 1
    return end - first
