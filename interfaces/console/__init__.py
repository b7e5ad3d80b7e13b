"""The console: an inbound interface on stdin and a sender on stdout."""

from __future__ import annotations

from autoresponse.actors import routes
from autoresponse.interfaces.console.actions import MessageConsoleAction
from autoresponse.interfaces.console.console import Console, ConsoleInput
from autoresponse.interfaces.console.interface import INTERFACE_NAME, ConsoleInterface, StdinReader, origin
from autoresponse.interfaces.console.sender import ConsoleSender
from autoresponse.interfaces.console.settings import ConsoleSettings
from autoresponse.supervisors import ChildSpec, Mount, Platform


def _mount(m: Mount) -> None:
    console = m.provided.get("console") or Console()
    m.expose(console)
    m.pipeline(ChildSpec(routes.sender(INTERFACE_NAME), ConsoleSender, (console, m.journal)))
    m.inbound(ChildSpec(routes.interface(INTERFACE_NAME), ConsoleInterface, (console,),
                        {"read_stdin": m.settings.read_stdin}))
    m.origin(ConsoleInput, origin)  # a line its interface crashed on: the console is told


PLATFORM = Platform("console", ConsoleSettings, _mount, actions=(MessageConsoleAction,),
                    interface=INTERFACE_NAME)

__all__ = ["INTERFACE_NAME", "PLATFORM", "Console", "ConsoleInput", "ConsoleInterface", "ConsoleSender",
           "ConsoleSettings", "MessageConsoleAction", "StdinReader"]
