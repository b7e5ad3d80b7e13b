"""The ``terminal`` action (``bash`` is accepted as an alias, as the seed named it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoresponse.interfaces.terminal.settings import MAX_COMMAND_CHARS
from autoresponse.messages import CommandAction


class TerminalPayload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str = Field(
        min_length=1,
        max_length=MAX_COMMAND_CHARS,
        description="One program and its arguments, e.g. 'df -h'. Runs without a shell.",
    )


class TerminalAction(CommandAction):
    """Run an allowlisted program; its output comes back to you to format."""

    type: Literal["terminal"]
    payload: TerminalPayload
