from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from autoresponse.limits import TELEGRAM_POLL_TIMEOUT_SECONDS


class TelegramSettings(BaseModel):
    """On when a token is set. Only ``allowed_users`` can cause actions."""

    token: SecretStr | None = None
    #: python-telegram-bot's base_url: a local Bot API server or a fake ends in "/bot".
    base_url: str = "https://api.telegram.org/bot"
    allowed_users: list[int] = Field(default_factory=list)
    #: Parse mode of replies; a reply Telegram cannot parse is resent once as plain text.
    parse_mode: str | None = "Markdown"
    poll_timeout: int = Field(default=TELEGRAM_POLL_TIMEOUT_SECONDS, ge=0)

    @property
    def enabled(self) -> bool:
        return self.token is not None and bool(self.token.get_secret_value())
