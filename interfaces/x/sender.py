"""The X sender actor: each reply is posted on the event loop, concurrently; one
waiting out a 429 holds back no other.

>>> runtime.send("sender.x", OutboundMessage.reply(ctx, "Done."))    # doctest: +SKIP
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.x.delivery import Undeliverable, XDelivery
from autoresponse.messages import Envelope, OutboundMessage


class Posted(BaseModel):
    model_config = ConfigDict(frozen=True)

    post_ids: tuple[int, ...]


class NotPosted(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    detail: str


class XSender(TypedActor):
    """Hands each reply to the delivery on the event loop; learns how it ended."""

    def __init__(self, delivery: XDelivery) -> None:
        super().__init__()
        self.delivery = delivery

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        self.run_io(self._deliver(message), cause=env)

    async def _deliver(self, message: OutboundMessage) -> Posted | NotPosted:
        try:
            return Posted(post_ids=tuple(await self.delivery.deliver(message)))
        except Undeliverable as exc:
            return NotPosted(reason=exc.reason, detail=exc.detail)

    @handles
    def on_posted(self, done: Posted, env: Envelope) -> None:
        send_receipt(self, env.body, env, ok=True)

    @handles
    def on_not_posted(self, failed: NotPosted, env: Envelope) -> None:
        self.runtime.dead_letters.post(env, failed.reason, actor=self.name, detail=failed.detail)
        send_receipt(self, env.body, env, ok=False, detail=f"{failed.reason}: {failed.detail}")
