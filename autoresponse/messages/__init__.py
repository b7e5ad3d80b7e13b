"""The protocol: pydantic models and nothing else.

>>> from autoresponse.messages import OriginalContext, ActionResult, ActionOutput
>>> ctx = OriginalContext(chat_id=1, message_id=2, interface_name="console")
>>> ActionOutput(original_context=ctx,
...              results=[ActionResult(action_type="terminal", output="ok")]).results[0].ok
True
"""

from autoresponse.messages.actions import (
    ACTION_MODELS,
    ACTIONS_BY_TYPE,
    Action,
    BaseAction,
    EventAction,
    MessageConsoleAction,
    MessagePayload,
    MessageTelegramBotAction,
    TerminalAction,
    action_key,
    full_json_instructions,
    message_action_for,
    parse_action,
)
from autoresponse.messages.context import ChatId, OriginalContext
from autoresponse.messages.control import Crash, Exit, Failure
from autoresponse.messages.envelope import Envelope
from autoresponse.messages.pipeline import (
    ActionRequest,
    EventDue,
    LLMFailure,
    LLMReply,
    LLMRequest,
    OutboundMessage,
    Rejection,
    SendReceipt,
    UserRequest,
)
from autoresponse.messages.prompt import (
    PromptRequest,
    Turn,
    build_chat_request,
    build_delivery_request,
    build_reask_request,
    render_openai_messages,
)
from autoresponse.messages.system import (
    ERROR_RETRY_POLICY,
    ActionOutput,
    ActionResult,
    DueEvent,
    SystemMessage,
)

__all__ = [
    "ACTIONS_BY_TYPE",
    "ACTION_MODELS",
    "ERROR_RETRY_POLICY",
    "Action",
    "ActionOutput",
    "ActionRequest",
    "ActionResult",
    "BaseAction",
    "ChatId",
    "Crash",
    "DueEvent",
    "Envelope",
    "EventAction",
    "EventDue",
    "Exit",
    "Failure",
    "LLMFailure",
    "LLMReply",
    "LLMRequest",
    "MessageConsoleAction",
    "MessagePayload",
    "MessageTelegramBotAction",
    "OriginalContext",
    "OutboundMessage",
    "PromptRequest",
    "Rejection",
    "SendReceipt",
    "SystemMessage",
    "TerminalAction",
    "Turn",
    "UserRequest",
    "build_chat_request",
    "action_key",
    "build_delivery_request",
    "build_reask_request",
    "full_json_instructions",
    "message_action_for",
    "parse_action",
    "render_openai_messages",
]
