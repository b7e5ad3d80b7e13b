"""The userbot's sender actor: each reply is sent on the event loop, concurrently, in order
per chat; a flood wait in one chat holds back no other.

>>> runtime.send("sender.telethon", OutboundMessage.reply(ctx, "Done."))    # doctest: +SKIP
"""

from __future__ import annotations

from autoresponse.actors.sender import DeliverySender


class TelethonSender(DeliverySender):
    """The generic sender over the telethon delivery (``actors.sender``)."""
