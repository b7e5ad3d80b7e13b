"""The console sender: prints replies, threaded to the message they answer."""

from __future__ import annotations

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.console.console import Console
from autoresponse.journal import DeliveryJournal
from autoresponse.messages import Envelope, OutboundMessage


class ConsoleSender(TypedActor):
    def __init__(self, console: Console, journal: DeliveryJournal | None = None) -> None:
        super().__init__()
        self.console = console
        self.journal = journal

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        key = f"{message.key}#0" if message.key and self.journal else None
        if key is None or not self.journal.was_sent(key):  # type: ignore[union-attr]
            tag = f"↳#{message.reply_to_message_id}" if message.reply_to_message_id is not None else ""
            self.console.write("bot" if not message.notice else "note", tag, message.text)
            if key is not None:
                # No need to wait: the journal commits in order, so this key is durable
                # before the item's `finish` is.
                self.journal.mark_sent(key)  # type: ignore[union-attr]
        send_receipt(self, message, env, ok=True)
