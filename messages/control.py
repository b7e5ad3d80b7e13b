"""Control messages of the runtime itself: exit signals, requested crashes, and what
stands in a dead letter for an input that could not be read."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field


class Failure(BaseModel):
    """Why an actor last failed."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    time: float = Field(default_factory=time.time)

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        return cls(type=type(error).__name__, message=str(error))


class Exit(BaseModel):
    """An actor's incarnation ended; sent to its supervisor (Erlang's EXIT signal).

    ``abnormal`` is False when the actor stopped itself normally.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    abnormal: bool
    failure: Failure | None = None
    #: The message it failed on is a dead letter now, after its last attempt: the next
    #: incarnation starts on other work, not on the same failure.
    set_aside: bool = False


class Crash(BaseModel):
    """Ask an actor to crash, as if its handler had raised (for operators and chaos tests)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str = "crash requested"


class MalformedInput(BaseModel):
    """An input that could not be read (an update a platform sent, a work item in the
    journal), kept in its dead letter as it came, cut to ``MALFORMED_KEPT`` characters."""

    model_config = ConfigDict(frozen=True)

    raw: str
