"""The ``event`` action: a reminder that comes back to its chat when it is due."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoresponse.messages import CommandAction


#: How a reminder repeats.
Repeat = Literal["none", "daily", "weekly", "monthly"]


class EventPayload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    date: dt.date = Field(description="Day of the (first) reminder, YYYY-MM-DD.")
    # A time with an offset is converted to local time when stored (``store.local_wall``).
    time: dt.time | None = Field(default=None, description=(
        "HH:MM local time, optional. A time with a UTC offset (HH:MMZ, HH:MM+02:00) is that moment: "
        "it is stored as the local time it falls on, and a repeating reminder repeats at that local time."))
    repeat: Repeat = "none"
    description: str = Field(min_length=1, max_length=1_000)


class EventAction(CommandAction):
    """Schedule a reminder that comes back to this chat when it is due."""

    type: Literal["event"]
    payload: EventPayload
