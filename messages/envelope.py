"""The envelope around every message in flight.

Logs, status, dead letters and the journal identify work by it: one
correlation id per user request, kept through the whole loop; a causation id
naming the message that caused this one; a hop count that ends loops; an
attempt number for retries; and an optional deadline.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

# Ids are a per-process random prefix and a counter: unique, ordered, and far
# cheaper than a uuid4 on every hop.
_PREFIX = os.urandom(4).hex()
_counter = itertools.count(1)


def new_id() -> str:
    """A fresh message id, unique across processes and restarts."""
    return f"{_PREFIX}-{next(_counter):x}"


class Envelope(BaseModel):
    """A message body plus the metadata that follows it through the runtime.

    >>> env = Envelope.new(body="hello")
    >>> child = env.child("world")
    >>> child.correlation_id == env.correlation_id, child.causation_id == env.message_id
    (True, True)
    >>> child.hops
    1
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    message_id: str
    correlation_id: str
    causation_id: str | None = None
    hops: int = 0
    attempt: int = 1
    deadline: float | None = None  # time.time() seconds; None means no deadline
    body: Any

    @classmethod
    def new(
        cls,
        body: Any,
        *,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> Envelope:
        """Start a new chain (a new user request unless a correlation is given)."""
        message_id = new_id()
        # model_construct: the fields are ours and already right; skip validation
        # on the hot path.
        return cls.model_construct(
            message_id=message_id,
            correlation_id=correlation_id or message_id,
            causation_id=None,
            hops=0,
            attempt=1,
            deadline=None if timeout is None else time.time() + timeout,
            body=body,
        )

    def child(self, body: Any) -> Envelope:
        """The envelope of a message caused by this one: same chain, one hop on."""
        return Envelope.model_construct(
            message_id=new_id(),
            correlation_id=self.correlation_id,
            causation_id=self.message_id,
            hops=self.hops + 1,
            attempt=1,
            deadline=self.deadline,
            body=body,
        )

    def retried(self) -> Envelope:
        """The same message, one attempt later."""
        return self.model_copy(update={"attempt": self.attempt + 1})

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (now or time.time()) > self.deadline

    def describe(self) -> dict[str, Any]:
        """A JSON-ready view, the body included, for logs and dead letters."""
        body = self.body
        dumped = body.model_dump(mode="json") if isinstance(body, BaseModel) else repr(body)
        return {
            "message_id": self.message_id,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "hops": self.hops,
            "attempt": self.attempt,
            "deadline": self.deadline,
            "body_type": type(body).__name__,
            "body": dumped,
        }
