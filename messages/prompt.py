"""What the LLM is asked, independent of any vendor's wire format (models only).

Building prompts and rendering them for a vendor lives next to the LLM client,
in ``autoresponse.actors.prompts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autoresponse.messages.context import OriginalContext
from autoresponse.messages.media import Attachment
from autoresponse.messages.system import Position, SystemMessage


class ToolCall(BaseModel):
    """One native tool call of an LLM reply: the tool is an action type, the arguments
    its payload as the model wrote it (JSON text, unparsed until the extractor reads it)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class Turn(BaseModel):
    """One earlier message of the conversation.

    In the tools protocol an assistant turn may carry the ``tool_calls`` it made, and a
    ``tool`` turn answers one of them by ``tool_call_id`` (a re-ask says there what
    became of each call).
    """

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


#: What already became of the request a delivery turn answers (``PromptRequest.outcome``).
Outcome = Literal["done", "failed", "running", "denied"]


class PromptRequest(BaseModel):
    """One question to the LLM: a chat turn or a delivery turn."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["chat", "delivery"]
    system_instruction: str
    allowed_actions: tuple[str, ...]
    full_json_instructions: str
    turns: tuple[Turn, ...] = ()
    current_text: str
    runtime_context: Mapping[str, str] = {}
    original_context: OriginalContext
    #: The system message a delivery turn answers; None in a chat turn.
    system_message: SystemMessage | None = None
    #: How many times the LLM was re-asked for this turn after invalid replies.
    reask: int = 0
    #: Keys (``action_key``) of the actions already carried out for this turn, so a
    #: re-ask that repeats one never runs or delivers it twice.
    carried_out: tuple[str, ...] = ()
    #: The messages already sent in this turn (target, text).
    sent: tuple[tuple[str, str], ...] = ()
    #: In a re-ask: each action of the rejected reply, carried out or rejected. The
    #: answer replaces only rejected places; a message for a place already delivered
    #: is dropped whatever its wording, and an empty answer means "nothing more".
    positions: tuple[Position, ...] = ()
    #: The LLM may answer with no action at all (an event or autonomous turn).
    may_stay_silent: bool = False
    #: In a delivery turn, what already became of the request it answers, for what its user
    #: hears should the turn give up: its actions ran and succeeded ("done"), ran and failed
    #: or were refused ("failed"), are still running ("running"), or one was denied its
    #: approval ("denied"). None in a chat turn, and a reminder's.
    outcome: Outcome | None = None
    #: What the user's message carried besides its text (a chat turn); read in the LLM hop.
    attachments: tuple[Attachment, ...] = ()
