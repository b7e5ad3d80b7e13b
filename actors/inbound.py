"""What every inbound interface does with a message it has read: refuse a stranger,
or hand the request to its conversation.

>>> take_request(self, text, context, env, allowed=user in allowlist,
...              policy=self.settings)                              # doctest: +SKIP

A platform's settings inherit ``StrangerSettings`` for the two knobs (what a
stranger gets, and the words of the refusal); nothing runs for a stranger either way.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel

from autoresponse.actors.actor import TypedActor
from autoresponse.actors.routes import CONVERSATIONS, sender
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, UserRequest

log = logging.getLogger("autoresponse.inbound")

REFUSAL = "Sorry, I only take requests from people on my allowlist."

#: What a request from someone not on the allowlist gets: nothing, or a short refusal.
StrangerPolicy = Literal["silent", "refuse"]


class StrangerSettings(BaseModel):
    """The part of a platform's settings that says how strangers are answered."""

    strangers: StrangerPolicy = "refuse"
    refusal: str = REFUSAL


def take_request(actor: TypedActor, text: str, context: OriginalContext, env: Envelope, *,
                 allowed: bool, policy: StrangerSettings) -> None:
    """Start a turn for ``text`` in its chat's conversation, or turn a stranger away."""
    if not allowed:
        log.info("refused a request from %s in %s chat %s: not on the allowlist",
                 context.user_name or context.user_id, context.interface_name, context.chat_id)
        if policy.strangers == "refuse":
            actor.send(sender(context.interface_name),
                       OutboundMessage.reply(context, policy.refusal, notice=True), cause=env)
        return
    actor.send(CONVERSATIONS, UserRequest(text=text, context=context), cause=env)
