"""Telegram: an interface on python-telegram-bot, a sender with Telegram's rules,
and a fake Bot API server for tests."""

from autoresponse.interfaces.telegram.chunking import split_message, utf16_len
from autoresponse.interfaces.telegram.delivery import TelegramDelivery, Undeliverable
from autoresponse.interfaces.telegram.interface import (
    INTERFACE_NAME,
    REFUSAL,
    TelegramInterface,
    TelegramText,
)
from autoresponse.interfaces.telegram.sender import TelegramSender
from autoresponse.interfaces.telegram.settings import TelegramSettings

__all__ = ["INTERFACE_NAME", "REFUSAL", "TelegramDelivery", "TelegramInterface", "TelegramSender",
           "TelegramSettings", "TelegramText", "Undeliverable", "split_message", "utf16_len"]
