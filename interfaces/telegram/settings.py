"""Telegram's settings, and the Bot API's limits.

>>> TelegramSettings(token="123:ABC", webhook_url="https://bot.example.com/telegram",
...                  webhook_secret="a-long-random-secret").webhook_listen
'127.0.0.1:8443'
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from autoresponse.actors.inbound import StrangerSettings
from autoresponse.interfaces.credentials import given, refuse_in_part, setting, stripped

#: Longest message, in UTF-16 code units as Telegram counts them.
TELEGRAM_MESSAGE_UTF16 = 4096
#: Telegram's flood limits: one message a second per chat, 30 a second overall,
#: 20 a minute per group.
TELEGRAM_CHAT_INTERVAL_SECONDS = 1.0
TELEGRAM_GLOBAL_PER_SECOND = 30
TELEGRAM_GROUP_PER_MINUTE = 20
#: Attempts per chunk on TimedOut/NetworkError, and waits on RetryAfter per chunk.
TELEGRAM_SEND_ATTEMPTS = 3
TELEGRAM_MAX_RETRY_AFTERS = 5
#: Seconds a getUpdates long poll waits for updates.
TELEGRAM_POLL_TIMEOUT_SECONDS = 10
#: Updates asked for per getUpdates call (Telegram's own maximum).
TELEGRAM_MAX_UPDATES = 100
#: The longest flood-control wait (RetryAfter) a reply waits out; a longer one parks it.
TELEGRAM_MAX_RETRY_AFTER_SECONDS = 60.0
#: Telegram sends in flight at once (Telegram takes 30 a second overall anyway);
#: more only grows the HTTP connection pool, which costs CPU per request.
TELEGRAM_MAX_CONCURRENT_SENDS = 32
#: Shortest chunk a reply is split into: it holds a code block's closing and reopened fence
#: (with its language) and some text. A "message is too long" for a chunk this short is
#: not believed: that reply is undeliverable.
TELEGRAM_MIN_CHUNK_UTF16 = 64
#: Chat migrations (a group upgraded to a supergroup) followed for one message: a group
#: migrates once; more is a loop.
TELEGRAM_MAX_MIGRATIONS = 2
#: What a withdrawn preview (a half reply taken back) is edited to say when Telegram will
#: not delete it: no half reply stays in the chat as if it were the answer.
TELEGRAM_PREVIEW_WITHDRAWN_TEXT = "(withdrawn: this reply was not sent)"
#: Largest webhook call body read; a larger one is answered 413 unread. A real update is a
#: few kilobytes (one quoting a 4096-unit message with its entities stays under 100 KB).
TELEGRAM_WEBHOOK_MAX_BYTES = 1024 * 1024
#: Telegram webhook calls whose bodies are being read at once; past this, a call is answered
#: 503 at once, unread. Telegram opens at most 40 connections to a webhook (setWebhook's
#: default max_connections, which the bot keeps) and sends each body at once, so it alone
#: never fills this: only callers with the secret dribbling bodies do, HTTP_IDLE_SECONDS
#: each at most.
TELEGRAM_WEBHOOK_MAX_BODIES_READ = 40
#: Where the webhook server listens unless told otherwise: loopback, behind a TLS proxy.
TELEGRAM_WEBHOOK_LISTEN = "127.0.0.1:8443"

#: The settings that say a bot is meant to run: its token, whom it answers and the webhook
#: Telegram posts to (its URL and secret). Set without a token, Telegram would stay off
#: without a word, so they are an error. The rest does not count: tuning (``parse_mode``,
#: ``strangers``, ``base_url``, ``webhook_listen``, ...) works on its defaults and may sit
#: in a shared file for a daemon that runs no bot.
_MEANT_TO_RUN = ("token", "allowed_users", "webhook_url", "webhook_secret")

#: What Telegram takes as a webhook's secret token.
_WEBHOOK_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_PORT = re.compile(r"[0-9]{1,5}")
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def listen_address(listen: str) -> tuple[str, int]:
    """``host:port`` as the host and the port to bind; ValueError for anything else.

    >>> listen_address("127.0.0.1:8443"), listen_address("[::1]:8443")
    (('127.0.0.1', 8443), ('::1', 8443))
    """
    host, colon, port = listen.rpartition(":")
    if not colon:
        raise ValueError(f"no port in {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)  # brackets hold an IPv6 address, nothing else
    elif re.fullmatch(r"[0-9.]+", host):
        ipaddress.IPv4Address(host)  # "999.1.1.1" is no address, and no name either
    elif not _HOSTNAME.fullmatch(host):  # "::1" unbracketed, "", a space, ...
        raise ValueError(f"no host name or address in {listen!r}")
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"no port from 1 to 65535 in {listen!r}")
    return host, int(port)


class TelegramSettings(StrangerSettings):
    """On when a token is set; off when none of ``_MEANT_TO_RUN`` is, and an error when
    some are but the token is not. Only ``allowed_users`` can cause actions; strangers get
    a short refusal (``strangers = "silent"``: nothing)."""

    token: SecretStr | None = None
    #: python-telegram-bot's base_url: a local Bot API server or a fake ends in "/bot".
    base_url: str = "https://api.telegram.org/bot"
    allowed_users: list[int] = Field(default_factory=list)
    #: A local Bot API server run with ``--local`` hands out files as paths on its machine:
    #: the directory it keeps them in (its ``--dir``), when this machine can read it. Files
    #: under it are read from disk; nothing outside it ever is. Unset: files are only
    #: downloaded by URL.
    local_files: Path | None = None
    #: Parse mode of replies; a reply Telegram cannot parse is resent once as plain text.
    parse_mode: str | None = "Markdown"
    poll_timeout: int = Field(default=TELEGRAM_POLL_TIMEOUT_SECONDS, ge=0)
    #: Answer edited messages as new requests (off: an edit is not a new request).
    edited_messages: bool = False
    #: A reply Telegram asks to hold back longer than this (flood control) is not waited
    #: for: it becomes a dead letter (replayable), and the chat's other replies go on.
    max_retry_after: float = Field(default=TELEGRAM_MAX_RETRY_AFTER_SECONDS, gt=0)
    #: The public https URL Telegram posts updates to (a TLS proxy in front forwards them to
    #: ``webhook_listen``, same path). Set: webhooks instead of getUpdates long polling.
    webhook_url: str | None = None
    #: ``host:port`` the webhook server binds: loopback, unless no proxy runs on this machine.
    webhook_listen: str = TELEGRAM_WEBHOOK_LISTEN
    #: Sent by Telegram with every webhook call (``X-Telegram-Bot-Api-Secret-Token``); a
    #: call without it is refused. Required with ``webhook_url``.
    webhook_secret: SecretStr | None = None

    _token = field_validator("token", mode="before")(stripped)

    @field_validator("webhook_url")
    @classmethod
    def _https_url(cls, url: str | None) -> str | None:
        """An https URL with a host, or None (empty too: long polling). Telegram posts to
        nothing else, so it is refused here rather than by setWebhook at start."""
        if url is None or not url.strip():
            return None
        try:
            parts: SplitResult | None = urlsplit(url)
            _ = parts.port  # raises ValueError for a port that is no number, or too big
        except ValueError:  # that, or an unclosed IPv6 bracket
            parts = None
        if (parts is None or parts.scheme != "https" or not parts.hostname or parts.fragment
                or any(c.isspace() or c in "{}" for c in url)):
            raise PydanticCustomError("https_url", "should be an https:// URL with a host, e.g. "
                                                   "https://bot.example.com/telegram")
        return url

    @field_validator("webhook_listen")
    @classmethod
    def _host_and_port(cls, listen: str) -> str:
        try:
            listen_address(listen)
        except ValueError:
            raise PydanticCustomError("host_port", "should be host:port with a port from 1 to 65535, "
                                                   "e.g. 127.0.0.1:8443 or [::1]:8443") from None
        return listen

    @field_validator("webhook_secret")
    @classmethod
    def _telegram_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        """Blank is no secret (as for the admin token); otherwise what Telegram accepts."""
        if secret is None or not secret.get_secret_value().strip():
            return None
        if not _WEBHOOK_SECRET.fullmatch(secret.get_secret_value()):
            raise PydanticCustomError("webhook_secret", "should be 1 to 256 characters of A-Z, a-z, "
                                                        "0-9, _ and -, as Telegram requires")
        return secret

    @model_validator(mode="after")
    def _webhook_needs_a_secret(self) -> TelegramSettings:
        """A webhook without a secret would take updates from anyone who finds its URL.

        Raised as a ValidationError located at ``webhook_url``, so the operator reads which
        variable or key switched webhooks on, and what is missing.
        """
        if self.webhook_url is not None and self.webhook_secret is None:
            missing = PydanticCustomError(
                "webhook_secret_missing",
                "webhook mode needs a secret too: set AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET "
                "([telegram] webhook_secret) to 1 to 256 characters of A-Z, a-z, 0-9, _ and -")
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=missing, loc=("webhook_url",), input=self.webhook_url)])
        return self

    @model_validator(mode="after")
    def _a_bot_needs_its_token(self) -> TelegramSettings:
        """A bot meant to run (``_MEANT_TO_RUN``) without all it needs: ``refuse_in_part``."""
        if not self.enabled:
            refuse_in_part(self, _MEANT_TO_RUN, "Telegram needs a bot token too: set {token} to the token "
                           "@BotFather gave the bot", token=setting("telegram", "token"))
        return self

    @property
    def enabled(self) -> bool:
        return given(self.token)

