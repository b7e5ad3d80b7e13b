"""What an LLM engine is: a prompt in, a ``Completion`` out.

An engine is the transport of the actions to a model: it renders the prompt in the
protocol it speaks (native tools, a json_schema response format, or JSON in text),
strips reasoning off the answer, and says what the call cost. Everything after it
reads only the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from autoresponse.messages import PromptRequest, ToolCall, Usage


class LLMError(Exception):
    """The LLM could not answer. ``status`` is the HTTP status when there was one;
    ``context_exceeded`` says the request did not fit the model's context window;
    ``constraint_failed`` says the server's own enforcement of the answer's format (the
    grammar it built from the schema or the tools) broke while the model wrote, so the
    same request would break the same way, and asked without it, it may not."""

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, retryable: bool = False,
                 context_exceeded: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.retryable = retryable
        self.context_exceeded = context_exceeded
        #: Set by the engine that sent the grammar, which alone knows it did.
        self.constraint_failed = False


@dataclass(frozen=True)
class Completion:
    """One answer of a model: its text with reasoning stripped off, its native tool calls,
    the reasoning itself (for the trace, never read as actions), and what it cost."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str = ""
    #: Which engine answered (set by a chain of engines) and how it was asked.
    engine: str = ""
    protocol: str = "text"
    #: Engines tried before this one answered, with why each failed.
    failed: tuple[str, ...] = field(default=())


class LLMEngine(Protocol):
    async def answer(self, prompt: PromptRequest,
                     on_text: Callable[[str], None] | None = None) -> Completion:
        """The model's answer to ``prompt``; raises ``LLMError``. An engine that streams
        says so with a true ``stream`` attribute, and calls ``on_text`` with the answer
        so far (reasoning already cut off) as it grows.

        Any other exception is a bug in the engine; the client still turns it into a
        failure the user hears about.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; called once, on the event loop, at shutdown."""
        ...
