"""The envelope around every message in flight.

Logs, status, dead letters and the journal identify work by it: one
correlation id per user request, kept through the whole loop; a causation id
naming the message that caused this one; a hop count that ends loops; an
attempt number for retries; and an optional deadline. A message that continues a
span of another process (a work item another daemon published) carries that span's
W3C trace context (``traceparent``); see ``autoresponse.otel``.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import time
from typing import Any

from pydantic import BaseModel

# Ids are a per-process random prefix and a counter: unique, ordered, and far
# cheaper than a uuid4 on every hop.
_PREFIX = os.urandom(4).hex()
_counter = itertools.count(1)


#: The correlation of the message being handled in this thread (and in the I/O it started):
#: the runtime sets it around each handler; log lines and the journal's send ledger read it.
current_correlation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "current_correlation", default=None)


def new_id() -> str:
    """A fresh message id, unique across processes and restarts."""
    return f"{_PREFIX}-{next(_counter):x}"


class Envelope:
    """A message body plus the metadata that follows it through the runtime.

    Immutable by convention and slotted: it is built on every hop, so it is a
    plain class (a tenth of a pydantic model's cost); the body is the typed part.

    >>> env = Envelope.new(body="hello")
    >>> child = env.child("world")
    >>> child.correlation_id == env.correlation_id, child.causation_id == env.message_id
    (True, True)
    >>> child.hops
    1
    """

    __slots__ = ("message_id", "correlation_id", "causation_id", "hops", "attempt", "deadline", "body",
                 "traceparent", "queued_at", "trace")

    # Every argument may be passed by position: the runtime builds an envelope on every hop, and
    # a class called with keywords first packs them into a dict.
    def __init__(self, message_id: str, correlation_id: str, body: Any, causation_id: str | None = None,
                 hops: int = 0, attempt: int = 1, deadline: float | None = None,
                 traceparent: str | None = None) -> None:
        self.message_id = message_id
        self.correlation_id = correlation_id
        self.causation_id = causation_id
        self.hops = hops
        self.attempt = attempt
        self.deadline = deadline  # time.time() seconds; None means no deadline
        self.body = body
        #: The W3C ``traceparent`` of a span in another process that this message continues
        #: (the daemon that published it as a work item), or None. Within a process a hop's
        #: parent span is its cause's, named by ``causation_id``, so children do not copy it.
        self.traceparent = traceparent
        #: When the runtime last queued it (its clock), for its trace; None until then, or untraced.
        self.queued_at: float | None = None
        #: Its correlation's trace as the runtime records it (None: untraced, or not yet queued);
        #: its children carry it on, so a hop finds its trace without a lookup.
        self.trace: list[Any] | None = None

    @classmethod
    def new(cls, body: Any, *, correlation_id: str | None = None, timeout: float | None = None,
            now: float | None = None, traceparent: str | None = None) -> Envelope:
        """Start a new chain (a new user request unless a correlation is given). A ``timeout``
        counts from ``now`` (the runtime's clock; the wall clock when not given)."""
        message_id = new_id()
        deadline = None if timeout is None else (time.time() if now is None else now) + timeout
        return cls(message_id, correlation_id or message_id, body, None, 0, 1, deadline, traceparent)

    def child(self, body: Any) -> Envelope:
        """The envelope of a message caused by this one: same chain, one hop on."""
        child = Envelope(new_id(), self.correlation_id, body, self.message_id, self.hops + 1, 1, self.deadline)
        child.trace = self.trace
        return child

    def retried(self) -> Envelope:
        """The same message, one attempt later."""
        # Not its trace: a retry finds its correlation's trace again as it is queued (a
        # replayed dead letter's is long gone, and a new one starts).
        return Envelope(self.message_id, self.correlation_id, self.body, self.causation_id, self.hops,
                        self.attempt + 1, self.deadline, self.traceparent)

    def expired(self, now: float | None = None) -> bool:
        """Past its deadline at ``now`` (the runtime's clock; the wall clock when not given)."""
        return self.deadline is not None and (time.time() if now is None else now) > self.deadline

    def describe(self) -> dict[str, Any]:
        """A JSON-ready view, the body included, for logs, dead letters and the journal."""
        body = self.body
        dumped = body.model_dump(mode="json") if isinstance(body, BaseModel) else repr(body)
        described = {
            "message_id": self.message_id,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "hops": self.hops,
            "attempt": self.attempt,
            "deadline": self.deadline,
            "body_type": type(body).__name__,
            "body": dumped,
        }
        if self.traceparent is not None:
            described["traceparent"] = self.traceparent
        return described

    @classmethod
    def restore(cls, described: dict[str, Any], body: Any) -> Envelope:
        """The envelope ``describe`` wrote, around ``body`` rebuilt from it."""
        return cls(described["message_id"], described["correlation_id"], body,
                   causation_id=described.get("causation_id"), hops=described.get("hops", 0),
                   attempt=described.get("attempt", 1), deadline=described.get("deadline"),
                   traceparent=described.get("traceparent"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Envelope):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _WHAT_IT_IS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Envelope({self.message_id}, correlation={self.correlation_id}, hops={self.hops}, "
                f"attempt={self.attempt}, body={type(self.body).__name__})")


#: What two envelopes must share to be equal: not the runtime's bookkeeping of its trace.
_WHAT_IT_IS = tuple(name for name in Envelope.__slots__ if name not in ("queued_at", "trace"))
