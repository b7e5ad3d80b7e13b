"""The messages that flow between the pipeline's actors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoresponse.messages.actions import BaseAction
from autoresponse.messages.context import ChatId, OriginalContext
from autoresponse.messages.media import Attachment
from autoresponse.messages.prompt import PromptRequest, ToolCall, Turn
from autoresponse.messages.system import ActionOutput, ActionResult, Batch, DueEvent, Position, SystemMessage


class UserRequest(BaseModel):
    """A user's message, from an inbound interface (through its conversation) to the LLM
    client. The conversation adds the chat's recent ``turns``."""

    model_config = ConfigDict(frozen=True)

    text: str
    context: OriginalContext
    turns: tuple[Turn, ...] = ()
    #: What the message carried besides its text (its caption), by reference.
    attachments: tuple[Attachment, ...] = ()
    #: Messages sent together (a Telegram album) share this key; they are one turn.
    media_group: str | None = None


class LLMRequest(BaseModel):
    """A prompt for the LLM client to send."""

    model_config = ConfigDict(frozen=True)

    prompt: PromptRequest


class Usage(BaseModel):
    """Tokens one LLM call cost, as the server counted them."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class LLMReply(BaseModel):
    """The LLM's answer to a prompt, for the dispatcher to extract actions from: its text
    (reasoning already stripped off) and its native tool calls."""

    model_config = ConfigDict(frozen=True)

    prompt: PromptRequest
    text: str
    #: Native tool calls (the tools protocol); each names an action type.
    tool_calls: tuple[ToolCall, ...] = ()
    #: Its text was shown to the chat while it was written (see OutboundMessage.preview).
    previewed: bool = False
    #: What the call cost, when the server said.
    usage: Usage | None = None
    #: Which engine answered ("main", a fallback's name, "offline"), and its model.
    engine: str = ""
    model: str = ""
    #: Why the model stopped ("stop", "length", "tool_calls"), when the server said.
    finish_reason: str | None = None
    #: How it was asked: "tools", "json_schema" or "text".
    protocol: str = "text"


class LLMFailure(BaseModel):
    """The LLM could not be asked (HTTP error, timeout, quota)."""

    model_config = ConfigDict(frozen=True)

    prompt: PromptRequest
    error: str
    status: int | None = None
    #: Part of the reply was shown to the chat before the LLM failed: it is taken back.
    previewed: bool = False
    #: The request did not fit the model (HTTP 413, or its context window even after
    #: shrinking): the user is told it is too long, not that the model is away.
    too_long: bool = False


class ActionRequest(BaseModel):
    """A valid action for an executor to carry out."""

    model_config = ConfigDict(frozen=True)

    action: BaseAction
    context: OriginalContext
    #: Set when the reply held several actions, so their outputs are delivered together.
    batch: Batch | None = None

    def output(self, *results: ActionResult) -> ActionOutput:
        """The output of this action, for the auto-response builder."""
        return ActionOutput(original_context=self.context, results=results, batch=self.batch)


class Button(BaseModel):
    """A choice offered under a message (Telegram: an inline keyboard button; the console
    prints it): its label, and the data its answer carries back (``approve:<id>``)."""

    model_config = ConfigDict(frozen=True)

    label: str
    data: str


class OutboundMessage(BaseModel):
    """Text for a sender to deliver to a chat, threaded to the original message."""

    model_config = ConfigDict(frozen=True)

    context: OriginalContext
    chat_id: ChatId
    text: str
    reply_to_message_id: ChatId | None = None
    thread_id: ChatId | None = None
    #: True for the runtime's own notices (errors, refusals), False for LLM replies.
    notice: bool = False
    #: Names this reply within its correlation, the same when a resumed item is
    #: replayed; a sender appends the chunk number and skips chunks already sent.
    key: str | None = None
    #: The reply as far as the LLM has written it (a streamed reply): shown if the
    #: sender can, then replaced by the final message of the same ``key``; a preview
    #: with no text takes back what was shown (the final message will not come).
    preview: bool = False
    #: Choices offered under the message (an approval's Approve and Deny); a sender that
    #: cannot show buttons shows the text alone.
    buttons: tuple[Button, ...] = ()

    @classmethod
    def reply(cls, context: OriginalContext, text: str, *, notice: bool = False,
              chat_id: ChatId | None = None, key: str | None = None, preview: bool = False) -> OutboundMessage:
        """A reply to ``context``'s message, in its chat and topic unless ``chat_id`` says
        otherwise (then it is a new message there)."""
        same_chat = chat_id is None or str(chat_id) == str(context.chat_id)
        return cls(
            context=context,
            chat_id=context.chat_id if chat_id is None else chat_id,
            text=text,
            reply_to_message_id=context.message_id if same_chat else None,
            thread_id=context.thread_id if same_chat else None,
            notice=notice,
            key=key,
            preview=preview,
        )


class Rejection(BaseModel):
    """An LLM reply was (partly) invalid: the error system message, the prompt it
    answered, the actions of this turn already carried out, the messages already sent
    in it (``target`` and text), and what became of each place of the reply.
    Routed through the supervisor to a retry actor."""

    model_config = ConfigDict(frozen=True)

    prompt: PromptRequest
    message: SystemMessage
    carried_out: tuple[str, ...] = ()
    sent: tuple[tuple[str, str], ...] = ()
    positions: tuple[Position, ...] = ()
    #: The rejected reply's native tool calls (a re-ask answers them with tool turns).
    tool_calls: tuple[ToolCall, ...] = ()
    #: The reply stopped at its token limit before it parsed: one shorter re-ask at most.
    cut_off: bool = False


class ReplyDelivered(BaseModel):
    """A reply (not a notice) was confirmed sent: its conversation remembers it."""

    model_config = ConfigDict(frozen=True)

    context: OriginalContext
    text: str


class SendReceipt(BaseModel):
    """A sender's word on a reply whose context asked for a receipt."""

    model_config = ConfigDict(frozen=True)

    key: str
    ok: bool
    detail: str = ""


class EventDue(BaseModel):
    """A reminder fell due, for the builder to hand to the LLM."""

    model_config = ConfigDict(frozen=True)

    context: OriginalContext
    event: DueEvent
