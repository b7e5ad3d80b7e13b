"""The console sender: prints replies, threaded to the message they answer."""

from __future__ import annotations

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.console.console import Console
from autoresponse.messages import Envelope, OutboundMessage


class ConsoleSender(TypedActor):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        tag = f"↳#{message.reply_to_message_id}" if message.reply_to_message_id is not None else ""
        self.console.write("bot" if not message.notice else "note", tag, message.text)
        send_receipt(self, message, env, ok=True)
