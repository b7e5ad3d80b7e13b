"""The LLM client actor and its engines (HTTP, offline).

>>> from autoresponse.actors.llm import OfflineEngine, HttpEngine, LLMClient
"""

from autoresponse.actors.llm.chain import CircuitBreaker, EngineChain, NoticeEngine
from autoresponse.actors.llm.client import LLMClient
from autoresponse.actors.llm.engine import Completion, LLMEngine, LLMError
from autoresponse.actors.llm.http import HttpEngine
from autoresponse.actors.llm.offline import OfflineEngine
from autoresponse.actors.llm.usage import UsageMeter

__all__ = ["CircuitBreaker", "Completion", "EngineChain", "HttpEngine", "NoticeEngine", "UsageMeter", "LLMClient", "LLMEngine", "LLMError", "OfflineEngine"]
