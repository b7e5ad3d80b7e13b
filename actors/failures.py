"""What a user hears when their request dies on the way: one short notice.

A request ends as a dead letter, with its reason, when a message of it crashed its actor on
every attempt, looped past the hop limit, outlived its deadline, or found its actor stopped
for good. The dead letter is for the operator; the user, who asked and is waiting, gets
``FAILURE_NOTICE`` in their chat, once a request. A context that asked for a receipt (a
reminder's) has its asker told instead, who decides what the user hears::

    >>> runtime.dead_letters.observers.append(FailureNotices(runtime))   # doctest: +SKIP

Nothing is said for the other reasons: they have a word of their own (re-asks exhausted,
the LLM unreachable), or no word can reach the user (an unreachable chat), or they are
inputs never read. Nor for an autonomous turn, which the bot may leave unanswered anyway,
for a notice that itself failed, or for a reply's memory failing after the user saw it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from autoresponse.actors.kernel.runtime import Runtime
from autoresponse.actors.limits import FAILURES_REMEMBERED
from autoresponse.actors.routes import sender
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, ReplyDelivered, SendReceipt

FAILURE_NOTICE = "Sorry, something went wrong with your request, and it was not finished. Please try again."
#: The reasons of a dead letter that the user is told of.
TOLD = frozenset({"crash", "hop limit", "deadline", "actor stopped"})


def context_of(body: Any) -> OriginalContext | None:
    """The chat a message acts for (a request, a prompt or reply of its turn, an action, its
    output, a reply to send), or None."""
    context = getattr(body, "context", None) or getattr(body, "original_context", None)
    if context is None:
        context = getattr(getattr(body, "prompt", None), "original_context", None)
    return context if isinstance(context, OriginalContext) else None


class FailureNotices:
    """A dead-letter observer (``DeadLetterOffice.observers``): sends the notice, from the
    thread that posted the letter, through the chat's sender. Thread-safe."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        self._told: OrderedDict[str, None] = OrderedDict()  # correlations told, newest last

    def __call__(self, envelope: Envelope, reason: str, actor: str | None) -> None:
        body = envelope.body
        if reason not in TOLD or isinstance(body, ReplyDelivered):
            return
        if isinstance(body, OutboundMessage) and body.notice:
            return
        context = context_of(body)
        if context is None or context.autonomous or not self._first(envelope.correlation_id):
            return
        # Its request's correlation, not a child of the letter: a child would carry on the
        # deadline that passed, or the hops past the limit.
        correlation = envelope.correlation_id
        if context.receipt_to is not None and context.receipt_key is not None:
            self.runtime.send(context.receipt_to, SendReceipt(key=context.receipt_key, ok=False,
                                                              detail=f"{reason} at {actor or '-'}"),
                              correlation_id=correlation)
            return
        to = sender(context.interface_name)
        if self.runtime.has(to):
            self.runtime.send(to, OutboundMessage.reply(context, FAILURE_NOTICE, notice=True), correlation_id=correlation)

    def _first(self, correlation: str) -> bool:
        """The first failure of ``correlation`` told (one notice a request, however many of
        its messages die); the newest ``FAILURES_REMEMBERED`` are remembered."""
        with self._lock:
            if correlation in self._told:
                return False
            self._told[correlation] = None
            if len(self._told) > FAILURES_REMEMBERED:
                self._told.popitem(last=False)
            return True
