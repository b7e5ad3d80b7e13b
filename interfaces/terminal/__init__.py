"""The terminal executor: allowlisted programs, no shell."""

from __future__ import annotations

from autoresponse.actors import routes
from autoresponse.interfaces.terminal.actions import TerminalAction, TerminalPayload
from autoresponse.interfaces.terminal.command import (
    CommandRefused,
    check_arguments,
    parse_command,
    run_command,
)
from autoresponse.interfaces.terminal.executor import TerminalExecutor, command_argv
from autoresponse.interfaces.terminal.settings import (
    DEFAULT_ARGUMENT_RULES,
    DEMO_COMMANDS,
    ArgumentRule,
    TerminalSettings,
)
from autoresponse.messages import BaseAction
from autoresponse.supervisors import ChildSpec, Mount, Platform


def _mount(m: Mount) -> None:
    settings: TerminalSettings = m.settings
    m.pipeline(ChildSpec(routes.executor("terminal"), TerminalExecutor, (settings,)))

    def refusal(action: BaseAction) -> str:
        try:
            command_argv(settings, action.payload.command)
        except CommandRefused as exc:
            return f"{action.type}: {exc}"
        return ""

    m.preflight("terminal", refusal)


PLATFORM = Platform("terminal", TerminalSettings, _mount, actions=(TerminalAction,),
                    action_aliases={"bash": "terminal"})

__all__ = ["DEFAULT_ARGUMENT_RULES", "DEMO_COMMANDS", "PLATFORM", "ArgumentRule", "CommandRefused",
           "TerminalAction", "TerminalExecutor", "TerminalPayload", "TerminalSettings",
           "check_arguments", "parse_command", "run_command"]
