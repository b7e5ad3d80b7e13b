"""The console sender: prints replies, threaded to the message they answer."""

from __future__ import annotations

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.journal import DeliveryJournal, SendLedger
from autoresponse.actors.receipts import send_receipt
from autoresponse.interfaces.console.console import TAKEN_BACK, Console
from autoresponse.messages import Envelope, OutboundMessage


class ConsoleSender(TypedActor):
    def __init__(self, console: Console, journal: DeliveryJournal | None = None) -> None:
        super().__init__()
        self.console = console
        self.ledger = SendLedger(journal)
        self._streamed: set[str] = set()  # keys of replies printed while they were written

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        tag = f"↳#{message.reply_to_message_id}" if message.reply_to_message_id is not None else ""
        if message.preview:  # the reply as far as the LLM has written it: printed as it grows
            if message.key and not self.ledger.already_sent(message, 0):
                self._preview(message, tag)
            return
        if not self.ledger.already_sent(message, 0):
            if message.key is not None and message.key in self._streamed:
                self.console.stream(message.key, "bot", tag, message.text, final=True)
            else:
                self.console.write("bot" if not message.notice else "note", tag, _with_buttons(message))
            self.ledger.confirm(message, 0)  # durable before the item's finish; no need to wait
        self._streamed.discard(message.key or "")
        send_receipt(self, message, env, ok=True)

    def _preview(self, message: OutboundMessage, tag: str) -> None:
        key = message.key or ""
        if not message.text:  # taken back: what was printed stays, marked as void
            if key in self._streamed:
                self._streamed.discard(key)
                self.console.write("note", tag, TAKEN_BACK)
            return
        if len(self._streamed) > 1_000:  # previews whose final reply never came
            self._streamed.clear()
        self._streamed.add(key)
        self.console.stream(key, "bot", tag, message.text, final=False)


def _with_buttons(message: OutboundMessage) -> str:
    """The text, and under it the answers its buttons stand for, as lines to type:
    ``approve:<id>`` is ``/approve <id>``."""
    if not message.buttons:
        return message.text
    choices = []
    for button in message.buttons:
        verb, _, rest = button.data.partition(":")
        choices.append(f"{button.label}: type /{verb} {rest}".rstrip())
    return message.text + "\n" + " · ".join(choices)
