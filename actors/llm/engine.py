"""What an LLM engine is: OpenAI-style chat messages in, the reply's text out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class LLMError(Exception):
    """The LLM could not answer. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.retryable = retryable


class LLMEngine(Protocol):
    async def complete(self, messages: list[dict[str, str]],
                       on_text: Callable[[str], None] | None = None) -> str:
        """The text of the LLM's answer to ``messages``; raises ``LLMError``. An engine
        that streams says so with a true ``stream`` attribute, and calls ``on_text``
        with the text so far as it grows (an engine without it is never given one).

        Any other exception is a bug in the engine; the client still turns it
        into a failure the user hears about.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; called once, on the event loop, at shutdown."""
        ...
