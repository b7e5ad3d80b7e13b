"""The terminal executor: allowlisted programs, no shell."""

from autoresponse.interfaces.terminal.command import CommandRefused, parse_command, run_command
from autoresponse.interfaces.terminal.executor import TerminalExecutor
from autoresponse.interfaces.terminal.settings import DEMO_COMMANDS, TerminalSettings

__all__ = ["DEMO_COMMANDS", "CommandRefused", "TerminalExecutor", "TerminalSettings",
           "parse_command", "run_command"]
