"""The console: an inbound interface on stdin and a sender on stdout."""

from autoresponse.interfaces.console.console import Console, ConsoleInput
from autoresponse.interfaces.console.interface import INTERFACE_NAME, ConsoleInterface, StdinReader
from autoresponse.interfaces.console.sender import ConsoleSender

__all__ = ["INTERFACE_NAME", "Console", "ConsoleInput", "ConsoleInterface", "ConsoleSender",
           "StdinReader"]
