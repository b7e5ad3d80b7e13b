"""The one place a python-telegram-bot ``Bot`` is built from the settings."""

from __future__ import annotations

import warnings

from telegram import Bot
from telegram.warnings import PTBUserWarning

from autoresponse.interfaces.telegram.media import file_base_url
from autoresponse.interfaces.telegram.request import READ_TIMEOUT_SECONDS, AiohttpRequest
from autoresponse.interfaces.telegram.settings import TelegramSettings

# getUpdates and sendMessage go through do_api_request on purpose, for their raw JSON (see
# TelegramInterface._poll and TelegramDelivery._send_message); PTB would warn about it.
warnings.filterwarnings("ignore", message=r"Please use 'Bot\.(getUpdates|sendMessage|editMessageText)'", category=PTBUserWarning)


def make_bot(settings: TelegramSettings) -> Bot:
    """A ``Bot`` for the configured token and Bot API, on aiohttp (see ``request``); the
    interface and the sender share it."""
    if settings.token is None:
        raise ValueError("Telegram needs AUTORESPONSE_TELEGRAM__TOKEN")
    files = file_base_url(settings.base_url)  # where getFile's paths are fetched (photos, voice, files)
    return Bot(settings.token.get_secret_value(), base_url=settings.base_url,
               **({"base_file_url": files} if files else {}),
               request=AiohttpRequest(),
               # long polls wait up to poll_timeout; one connection is all they need
               get_updates_request=AiohttpRequest(connections=1,
                                                  read_timeout=settings.poll_timeout + READ_TIMEOUT_SECONDS))
