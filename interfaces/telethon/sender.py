"""The userbot's sender actor: each reply is sent on the event loop, concurrently, in order
per chat; a flood wait in one chat holds back no other.

>>> runtime.send("sender.telethon", OutboundMessage.reply(ctx, "Done."))    # doctest: +SKIP
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.telethon.delivery import Undeliverable, UserbotDelivery
from autoresponse.messages import Envelope, OutboundMessage


class Sent(BaseModel):
    model_config = ConfigDict(frozen=True)

    message_ids: tuple[int, ...]


class NotSent(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    detail: str


class TelethonSender(TypedActor):
    """Hands each reply to the delivery on the event loop; learns how it ended."""

    def __init__(self, delivery: UserbotDelivery) -> None:
        super().__init__()
        self.delivery = delivery

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        self.run_io(self._deliver(message), cause=env)

    async def _deliver(self, message: OutboundMessage) -> Sent | NotSent:
        try:
            return Sent(message_ids=tuple(await self.delivery.deliver(message)))
        except Undeliverable as exc:
            return NotSent(reason=exc.reason, detail=exc.detail)

    @handles
    def on_sent(self, done: Sent, env: Envelope) -> None:
        send_receipt(self, env.body, env, ok=True)

    @handles
    def on_not_sent(self, failed: NotSent, env: Envelope) -> None:
        self.runtime.dead_letters.post(env, failed.reason, actor=self.name, detail=failed.detail)
        send_receipt(self, env.body, env, ok=False, detail=f"{failed.reason}: {failed.detail}")
