"""The outbound sender: one actor over a platform's delivery, for every platform that sends
over the network.

A platform writes the delivery (how to send one reply by its rules: chunking,
pacing, flood waits, threading) and gets the actor for free::

    class PagerDelivery:
        async def deliver(self, message: OutboundMessage) -> list[str]:
            ...                                    # the ids the platform gave the chunks
            raise Undeliverable("chat unreachable", "the pager is off")

    m.pipeline(ChildSpec("sender.pager", DeliverySender, (PagerDelivery(),)))

Each reply is handed to the event loop, so many go out at once; how it ended
comes back as a message. A reply that cannot be delivered is a dead letter with
its reason, never a crash (a blank one too: "nothing to send"), and whoever asked for a
receipt hears either way: an error the delivery did not foresee is one too ("delivery
failed", naming it), since a crash would cancel every other reply in flight and send them again. Only a journal that
cannot say whether a reply went out already (``LedgerUnavailable``) crashes it: its
restart tries the reply again once the journal is back, and nothing is lost.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.journal import LedgerUnavailable
from autoresponse.actors.receipts import send_receipt
from autoresponse.messages import Envelope, OutboundMessage
from autoresponse.messages.actions import is_blank

log = logging.getLogger("autoresponse.sender")


class Undeliverable(Exception):
    """A reply cannot be delivered; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Delivery(Protocol):
    async def deliver(self, message: OutboundMessage) -> list[Any]:
        """Send every chunk of ``message``; the platform's ids for them. Raises Undeliverable.

        A delivery may also have ``async def preview(message) -> None`` to show a reply
        while the LLM is still writing it (best effort, never raising)."""
        ...


class Delivered(BaseModel):
    model_config = ConfigDict(frozen=True)

    ids: tuple[str, ...]


class NotDelivered(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    detail: str


class DeliverySender(TypedActor):
    """Hands each reply to the delivery on the event loop; learns how it ended."""

    def __init__(self, delivery: Delivery) -> None:
        super().__init__()
        self.delivery = delivery

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        if message.preview:  # a reply still being written: shown if the platform can
            preview = getattr(self.delivery, "preview", None)
            if preview is not None:
                self.run_io(preview(message), cause=env)
            return
        self.run_io(self._deliver(message), cause=env)

    async def _deliver(self, message: OutboundMessage) -> Delivered | NotDelivered:
        if is_blank(message.text):  # every chunk would be dropped: no delivery, and no success
            return NotDelivered(reason="nothing to send",
                                detail=f"the reply to {message.chat_id} is blank: it would show nothing")
        try:
            return Delivered(ids=tuple(str(i) for i in await self.delivery.deliver(message)))
        except Undeliverable as exc:
            return NotDelivered(reason=exc.reason, detail=exc.detail)
        except LedgerUnavailable:
            raise  # the journal away, not the platform: the sender's restart tries the reply again
        except Exception as exc:  # unforeseen: this reply's dead letter, not the sender's crash
            log.exception("delivering a reply to %s failed", message.chat_id)
            return NotDelivered(reason="delivery failed", detail=f"{type(exc).__name__}: {exc}")

    @handles
    def on_delivered(self, done: Delivered, env: Envelope) -> None:
        send_receipt(self, env.body, env, ok=True)

    @handles
    def on_not_delivered(self, failed: NotDelivered, env: Envelope) -> None:
        self.runtime.dead_letters.post(env, failed.reason, actor=self.name, detail=failed.detail)
        send_receipt(self, env.body, env, ok=False, detail=f"{failed.reason}: {failed.detail}")
