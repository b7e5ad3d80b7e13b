"""The one place a python-telegram-bot ``Bot`` is built from the settings."""

from __future__ import annotations

from telegram import Bot

from autoresponse.interfaces.telegram.settings import TelegramSettings


def make_bot(settings: TelegramSettings) -> Bot:
    """A ``Bot`` for the configured token and Bot API; the interface and the sender share it."""
    if settings.token is None:
        raise ValueError("Telegram needs AUTORESPONSE_TELEGRAM__TOKEN")
    return Bot(settings.token.get_secret_value(), base_url=settings.base_url)
