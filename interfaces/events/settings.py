"""Reminders' settings and limits."""

from __future__ import annotations

from pydantic import BaseModel, Field

from autoresponse.actors.kernel.backoff import BackoffPolicy

#: How often due reminders are looked for.
EVENTS_CHECK_SECONDS = 5.0
#: How long after its turn ended a reminder may stay unconfirmed before it is tried again.
EVENTS_UNCONFIRMED_SECONDS = 300.0
#: Tries to deliver one occurrence of a reminder before it is given up (one notice, a dead letter).
EVENTS_MAX_ATTEMPTS = 5
#: Wait before trying a failed reminder again: 30 s, doubling, at most 30 min.
EVENTS_RETRY_MIN_SECONDS = 30.0
EVENTS_RETRY_MAX_SECONDS = 1800.0
#: A reminder for a moment longer ago than this is refused (it would go out at once, "days
#: late": a model unsure of today's date); less is a turn's own delay, and goes out at once.
EVENTS_PAST_GRACE_SECONDS = 600.0


class EventsSettings(BaseModel):
    """Reminders (the `event` action), stored in ``<data_dir>/events.sqlite3``."""

    enabled: bool = True
    check_seconds: float = Field(default=EVENTS_CHECK_SECONDS, gt=0)
    #: A reminder whose turn ended but was not confirmed sent within this long after is tried again
    #: (never while its turn is under way: it would go out twice).
    unconfirmed_seconds: float = Field(default=EVENTS_UNCONFIRMED_SECONDS, gt=0)
    #: Tries per occurrence; a failed one is tried again with backoff, then given up.
    max_attempts: int = Field(default=EVENTS_MAX_ATTEMPTS, ge=1)
    retry_min: float = Field(default=EVENTS_RETRY_MIN_SECONDS, ge=0)
    retry_max: float = Field(default=EVENTS_RETRY_MAX_SECONDS, ge=0)

    def retry_backoff(self) -> BackoffPolicy:
        return BackoffPolicy(min=self.retry_min, max=self.retry_max, jitter=0.1)
