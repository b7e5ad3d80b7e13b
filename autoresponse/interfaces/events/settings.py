from __future__ import annotations

from pydantic import BaseModel, Field

from autoresponse.limits import EVENTS_CHECK_SECONDS, EVENTS_UNCONFIRMED_SECONDS


class EventsSettings(BaseModel):
    """Reminders (the `event` action), stored in ``<data_dir>/events.sqlite3``."""

    enabled: bool = True
    check_seconds: float = Field(default=EVENTS_CHECK_SECONDS, gt=0)
    #: A reminder handed to the LLM but not confirmed sent within this long is tried again.
    unconfirmed_seconds: float = Field(default=EVENTS_UNCONFIRMED_SECONDS, gt=0)
