"""The LLM client actor and its engines (HTTP, offline).

>>> from autoresponse.actors.llm import OfflineEngine, HttpEngine, LLMClient
"""

from autoresponse.actors.llm.client import LLMClient
from autoresponse.actors.llm.engine import LLMEngine, LLMError
from autoresponse.actors.llm.http import HttpEngine
from autoresponse.actors.llm.offline import OfflineEngine

__all__ = ["HttpEngine", "LLMClient", "LLMEngine", "LLMError", "OfflineEngine"]
