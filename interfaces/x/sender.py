"""The X sender actor: each reply is posted on the event loop, concurrently; one
waiting out a 429 holds back no other.

>>> runtime.send("sender.x", OutboundMessage.reply(ctx, "Done."))    # doctest: +SKIP
"""

from __future__ import annotations

from autoresponse.actors.sender import DeliverySender


class XSender(DeliverySender):
    """The generic sender over the x delivery (``actors.sender``)."""
