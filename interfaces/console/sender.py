"""The console sender: prints replies, threaded to the message they answer."""

from __future__ import annotations

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.console.console import Console
from autoresponse.messages import Envelope, OutboundMessage


class ConsoleSender(TypedActor):
    def __init__(self, console: Console, journal: DeliveryJournal | None = None) -> None:
        super().__init__()
        self.console = console
        self.ledger = SendLedger(journal)

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        if not self.ledger.already_sent(message, 0):
            tag = f"↳#{message.reply_to_message_id}" if message.reply_to_message_id is not None else ""
            self.console.write("bot" if not message.notice else "note", tag, message.text)
            self.ledger.confirm(message, 0)  # durable before the item's finish; no need to wait
        send_receipt(self, message, env, ok=True)
