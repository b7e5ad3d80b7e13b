"""The protocol: pydantic models, and the registries of the open sets they use
(action types, interface names). Nothing else, and nothing of ours is imported.

>>> from autoresponse.messages import OriginalContext, ActionResult, ActionOutput
>>> ctx = OriginalContext(chat_id=1, message_id=2, interface_name="console")
>>> ActionOutput(original_context=ctx,
...              results=[ActionResult(action_type="terminal", output="ok")]).results[0].ok
True
"""

from autoresponse.messages.actions import (
    MAX_MESSAGE_CHARS,
    BaseAction,
    CommandAction,
    MessageAction,
    MessagePayload,
    action_key,
    action_model,
    action_models,
    canonical_action_type,
    message_action_for,
    parse_action,
    register_action,
    registry_generation,
    unregister_action,
)
from autoresponse.messages.context import (
    ChatId,
    OriginalContext,
    canonical_interface,
    register_interface,
    unregister_interface,
)
from autoresponse.messages.control import Crash, Exit, Failure, MalformedInput
from autoresponse.messages.envelope import Envelope
from autoresponse.messages.media import Attachment, AttachmentKind, Variant, attachments_label, human_size
from autoresponse.messages.pipeline import (
    ActionRequest,
    EventDue,
    LLMFailure,
    LLMReply,
    LLMRequest,
    OutboundMessage,
    Rejection,
    ReplyDelivered,
    SendReceipt,
    Usage,
    UserRequest,
)
from autoresponse.messages.prompt import Outcome, PromptRequest, ToolCall, Turn
from autoresponse.messages.system import ActionOutput, ActionResult, Batch, DueEvent, Position, SystemMessage

__all__ = [
    "MAX_MESSAGE_CHARS",
    "ActionOutput",
    "ActionRequest",
    "ActionResult",
    "Attachment",
    "AttachmentKind",
    "BaseAction",
    "Batch",
    "ChatId",
    "CommandAction",
    "Crash",
    "DueEvent",
    "Envelope",
    "EventDue",
    "Exit",
    "Failure",
    "LLMFailure",
    "LLMReply",
    "LLMRequest",
    "MalformedInput",
    "MessageAction",
    "MessagePayload",
    "OriginalContext",
    "Outcome",
    "OutboundMessage",
    "Position",
    "PromptRequest",
    "Rejection",
    "ReplyDelivered",
    "SendReceipt",
    "SystemMessage",
    "ToolCall",
    "Turn",
    "Usage",
    "UserRequest",
    "Variant",
    "action_key",
    "action_model",
    "action_models",
    "attachments_label",
    "canonical_action_type",
    "canonical_interface",
    "human_size",
    "message_action_for",
    "parse_action",
    "register_action",
    "register_interface",
    "registry_generation",
    "unregister_action",
    "unregister_interface",
]
