"""The terminal's settings and limits."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Longest command line the LLM may ask the terminal executor to run.
MAX_COMMAND_CHARS = 1_000
#: Bytes of command output kept; the rest is cut with a note.
COMMAND_OUTPUT_CAP = 16_000
#: Seconds a command may run before its whole process group is killed.
COMMAND_TIMEOUT_SECONDS = 20.0
#: Seconds the rest of a command's output may take to arrive once its own process exited
#: and its group was killed: only a process outside its group can hold the output open longer.
OUTPUT_GRACE_SECONDS = 1.0

#: Commands that run at once; more wait their turn in the executor's mailbox.
COMMAND_CONCURRENCY = 4

#: The allowlist `autoresponse demo` enables when none is configured.
DEMO_COMMANDS = ("df", "uptime", "date", "uname", "whoami", "echo", "hostname", "free")

_SHORT_OPTION = re.compile(r"-[^-]")
_LONG_OPTION = re.compile(r"--[^=]+")


class ArgumentRule(BaseModel):
    """Which arguments one allowlisted program takes; an empty rule allows any.

    ``refuse``: options refused wherever they appear. ``-f`` also catches it
    inside a bundle (``-uf``) or with its value attached (``-f/etc/shadow``);
    ``--file`` also catches ``--file=x`` and every abbreviation (``--fi``).
    ``takes_value``: short options that take a value, so in ``-dVALUE`` the
    rest of the word is the value and not more bundled options.
    ``operands``: patterns each operand must match in full; ``None``: any,
    ``[]``: none. An option's value must be attached (``--date=VALUE``): a
    separate word counts as an operand, as the rule does not know which
    options take one.
    ``max_args``: at most this many words after the program (``0``: none).

    >>> rule = ArgumentRule(refuse=["-f", "--file"], operands=[r"\\+.*"])
    >>> rule.refuse, rule.max_args
    (('-f', '--file'), None)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")  # a typo must not allow everything

    refuse: tuple[str, ...] = ()
    takes_value: tuple[str, ...] = ()
    operands: tuple[str, ...] | None = None
    max_args: int | None = Field(default=None, ge=0)

    @field_validator("refuse")
    @classmethod
    def _options(cls, options: tuple[str, ...]) -> tuple[str, ...]:
        for option in options:
            if not (_SHORT_OPTION.fullmatch(option) or _LONG_OPTION.fullmatch(option)):
                raise ValueError(f"{option!r} is not an option like -f or --file")
        return options

    @field_validator("takes_value")
    @classmethod
    def _short_options(cls, options: tuple[str, ...]) -> tuple[str, ...]:
        for option in options:
            if not _SHORT_OPTION.fullmatch(option):
                raise ValueError(f"{option!r} is not a short option like -d")
        return options

    @field_validator("operands")
    @classmethod
    def _patterns(cls, patterns: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for pattern in patterns or ():
            try:  # a bad pattern fails at startup, not when the LLM asks
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad operand pattern {pattern!r}: {exc}") from None
        return patterns


#: Shipped rules: no option that reads or writes files or changes the machine.
#: They hold whatever the allowlist is; a configured rule for a program replaces its rule here.
DEFAULT_ARGUMENT_RULES: dict[str, ArgumentRule] = {
    # -f/--file and -r/--reference read files (-f echoes their lines in errors);
    # -s/--set and any operand but +FORMAT (``date 010100002030``) set the clock.
    "date": ArgumentRule(refuse=("-f", "--file", "-r", "--reference", "-s", "--set"),
                         takes_value=("-d", "-I"), operands=(r"\+.*",)),
    # With any argument it sets the host name (NAME, -F FILE, -b) or the NIS domain.
    "hostname": ArgumentRule(max_args=0),
    # coreutils' uptime reads a FILE operand as its utmp file; procps' takes none.
    "uptime": ArgumentRule(operands=()),
}


class TerminalSettings(BaseModel):
    """Off unless enabled; when on, only allowlisted programs run, with only the
    arguments their rule allows (``DEFAULT_ARGUMENT_RULES`` unless configured).

    A configured rule replaces the shipped one for its program, as a whole::

        [terminal]
        enabled = true
        allowed_commands = ["date", "hostname", "echo"]

        [terminal.arguments.date]
        refuse = ["-f", "--file", "-r", "--reference", "-s", "--set"]
        takes_value = ["-d", "-I"]
        operands = ['\\+.*']     # only +FORMAT: other operands set the clock

        [terminal.arguments.hostname]
        max_args = 0

    >>> TerminalSettings(arguments={"echo": {"max_args": 3}}).arguments["date"].max_args is None
    True
    """

    enabled: bool = False
    allowed_commands: list[str] = Field(default_factory=list)
    #: Effective rules by program: the shipped ones, with configured ones in their place.
    arguments: dict[str, ArgumentRule] = Field(default_factory=lambda: dict(DEFAULT_ARGUMENT_RULES))
    timeout: float = Field(default=COMMAND_TIMEOUT_SECONDS, gt=0)
    output_cap: int = Field(default=COMMAND_OUTPUT_CAP, gt=0)
    max_concurrent: int = Field(default=COMMAND_CONCURRENCY, ge=1)
    #: ``ask``: a command runs only once the one who asked, or an approver (the top-level
    #: ``approvers``), pressed Approve; ``never`` (the default): commands run at once.
    approval: Literal["never", "ask"] = "never"

    @field_validator("arguments")
    @classmethod
    def _keep_shipped_rules(cls, rules: dict[str, Any]) -> dict[str, ArgumentRule]:
        # Configuring one program's rule must not drop the others' shipped rules.
        return {**DEFAULT_ARGUMENT_RULES, **rules}
