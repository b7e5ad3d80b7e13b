"""Cancelling a request, and approving a risky action before it runs.

A user's ``/cancel`` makes the conversation tell the actors that hold its work
(``CancelWork``: the LLM client aborts the call, an executor kills the command) and
the approvals desk (``CancelApprovals``). An action that needs approval goes from the
dispatcher to the desk (``ApprovalRequest``); the answer comes back from an interface
(``ApprovalAnswer``), the one who answered hears how it was taken (``ApprovalVerdict``),
and the decision becomes a turn of the chat (``ApprovalOutcome``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoresponse.messages.context import ChatId, OriginalContext
from autoresponse.messages.pipeline import ActionRequest


class CancelWork(BaseModel):
    """The work of these correlations was cancelled by its user: drop it (abort the LLM
    call, kill the command). Sent ahead of queued work, to every actor that handles it."""

    model_config = ConfigDict(frozen=True)

    chat: str
    correlations: tuple[str, ...]


class CancelApprovals(BaseModel):
    """A user cancelled in their chat: its pending approvals are called off. With
    ``confirm``, nothing else was under way, and the desk answers the user."""

    model_config = ConfigDict(frozen=True)

    context: OriginalContext
    confirm: bool = False


class ApprovalRequest(BaseModel):
    """An action that may run only once approved. ``key`` names it within its correlation
    (the turn and the action's place), so a replayed turn asks once."""

    model_config = ConfigDict(frozen=True)

    request: ActionRequest
    key: str


class ApprovalAnswer(BaseModel):
    """Someone pressed Approve or Deny (or typed ``/approve``, ``/deny``).

    ``context`` is where and who answered (its ``user_id``; a platform without user ids
    answers from the chat itself). ``approval_id`` None means the chat's latest pending
    approval. ``callback_id`` and ``reply_to``: the platform's callback to answer, by the
    actor named; without one the verdict is a notice in ``context``'s chat."""

    model_config = ConfigDict(frozen=True)

    approval_id: str | None
    approve: bool
    context: OriginalContext
    callback_id: str | None = None
    reply_to: str | None = None
    #: The message the buttons were under (its buttons are taken away once decided).
    prompt_message_id: ChatId | None = None
    #: The answer's raw data did not read as an approval (a forged callback).
    malformed: str | None = None


class ApprovalVerdict(BaseModel):
    """How an answer was taken, for the actor that received it to tell the one who
    answered (Telegram: answerCallbackQuery, and the buttons removed once decided)."""

    model_config = ConfigDict(frozen=True)

    callback_id: str
    text: str
    accepted: bool
    chat_id: ChatId | None = None
    prompt_message_id: ChatId | None = None
    #: The approval is decided (now or before): its buttons are of no more use.
    settled: bool = False


class ApprovalOutcome(BaseModel):
    """An approval was decided: run the action, or tell the LLM it was denied. A turn of
    the request's chat, in the chat's order."""

    model_config = ConfigDict(frozen=True)

    approval_id: str
    request: ActionRequest
    approved: bool
    #: Who decided (a user's name or id).
    by: str = ""
