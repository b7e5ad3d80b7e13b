"""autoresponse: an actor runtime that delivers the results of a bot's actions
back to its users *through the LLM*.

The public facade::

    from autoresponse import Application, Settings, request_llm_delivery

    with Application(Settings()) as app:
        app.ask_console("run df -h")
"""

__version__ = "0.1.0"

from autoresponse.actors.builder import request_llm_delivery
from autoresponse.supervisors.app import Application
from autoresponse.supervisors.config import Settings

__all__ = ["Application", "Settings", "__version__", "request_llm_delivery"]
