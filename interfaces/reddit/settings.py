"""Reddit's settings, and the limits of its API.

>>> RedditSettings(client_id="abc", client_secret="s", username="bot", password="pw").enabled
True
>>> RedditSettings().strangers
'silent'
"""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from autoresponse.actors.inbound import StrangerPolicy, StrangerSettings
from autoresponse.interfaces.credentials import given, listed, refuse_in_part, setting

#: Longest comment or private message body Reddit accepts. Counted in UTF-16 units,
#: which are never fewer than the characters Reddit counts, so a chunk always fits.
REDDIT_REPLY_UTF16 = 10_000
#: Seconds between two looks at the inbox.
REDDIT_POLL_SECONDS = 15.0
#: Unread inbox items taken per look (one listing page).
REDDIT_UNREAD_PER_POLL = 100
#: Attempts per chunk on network errors and 5xx (after asyncprawcore's own retries).
REDDIT_SEND_ATTEMPTS = 3
#: RATELIMIT errors waited out per chunk, and the longest such wait; beyond either the
#: reply is a dead letter.
REDDIT_MAX_RATELIMITS = 3
REDDIT_MAX_RATELIMIT_WAIT_SECONDS = 600.0
#: Seconds asyncprawcore waits for Reddit to answer one request.
REDDIT_TIMEOUT_SECONDS = 16.0
#: Longest pause a spent rate-limit budget imposes on every call (the inbox and every
#: reply). Reddit's budget renews every ten minutes, so an ``X-Ratelimit-Reset`` naming
#: more (a proxy's, a glitch's) is waited this long only, not for as long as it says.
REDDIT_MAX_RESET_WAIT_SECONDS = 600.0
#: A spent budget that holds every call back longer than this shows the interface as
#: failing (the status, ``/healthz``) until calls flow again. Reddit paces a budget that
#: is not spent by 10 s at most, and a poll comes every 15 s: a minute of silence is no
#: pacing any more but a stalled inbox and stalled replies, which an operator should see.
REDDIT_HOLD_REPORTED_SECONDS = 60.0

#: The settings that say the bot is meant to run: its credentials and whom it answers. Set
#: without the rest of the credentials, Reddit would stay off without a word, so they are an
#: error. Tuning (``poll_interval``, ``strangers``, ...) does not count: it works on its
#: defaults, and may sit in a shared file for a daemon that runs no Reddit bot.
_MEANT_TO_RUN = ("client_id", "client_secret", "username", "password", "refresh_token",
                 "allowed_users")


class RedditSettings(StrangerSettings):
    """On when an app (``client_id``, ``client_secret``) and an account (``username`` and
    ``password``, or a ``refresh_token``) are set; off when none of ``_MEANT_TO_RUN`` is,
    and an error when some are but not all it needs. Only ``allowed_users`` cause actions."""

    client_id: str | None = None
    client_secret: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    #: Instead of username and password: an OAuth refresh token of the account.
    refresh_token: SecretStr | None = None
    user_agent: str = "autoresponse:replies:v1 (an autonomous assistant)"
    #: Reddit's API hosts; a fake Reddit for tests is one base URL for both.
    oauth_url: str = "https://oauth.reddit.com"
    reddit_url: str = "https://www.reddit.com"
    #: Reddit usernames (without ``u/``), compared without regard to case.
    allowed_users: list[str] = Field(default_factory=list)
    strangers: StrangerPolicy = "silent"  # public platforms: strangers get no answer
    poll_interval: float = Field(default=REDDIT_POLL_SECONDS, gt=0)
    timeout: float = Field(default=REDDIT_TIMEOUT_SECONDS, gt=0)
    #: Seconds a spent rate-limit budget holds back every call at most (see above).
    max_reset_wait: float = Field(default=REDDIT_MAX_RESET_WAIT_SECONDS, gt=0)

    @model_validator(mode="after")
    def _a_bot_needs_every_credential(self) -> RedditSettings:
        """A bot meant to run (``_MEANT_TO_RUN``) without all it needs: ``refuse_in_part``."""
        if not self.enabled:
            refuse_in_part(self, _MEANT_TO_RUN, "Reddit needs more to log in: set {needed}", needed=self._needed())
        return self

    def _needed(self) -> str:
        """What is left to set, as variables and file keys, the account's alternative too."""
        app = [name for name in ("client_id", "client_secret") if not given(getattr(self, name))]
        account = [] if given(self.refresh_token) else [
            name for name in ("username", "password") if not given(getattr(self, name))]
        needed = listed([setting("reddit", name) for name in app + account])
        if account:
            instead = "the password" if account == ["password"] else "username and password"
            needed += f", or {setting('reddit', 'refresh_token')} instead of {instead}"
        return needed

    @property
    def enabled(self) -> bool:
        has_app = given(self.client_id) and given(self.client_secret)
        has_account = ((given(self.username) and given(self.password))
                       or given(self.refresh_token))
        return has_app and has_account

    def allows(self, username: str | None) -> bool:
        """Whether ``username`` is on the allowlist (Reddit names ignore case)."""
        return username is not None and username.lower() in {u.lower().removeprefix("u/")
                                                             for u in self.allowed_users}



