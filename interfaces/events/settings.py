"""Reminders' settings and limits."""

from __future__ import annotations

from pydantic import BaseModel, Field

#: How often due reminders are looked for.
EVENTS_CHECK_SECONDS = 5.0
#: How long a reminder handed to the LLM may stay unconfirmed before it is tried again.
EVENTS_UNCONFIRMED_SECONDS = 300.0


class EventsSettings(BaseModel):
    """Reminders (the `event` action), stored in ``<data_dir>/events.sqlite3``."""

    enabled: bool = True
    check_seconds: float = Field(default=EVENTS_CHECK_SECONDS, gt=0)
    #: A reminder handed to the LLM but not confirmed sent within this long is tried again.
    unconfirmed_seconds: float = Field(default=EVENTS_UNCONFIRMED_SECONDS, gt=0)
