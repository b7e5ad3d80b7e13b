"""The ``message_telegram_bot`` action, with the forum topic it may post in."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from autoresponse.messages import MessageAction, MessagePayload, OriginalContext


class TelegramMessagePayload(MessagePayload):
    message_thread_id: int | None = Field(
        default=None, description="The forum topic to post in; omit to answer in the original topic.")


class MessageTelegramBotAction(MessageAction):
    """Reply in a Telegram chat through the bot."""

    interface: ClassVar[str | None] = "telegram"

    type: Literal["message_telegram_bot"]
    payload: TelegramMessagePayload

    def check(self, context: OriginalContext) -> str:
        """A topic exists only in a group (a forum): not in a private chat."""
        to_origin = self.payload.target is None or str(self.payload.target) == str(context.chat_id)
        if self.payload.message_thread_id is not None and to_origin and not context.is_group:
            return (f"{self.type}: message_thread_id names a forum topic, and this is a "
                    f"{context.chat_type or 'private'} chat; omit it")
        return ""
