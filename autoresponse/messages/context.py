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
