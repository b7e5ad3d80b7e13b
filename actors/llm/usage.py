"""Usage is a fact of every reply: tokens counted per model and turn kind, per chat per
day, and a daily budget per chat.

Models are counted by the name each reply gives, which the LLM server decides: the first
``LLM_MODELS_COUNTED`` names are counted each under its own, any later one under
``"other"`` (``OTHER_MODEL``), so that the counters (and /metrics) stay bounded whatever
names a server reports; every token is still counted.

>>> meter = UsageMeter(daily_tokens_per_chat=1000, today=lambda: "2026-12-02")
>>> meter.add("console:42", kind="chat", model="qwen", engine="main", usage=Usage(total_tokens=600))
>>> meter.over_budget("console:42"), meter.spent_today("console:42")
(False, 600)
>>> meter.add("console:42", kind="delivery", model="qwen", engine="main", usage=Usage(total_tokens=500))
>>> meter.over_budget("console:42")
True
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from autoresponse.actors.limits import LLM_MODELS_COUNTED
from autoresponse.messages import PromptRequest, Usage

#: The turn kinds usage is counted by.
KINDS = ("chat", "delivery", "reask", "event")
#: What the tokens of a model named past ``LLM_MODELS_COUNTED`` others are counted under.
OTHER_MODEL = "other"


def turn_kind(prompt: PromptRequest) -> str:
    """chat, delivery, reask or event: what a call was for."""
    if prompt.reask:
        return "reask"
    message = prompt.system_message
    if message is not None and message.type == "event":
        return "event"
    return prompt.mode


def _today() -> str:
    return dt.date.today().isoformat()


class UsageMeter:
    """Thread-safe counters of tokens; only today's per-chat figures are kept per chat, and
    tokens of models named past ``LLM_MODELS_COUNTED`` others are counted under "other"."""

    def __init__(self, daily_tokens_per_chat: int | None = None,
                 today: Callable[[], str] = _today) -> None:
        self.daily_tokens_per_chat = daily_tokens_per_chat
        self._today = today
        self._lock = threading.Lock()
        #: (kind, model, direction) → tokens, direction "prompt" or "completion"; the model
        #: one of ``_models`` or ``OTHER_MODEL``.
        self.tokens: Counter[tuple[str, str, str]] = Counter()
        #: The model names counted under their own, at most ``LLM_MODELS_COUNTED``.
        self._models: set[str] = set()
        #: engine name → replies it gave.
        self.replies: Counter[str] = Counter()
        self._day = ""
        self._chats: Counter[str] = Counter()
        self._refused: set[str] = set()  # chats told today that their budget is spent

    def add(self, chat: str, *, kind: str, model: str, engine: str, usage: Usage | None) -> None:
        with self._lock:
            self.replies[engine or "main"] += 1
            if usage is None:
                return
            prompt = usage.prompt_tokens
            completion = usage.completion_tokens or max(0, usage.total_tokens - prompt)
            model = self._counted_as(model)
            self.tokens[(kind, model, "prompt")] += prompt
            self.tokens[(kind, model, "completion")] += completion
            self._roll()
            self._chats[chat] += usage.total_tokens or prompt + completion

    def _counted_as(self, model: str) -> str:
        """The name ``model``'s tokens are counted under: its own while fewer than
        ``LLM_MODELS_COUNTED`` names are, else ``OTHER_MODEL``."""
        if model not in self._models and len(self._models) >= LLM_MODELS_COUNTED:
            return OTHER_MODEL
        self._models.add(model)
        return model

    def _roll(self) -> None:
        day = self._today()
        if day != self._day:
            self._day, self._chats, self._refused = day, Counter(), set()

    def spent_today(self, chat: str) -> int:
        with self._lock:
            self._roll()
            return self._chats[chat]

    def over_budget(self, chat: str) -> bool:
        """True once ``chat`` has used its daily tokens (never without a budget)."""
        return self.daily_tokens_per_chat is not None and self.spent_today(chat) >= self.daily_tokens_per_chat

    def first_refusal_today(self, chat: str) -> bool:
        """True the first time a day ``chat`` is refused for its budget: one notice a day."""
        with self._lock:
            self._roll()
            first = chat not in self._refused
            self._refused.add(chat)
            return first

    def status(self) -> dict[str, Any]:
        with self._lock:
            by_kind: Counter[str] = Counter()
            for (kind, _, _), n in self.tokens.items():
                by_kind[kind] += n
            return {"tokens_total": sum(self.tokens.values()), "tokens_by_kind": dict(by_kind),
                    "replies_by_engine": dict(self.replies),
                    "daily_tokens_per_chat": self.daily_tokens_per_chat,
                    "chats_today": len(self._chats)}
