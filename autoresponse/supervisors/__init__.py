"""Supervision and the application tree: config, the tree the daemon runs, its CLI."""

from autoresponse.supervisors.app import Application, make_engine
from autoresponse.supervisors.config import LLMSettings, RuntimeSettings, Settings

__all__ = ["Application", "LLMSettings", "RuntimeSettings", "Settings", "make_engine"]
