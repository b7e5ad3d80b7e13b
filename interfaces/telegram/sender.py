"""The Telegram sender actor: replies go out concurrently, in order per chat."""

from __future__ import annotations

from autoresponse.actors.sender import DeliverySender


class TelegramSender(DeliverySender):
    """The generic sender over the telegram delivery (``actors.sender``)."""
