from __future__ import annotations

from pydantic import BaseModel, Field

from autoresponse.limits import COMMAND_OUTPUT_CAP, COMMAND_TIMEOUT_SECONDS

#: The allowlist `autoresponse demo` enables when none is configured.
DEMO_COMMANDS = ("df", "uptime", "date", "uname", "whoami", "echo", "hostname", "free")


class TerminalSettings(BaseModel):
    """Off unless enabled; when on, only allowlisted programs run."""

    enabled: bool = False
    allowed_commands: list[str] = Field(default_factory=list)
    timeout: float = Field(default=COMMAND_TIMEOUT_SECONDS, gt=0)
    output_cap: int = Field(default=COMMAND_OUTPUT_CAP, gt=0)
