"""Approvals on Telegram: Approve and Deny are inline keyboard buttons, and a press comes
back as a ``callback_query`` update.

The update is journaled like a message (its update_id is its correlation), then becomes
an ``ApprovalAnswer`` for the approvals desk, which decides who may answer. Whatever it
decides, the press is answered (``answerCallbackQuery``, with a refusal's text when it
was refused), and once the approval is decided its buttons are taken away
(``editMessageReplyMarkup``).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict
from telegram import Bot, CallbackQuery, Message
from telegram.error import TelegramError

from autoresponse.actors.approvals import parse_answer
from autoresponse.messages import OriginalContext, OutboundMessage
from autoresponse.messages.pipeline import Button
from autoresponse.messages.approval import ApprovalAnswer, ApprovalVerdict

log = logging.getLogger("autoresponse.telegram")

#: Characters of a callback's data kept to say why it was refused (Telegram allows 64 bytes).
_DATA_SHOWN = 80


class TelegramCallback(BaseModel):
    """A button of the bot's pressed: who pressed it, under which message, with what data."""

    model_config = ConfigDict(frozen=True)

    update_id: int
    callback_id: str
    user_id: int
    user_name: str | None = None
    data: str = ""
    #: The message the button was under (absent when Telegram no longer has it).
    chat_id: int | None = None
    chat_type: str | None = None
    chat_title: str | None = None
    message_id: int | None = None
    thread_id: int | None = None


def parse_callback(query: CallbackQuery, update_id: int) -> TelegramCallback:
    user = query.from_user
    message = query.message
    chat = message.chat if message is not None else None
    thread = message.message_thread_id if isinstance(message, Message) and message.is_topic_message else None
    return TelegramCallback(
        update_id=update_id, callback_id=query.id, user_id=user.id,
        user_name=user.username or user.full_name, data=query.data or "",
        chat_id=chat.id if chat is not None else None, chat_type=chat.type if chat is not None else None,
        chat_title=(chat.title or chat.username) if chat is not None else None,
        message_id=message.message_id if message is not None else None, thread_id=thread)


def answer_of(callback: TelegramCallback, interface_name: str, reply_to: str) -> ApprovalAnswer:
    """The desk's view of a press: an answer from this user, in the chat of the message."""
    context = OriginalContext(
        chat_id=callback.chat_id if callback.chat_id is not None else callback.user_id,
        message_id=callback.message_id, interface_name=interface_name, thread_id=callback.thread_id,
        user_id=callback.user_id, user_name=callback.user_name, chat_type=callback.chat_type,
        chat_title=callback.chat_title)
    parsed = parse_answer(callback.data)
    return ApprovalAnswer(
        approval_id=parsed[1] if parsed else None, approve=parsed[0] if parsed else False, context=context,
        callback_id=callback.callback_id, reply_to=reply_to, prompt_message_id=callback.message_id,
        malformed=None if parsed else f"callback data {callback.data[:_DATA_SHOWN]!r} is no approval's")


def keyboard(buttons: tuple[Button, ...]) -> dict[str, Any]:
    """An inline keyboard of one row."""
    return {"inline_keyboard": [[{"text": b.label, "callback_data": b.data} for b in buttons]]}


def markup_of(message: OutboundMessage) -> dict[str, Any] | None:
    return keyboard(message.buttons) if message.buttons else None


async def answer_callback(bot: Bot, verdict: ApprovalVerdict) -> None:
    """Answer the press (its text shows on the presser's screen; a refusal as an alert), and
    take the buttons away once the approval is decided. Best effort: a press Telegram
    no longer knows (answered too late) is only logged."""
    try:
        await bot.answer_callback_query(verdict.callback_id, text=verdict.text, show_alert=not verdict.accepted)
    except TelegramError as exc:
        log.info("a button press was not answered (%s)", exc)
    if verdict.settled and verdict.chat_id is not None and verdict.prompt_message_id is not None:
        try:  # with no markup: the keyboard goes
            await bot.edit_message_reply_markup(chat_id=verdict.chat_id, message_id=int(verdict.prompt_message_id))
        except TelegramError as exc:
            log.info("the buttons of a decided approval were not taken away (%s)", exc)
