"""The Reddit sender actor: each reply is posted on the event loop, concurrently; one
parked by a RATELIMIT error holds back no other.

>>> runtime.send("sender.reddit", OutboundMessage.reply(ctx, "Done."))    # doctest: +SKIP
"""

from __future__ import annotations

from autoresponse.actors.sender import DeliverySender


class RedditSender(DeliverySender):
    """The generic sender over the reddit delivery (``actors.sender``)."""
