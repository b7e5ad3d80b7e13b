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

    def fitted(self, context: OriginalContext) -> MessageTelegramBotAction:
        """A topic exists only in a group (a forum): in a reply to a private chat a topic
        means nothing (a small model copies the message id into it), so it is dropped.

        >>> from autoresponse.messages import OriginalContext
        >>> here = OriginalContext(chat_id=5, interface_name="telegram", chat_type="private")
        >>> action = MessageTelegramBotAction(type="message_telegram_bot",
        ...                                   payload={"text": "hi", "message_thread_id": 10005})
        >>> action.fitted(here).payload.message_thread_id is None
        True
        """
        to_origin = self.payload.target is None or str(self.payload.target) == str(context.chat_id)
        if self.payload.message_thread_id is None or not to_origin or context.is_group:
            return self
        return self.model_copy(update={"payload": self.payload.model_copy(update={"message_thread_id": None})})
