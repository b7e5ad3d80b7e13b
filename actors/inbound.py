"""What every inbound interface does with a message it has read: accept it durably
(``accept_input``), then hand it to its conversation, or answer a stranger as the
platform's settings say.

>>> await accept_input(self, update, f"telegram-{update_id}")     # doctest: +SKIP
>>> take_request(self, text, context, env, allowed=user in allowlist,
...              policy=self.settings)                              # doctest: +SKIP

A platform's settings inherit ``StrangerSettings`` for the two knobs: what a
stranger gets, and the words of the refusal. ``converse`` gives a stranger an
*autonomous* turn: the bot may reply or stay silent, and may use only the actions
configured for autonomous turns (none but replying, by default).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import BaseModel

from autoresponse.actors.kernel.actor import TypedActor
from autoresponse.actors.kernel.intake import Unstorable
from autoresponse.actors.limits import MALFORMED_KEPT
from autoresponse.actors.routes import CONVERSATIONS, sender
from autoresponse.messages import Attachment, Envelope, MalformedInput, OriginalContext, OutboundMessage, UserRequest

log = logging.getLogger("autoresponse.inbound")

REFUSAL = "Sorry, I only take requests from people on my allowlist."

#: What a request from someone not on the allowlist gets: nothing, a short refusal, or an
#: autonomous turn (a reply the bot may also leave unsaid; no commands unless configured).
StrangerPolicy = Literal["silent", "refuse", "converse"]


class StrangerSettings(BaseModel):
    """The part of a platform's settings that says how strangers are answered."""

    strangers: StrangerPolicy = "refuse"
    refusal: str = REFUSAL


def take_request(actor: TypedActor, text: str, context: OriginalContext, env: Envelope, *,
                 allowed: bool, policy: StrangerSettings, attachments: tuple[Attachment, ...] = (),
                 media_group: str | None = None) -> None:
    """Start a turn for ``text`` (and what the message carried besides, by reference) in its
    chat's conversation, or answer a stranger by ``policy``."""
    turn = turn_context(context, allowed=allowed, policy=policy)
    if turn is None:
        log.info("refused a request from %s in %s chat %s: not on the allowlist",
                 context.user_name or context.user_id, context.interface_name, context.chat_id)
        if policy.strangers == "refuse":
            actor.send(sender(context.interface_name),
                       OutboundMessage.reply(context, policy.refusal, notice=True), cause=env)
        return
    actor.send(CONVERSATIONS, UserRequest(text=text, context=turn, attachments=attachments,
                                          media_group=media_group), cause=env)


def turn_context(context: OriginalContext, *, allowed: bool,
                 policy: StrangerSettings) -> OriginalContext | None:
    """The context a request from ``context``'s sender gets a turn in: ``context`` for an
    allowed user, made autonomous for a stranger under ``converse``; None for a stranger
    refused or ignored (no turn). ``take_request`` decides by it, and so does a platform's
    origin (``Mount.origin``): only whoever gets a turn hears that their input failed."""
    if allowed:
        return context
    if policy.strangers == "converse":
        return context.model_copy(update={"autonomous": True})
    return None


async def accept_input(actor: TypedActor, item: BaseModel, correlation_id: str) -> bool:
    """Accept one input of ``actor``'s platform durably, on the loop, waiting while the
    runtime is full; True once it is (acknowledge it upstream then). One correlation
    per input: seen again after a crash, it is recognised.

    An input that cannot be stored (not valid Unicode) is malformed: a dead letter
    with the reason, and False; acknowledge it too, or it comes back forever.
    """
    try:
        await actor.runtime.intake.accept_async(actor.name, item, correlation_id)
    except Unstorable as exc:
        log.warning("a malformed input to %s was skipped (%s)", actor.name, exc)
        actor.runtime.dead_letters.post(Envelope.new(item), "malformed input", actor=actor.name, detail=str(exc))
        return False
    return True


def dead_letter_malformed(actor: TypedActor, raw: Any, reason: str, why: str) -> None:
    """Dead-letter one input that cannot be read (``reason``: ``"malformed update"``, ...),
    with ``why`` and the input as the platform sent it (JSON), so that the inputs behind it
    flow on. The caller still acknowledges it (an offset, marked read, a cursor moved past
    it), or it comes back forever."""
    try:
        kept = json.dumps(raw, ensure_ascii=False, default=repr)[:MALFORMED_KEPT]
    except (ValueError, RecursionError):  # nested past what json writes, or circular
        kept = repr(raw)[:MALFORMED_KEPT]
    log.warning("%s at %s was skipped (%s)", reason, actor.name, why)
    actor.runtime.dead_letters.post(Envelope.new(MalformedInput(raw=kept)), reason, actor=actor.name,
                                    detail=why)
