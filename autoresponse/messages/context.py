"""Where a request came from; it travels unchanged to the final send."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

ChatId = int | str


class OriginalContext(BaseModel):
    """The coordinates of the user's original message.

    >>> ctx = OriginalContext(chat_id=42, message_id=7, interface_name="console",
    ...                       original_command="run df -h")
    >>> ctx.chat_id, ctx.message_id
    (42, 7)
    """

    model_config = ConfigDict(frozen=True)

    chat_id: ChatId
    message_id: ChatId | None = None
    interface_name: str
    original_command: str = ""
    thread_id: ChatId | None = None
    user_id: ChatId | None = None
    user_name: str | None = None
    chat_type: str | None = None
    #: An actor to tell (with ``receipt_key``) once the final reply is confirmed sent,
    #: or has failed for good; e.g. the event scheduler, which marks a reminder
    #: delivered only then.
    receipt_to: str | None = None
    receipt_key: str | None = None

    @property
    def is_group(self) -> bool:
        return self.chat_type in ("group", "supergroup")
