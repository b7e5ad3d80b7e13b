"""The terminal's settings and limits."""

from __future__ import annotations

from pydantic import BaseModel, Field

#: Longest command line the LLM may ask the terminal executor to run.
MAX_COMMAND_CHARS = 1_000
#: Bytes of command output kept; the rest is cut with a note.
COMMAND_OUTPUT_CAP = 16_000
#: Seconds a command may run before its whole process group is killed.
COMMAND_TIMEOUT_SECONDS = 20.0

#: Commands that run at once; more wait their turn in the executor's mailbox.
COMMAND_CONCURRENCY = 4

#: The allowlist `autoresponse demo` enables when none is configured.
DEMO_COMMANDS = ("df", "uptime", "date", "uname", "whoami", "echo", "hostname", "free")


class TerminalSettings(BaseModel):
    """Off unless enabled; when on, only allowlisted programs run."""

    enabled: bool = False
    allowed_commands: list[str] = Field(default_factory=list)
    timeout: float = Field(default=COMMAND_TIMEOUT_SECONDS, gt=0)
    output_cap: int = Field(default=COMMAND_OUTPUT_CAP, gt=0)
    max_concurrent: int = Field(default=COMMAND_CONCURRENCY, ge=1)
