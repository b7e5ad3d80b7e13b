"""The Telegram sender actor: replies go out concurrently, in order per chat."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.telegram.delivery import TelegramDelivery, Undeliverable
from autoresponse.messages import Envelope, OutboundMessage


class Delivered(BaseModel):
    model_config = ConfigDict(frozen=True)

    message_ids: tuple[int, ...]


class NotDelivered(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    detail: str


class TelegramSender(TypedActor):
    """Hands each reply to the delivery on the event loop; learns how it ended."""

    def __init__(self, delivery: TelegramDelivery) -> None:
        super().__init__()
        self.delivery = delivery

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        self.run_io(self._deliver(message), cause=env)

    async def _deliver(self, message: OutboundMessage) -> Delivered | NotDelivered:
        try:
            return Delivered(message_ids=tuple(await self.delivery.deliver(message)))
        except Undeliverable as exc:
            return NotDelivered(reason=exc.reason, detail=exc.detail)

    @handles
    def on_delivered(self, done: Delivered, env: Envelope) -> None:
        send_receipt(self, env.body, env, ok=True)

    @handles
    def on_not_delivered(self, failed: NotDelivered, env: Envelope) -> None:
        self.runtime.dead_letters.post(env, failed.reason, actor=self.name, detail=failed.detail)
        send_receipt(self, env.body, env, ok=False, detail=f"{failed.reason}: {failed.detail}")
