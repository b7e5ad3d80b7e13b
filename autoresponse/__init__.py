"""autoresponse: an actor runtime that delivers the results of a bot's actions
back to its users *through the LLM*.

The public facade::

    from autoresponse import Application, Settings, request_llm_delivery

    with Application(Settings.load()) as app:
        app.runtime.send("interface.console", ConsoleInput(text="run df -h"))

The rooms install under this namespace: ``autoresponse.messages`` (the
protocol), ``autoresponse.actors`` (the kernel and the pipeline),
``autoresponse.supervisors`` (supervision and the platform registry) and
``autoresponse.interfaces`` (the platforms). This package is the composition
root: the application tree, its configuration, the admin endpoint and the CLI.
Its names load on first use, so ``import autoresponse.messages`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_LAZY = {
    "Application": "autoresponse.app",
    "StartError": "autoresponse.app",
    "Settings": "autoresponse.config",
    "request_llm_delivery": "autoresponse.actors.builder",
}

if TYPE_CHECKING:
    from autoresponse.actors.builder import request_llm_delivery
    from autoresponse.app import Application, StartError
    from autoresponse.config import Settings


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoresponse' has no attribute {name!r}")


__all__ = ["Application", "Settings", "StartError", "__version__", "request_llm_delivery"]
