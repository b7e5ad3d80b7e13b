"""The Telegram interface: long polling with python-telegram-bot, embedded in our loop.

PTB's ``Bot`` runs on the runtime's event loop, in a polling task this actor
owns (never ``run_polling``: no thread, no signal handlers). Each update is
journaled before the next ``getUpdates`` offset acknowledges it, then becomes a
message in this actor's mailbox; authorization and addressing are decided here.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, ConfigDict
from telegram import Bot, Update
from telegram.error import TelegramError

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.backoff import Backoff, BackoffPolicy
from autoresponse.actors.routes import LLM, sender
from autoresponse.interfaces.telegram import INTERFACE_NAME, REFUSAL
from autoresponse.interfaces.telegram.settings import TelegramSettings
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, UserRequest

log = logging.getLogger("autoresponse.telegram")



class TelegramText(BaseModel):
    """A text message received by the bot."""

    model_config = ConfigDict(frozen=True)

    update_id: int
    chat_id: int
    chat_type: str
    message_id: int
    thread_id: int | None = None
    user_id: int | None = None
    user_name: str | None = None
    text: str
    #: In a group: the message mentions the bot or replies to one of its messages.
    addressed: bool = False


def parse_update(update: Update, bot_username: str | None, bot_id: int | None) -> TelegramText | None:
    message = update.effective_message
    if message is None or message.text is None or update.effective_chat is None:
        return None
    user = update.effective_user
    mentioned = bool(bot_username) and f"@{bot_username}".lower() in message.text.lower()
    replied = (message.reply_to_message is not None and message.reply_to_message.from_user is not None
               and message.reply_to_message.from_user.id == bot_id)
    return TelegramText(
        update_id=update.update_id,
        chat_id=update.effective_chat.id,
        chat_type=update.effective_chat.type,
        message_id=message.message_id,
        thread_id=message.message_thread_id if message.is_topic_message else None,
        user_id=user.id if user else None,
        user_name=(user.username or user.full_name) if user else None,
        text=message.text,
        addressed=mentioned or replied,
    )


#: Wait after failed getUpdates calls: 0.5 s, doubling, at most 30 s.
POLL_BACKOFF = BackoffPolicy(min=0.5, max=30.0, jitter=0.1)


class TelegramInterface(TypedActor):
    """Polls the Bot API in a task this incarnation owns; a crash or stop cancels it."""

    def __init__(self, settings: TelegramSettings, bot: Bot) -> None:
        super().__init__()
        self.settings = settings
        self._bot = bot  # shared with the sender; the platform initializes and shuts it down
        self._username: str | None = None

    def setup(self) -> None:
        self._username = self._bot.username
        self.runtime.io.run(self._bot.delete_webhook(), timeout=60)
        self.start_task(self._poll(), "getUpdates")
        log.info("polling Telegram as @%s", self._username)

    async def _poll(self) -> None:
        """Long polling that acknowledges an update (the next offset) only once it is journaled.

        PTB's Updater acknowledges as soon as it has queued updates, so a kill at the
        wrong moment would lose them; here the journal has them first.
        """
        bot = self._bot
        timeout = self.settings.poll_timeout
        offset: int | None = None
        failures = Backoff(POLL_BACKOFF)
        while True:
            try:
                updates = await bot.get_updates(offset=offset, timeout=timeout,
                                                read_timeout=timeout + 10, allowed_updates=["message"])
            except TelegramError as exc:
                delay = failures.next_delay()
                log.warning("getUpdates failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            failures.reset()
            for update in updates:
                parsed = parse_update(update, self._username, bot.id)
                if parsed is not None:
                    # One correlation per update: fetched again after a crash, it is recognised.
                    await asyncio.wrap_future(self.runtime.accept(
                        self.name, parsed, correlation_id=f"telegram-{bot.id}-{update.update_id}"))
                offset = update.update_id + 1

    @handles
    def on_text(self, text: TelegramText, env: Envelope) -> None:
        context = OriginalContext(
            chat_id=text.chat_id,
            message_id=text.message_id,
            interface_name=INTERFACE_NAME,
            original_command=text.text,
            thread_id=text.thread_id,
            user_id=text.user_id,
            user_name=text.user_name,
            chat_type=text.chat_type,
        )
        if context.is_group and not text.addressed:
            return  # group chatter not meant for the bot
        if text.user_id not in self.settings.allowed_users:
            log.info("refused a request from user %s in chat %s", text.user_id, text.chat_id)
            self.send(sender(INTERFACE_NAME), OutboundMessage.reply(context, REFUSAL, notice=True), cause=env)
            return
        request = text.text.replace(f"@{self._username}", "").strip() if self._username else text.text
        self.send(LLM, UserRequest(text=request, context=context), cause=env)
