"""The console's settings."""

from __future__ import annotations

from pydantic import BaseModel


class ConsoleSettings(BaseModel):
    enabled: bool = True
    #: Read requests from stdin when the daemon runs.
    read_stdin: bool = True
