"""What the LLM is asked, independent of any vendor's wire format.

>>> from autoresponse.messages.context import OriginalContext
>>> ctx = OriginalContext(chat_id=1, interface_name="console", original_command="hi")
>>> prompt = build_chat_request("hi", ctx, allowed_actions=["message_console"])
>>> [m["role"] for m in render_openai_messages(prompt)]
['system', 'user']
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autoresponse.messages.actions import full_json_instructions
from autoresponse.messages.context import OriginalContext
from autoresponse.messages.system import SystemMessage

DEFAULT_INSTRUCTION = (
    "You are synth, a helpful assistant inside a chat bot. You act only through the "
    "actions described below; the runtime carries them out and, for commands, shows you "
    "their output so that you can explain it to the user."
)

DELIVERY_INSTRUCTION = (
    "You are synth, a helpful assistant inside a chat bot. The runtime shows you a "
    "system_message with the result of an action the user asked for. Answer the user in "
    "that chat with a short, well formatted message that presents and comments on the "
    "result. Use only the message actions allowed below."
)


class Turn(BaseModel):
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


def _runtime_context(ctx: OriginalContext) -> dict[str, str]:
    now = dt.datetime.now(dt.timezone.utc).astimezone()
    return {"now": now.isoformat(timespec="seconds"), "interface": ctx.interface_name}


def build_chat_request(
    text: str,
    context: OriginalContext,
    *,
    allowed_actions: Iterable[str],
    turns: Iterable[Turn] = (),
    instruction: str = DEFAULT_INSTRUCTION,
) -> PromptRequest:
    """The prompt for a user's message: any configured action may answer it."""
    allowed = tuple(sorted(set(allowed_actions)))
    return PromptRequest(
        mode="chat",
        system_instruction=instruction,
        allowed_actions=allowed,
        full_json_instructions=full_json_instructions(allowed),
        turns=tuple(turns),
        current_text=text,
        runtime_context=_runtime_context(context),
        original_context=context,
    )


def build_delivery_request(
    system_message: SystemMessage,
    *,
    allowed_actions: Iterable[str],
    instruction: str = DELIVERY_INSTRUCTION,
) -> PromptRequest:
    """The prompt that hands a system message (output, event, error) to the LLM.

    The current text is the system message itself, as JSON, wrapped in a
    ``system_message`` key so that an echo of it is recognised and never run.
    """
    allowed = tuple(sorted(set(allowed_actions)))
    ctx = system_message.original_context
    payload = {"system_message": system_message.model_dump(mode="json", exclude_none=True)}
    return PromptRequest(
        mode="delivery",
        system_instruction=instruction,
        allowed_actions=allowed,
        full_json_instructions=full_json_instructions(allowed),
        current_text=json.dumps(payload, ensure_ascii=False),
        runtime_context=_runtime_context(ctx),
        original_context=ctx,
        system_message=system_message,
    )


def build_reask_request(
    prompt: PromptRequest,
    error: SystemMessage,
    *,
    carried_out: Iterable[str] = (),
    max_errors: int | None = None,
) -> PromptRequest:
    """The same turn asked again: the rejected reply and the error system message
    become the newest turns of the conversation."""
    errors = error.errors
    if max_errors is not None and len(errors) > max_errors:
        errors = (*errors[:max_errors], f"... and {len(errors) - max_errors} more errors")
    shown = error.model_copy(update={"errors": errors})
    payload = {"system_message": shown.model_dump(mode="json", exclude_none=True)}
    turns = (*prompt.turns, Turn(role="user", content=prompt.current_text),
             Turn(role="assistant", content=error.your_reply or ""))
    return prompt.model_copy(update={
        "turns": turns,
        "current_text": json.dumps(payload, ensure_ascii=False),
        "system_message": shown,
        "reask": prompt.reask + 1,
        "carried_out": tuple(carried_out),
    })


def render_openai_messages(prompt: PromptRequest) -> list[dict[str, str]]:
    """OpenAI-style chat messages for ``prompt``.

    In a chat turn the JSON instructions go in the system prompt; in a delivery
    turn they already travel inside the system message, so they are not repeated.
    """
    parts = [prompt.system_instruction]
    if prompt.system_message is None:
        parts.append(prompt.full_json_instructions)
    if prompt.runtime_context:
        parts.append("Runtime context: " + json.dumps(dict(prompt.runtime_context)))
    messages = [{"role": "system", "content": "\n\n".join(parts)}]
    messages.extend({"role": t.role, "content": t.content} for t in prompt.turns)
    messages.append({"role": "user", "content": prompt.current_text})
    return messages
