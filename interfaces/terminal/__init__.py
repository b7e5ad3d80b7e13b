"""The terminal executor: allowlisted programs, no shell."""

from __future__ import annotations

from autoresponse.actors import routes
from autoresponse.interfaces.terminal.actions import TerminalAction, TerminalPayload
from autoresponse.interfaces.terminal.command import CommandRefused, parse_command, run_command
from autoresponse.interfaces.terminal.executor import TerminalExecutor
from autoresponse.interfaces.terminal.settings import DEMO_COMMANDS, TerminalSettings
from autoresponse.supervisors import ChildSpec, Mount, Platform


def _mount(m: Mount) -> None:
    m.pipeline(ChildSpec(routes.executor("terminal"), TerminalExecutor, (m.settings,)))


PLATFORM = Platform("terminal", TerminalSettings, _mount, actions=(TerminalAction,),
                    action_aliases={"bash": "terminal"})

__all__ = ["DEMO_COMMANDS", "PLATFORM", "CommandRefused", "TerminalAction", "TerminalExecutor",
           "TerminalPayload", "TerminalSettings", "parse_command", "run_command"]
