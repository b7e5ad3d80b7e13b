"""The Telegram interface: long polling with python-telegram-bot, embedded in our loop.

PTB's Application runs on the runtime's event loop (initialize, start,
``updater.start_polling``), never with ``run_polling``: it owns no thread and
no signal handlers. Each text message becomes a message in this actor's
mailbox; authorization and addressing are decided here.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, ConfigDict
from telegram import Update
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.routes import LLM, sender
from autoresponse.interfaces.telegram.settings import TelegramSettings
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, UserRequest

log = logging.getLogger("autoresponse.telegram")

INTERFACE_NAME = "telegram"
REFUSAL = "Sorry, I only take requests from people on my allowlist."


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


class TelegramInterface(TypedActor):
    def __init__(self, settings: TelegramSettings) -> None:
        super().__init__()
        self.settings = settings
        self._ptb: Application | None = None  # type: ignore[type-arg]
        self._username: str | None = None

    def setup(self) -> None:
        assert self.settings.token is not None
        timeout = self.settings.poll_timeout
        self._ptb = (
            ApplicationBuilder()
            .token(self.settings.token.get_secret_value())
            .base_url(self.settings.base_url)
            .get_updates_read_timeout(timeout + 10)
            .build()
        )
        self._ptb.add_handler(MessageHandler(filters.TEXT, self._on_update))
        self.runtime.io.run(self._start_polling(timeout), timeout=60)

    async def _start_polling(self, timeout: int) -> None:
        assert self._ptb is not None
        await self._ptb.initialize()
        self._username = self._ptb.bot.username
        await self._ptb.start()
        assert self._ptb.updater is not None
        await self._ptb.updater.start_polling(timeout=timeout, allowed_updates=["message"])
        log.info("polling Telegram as @%s", self._username)

    def teardown(self) -> None:
        if self._ptb is not None and self.runtime.io.running:
            self.runtime.io.run(self._stop_polling(), timeout=30)
        self._ptb = None

    async def _stop_polling(self) -> None:
        assert self._ptb is not None
        if self._ptb.updater is not None and self._ptb.updater.running:
            await self._ptb.updater.stop()
        if self._ptb.running:
            await self._ptb.stop()
        await self._ptb.shutdown()

    async def _on_update(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Runs on the event loop: hand the message to this actor, nothing more."""
        assert self._ptb is not None
        parsed = parse_update(update, self._username, self._ptb.bot.id)
        if parsed is not None:
            await asyncio.wrap_future(self.runtime.accept(self.name, parsed))  # journaled first

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
