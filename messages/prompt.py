"""What the LLM is asked, independent of any vendor's wire format (models only).

Building prompts and rendering them for a vendor lives next to the LLM client,
in ``autoresponse.actors.prompts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autoresponse.messages.context import OriginalContext
from autoresponse.messages.system import SystemMessage


class Turn(BaseModel):
    """One earlier message of the conversation."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant"]
    content: str


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
    #: The messages already sent in this turn (target, text): a re-ask that says one
    #: again, even reworded, does not send it twice.
    sent: tuple[tuple[str, str], ...] = ()
    #: The LLM may answer with no action at all (an event or autonomous turn).
    may_stay_silent: bool = False
