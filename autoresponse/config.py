"""Settings: environment (AUTORESPONSE_..., nested with __), an optional TOML file, defaults.

>>> import os
>>> os.environ["AUTORESPONSE_TERMINAL__ENABLED"] = "true"
>>> Settings.load().terminal.enabled
True
>>> del os.environ["AUTORESPONSE_TERMINAL__ENABLED"]

Priority, highest first: explicit arguments, environment, the TOML file given
with ``--config``, the caller's defaults (``autoresponse demo`` enables a small
terminal allowlist), then the built-in defaults.

The core sections are below; every registered platform adds its own section,
named after it, with its own settings model (``Settings()`` builds the class
that holds them all).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, create_model
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

import autoresponse.interfaces  # noqa: F401  (registers the built-in platforms)
from autoresponse.actors.backoff import BackoffPolicy
from autoresponse.actors.limits import (
    DRAIN_SECONDS,
    JOURNAL_RETENTION_SECONDS,
    LLM_CONNECT_TIMEOUT_SECONDS,
    LLM_MAX_ATTEMPTS,
    LLM_MAX_IN_FLIGHT,
    LLM_READ_TIMEOUT_SECONDS,
    MAILBOX_CAPACITY,
    MAX_HOPS,
    MAX_RESTARTS,
    MESSAGE_ATTEMPTS,
    RESTART_BACKOFF_JITTER,
    RESTART_BACKOFF_MAX_SECONDS,
    RESTART_BACKOFF_MIN_SECONDS,
    RESTART_BACKOFF_RESET_SECONDS,
    RESTART_PERIOD_SECONDS,
)
from autoresponse.actors.retry import RetrySettings
from autoresponse.supervisors import Platform, RestartIntensity, platforms

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("config_file", default=None)
_defaults: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("defaults", default={})


class LLMSettings(BaseModel):
    """Without ``base_url`` the built-in offline engine answers."""

    base_url: str | None = None
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    connect_timeout: float = Field(default=LLM_CONNECT_TIMEOUT_SECONDS, gt=0)
    read_timeout: float = Field(default=LLM_READ_TIMEOUT_SECONDS, gt=0)
    max_attempts: int = Field(default=LLM_MAX_ATTEMPTS, ge=1)
    max_in_flight: int = Field(default=LLM_MAX_IN_FLIGHT, ge=1)
    temperature: float | None = None


class RuntimeSettings(BaseModel):
    max_hops: int = Field(default=MAX_HOPS, ge=1)
    mailbox_capacity: int = Field(default=MAILBOX_CAPACITY, ge=1)
    drain_seconds: float = Field(default=DRAIN_SECONDS, ge=0)


class SupervisionSettings(BaseModel):
    """Restart intensity and backoff of every supervisor of the tree."""

    max_restarts: int = Field(default=MAX_RESTARTS, ge=0)
    period: float = Field(default=RESTART_PERIOD_SECONDS, gt=0)
    backoff_min: float = Field(default=RESTART_BACKOFF_MIN_SECONDS, ge=0)
    backoff_max: float = Field(default=RESTART_BACKOFF_MAX_SECONDS, ge=0)
    backoff_jitter: float = Field(default=RESTART_BACKOFF_JITTER, ge=0, le=1)
    backoff_reset: float = Field(default=RESTART_BACKOFF_RESET_SECONDS, ge=0)
    #: Times a message is handed to actors that crash on it before it is a dead letter.
    message_attempts: int = Field(default=MESSAGE_ATTEMPTS, ge=1)

    def intensity(self) -> RestartIntensity:
        return RestartIntensity(self.max_restarts, self.period)

    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.backoff_min, self.backoff_max, self.backoff_jitter,
                             self.backoff_reset)


class AdminSettings(BaseModel):
    """The admin HTTP endpoint: loopback by default; any other bind needs a token."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    token: SecretStr | None = None

    @property
    def url(self) -> str:
        """Where a client on this machine reaches it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"


class JournalSettings(BaseModel):
    """The delivery journal: ``<data_dir>/journal.sqlite3`` unless a path is given."""

    enabled: bool = True
    path: Path | None = None
    #: Finished work (and its send keys) is forgotten after this long.
    retention_seconds: float = Field(default=JOURNAL_RETENTION_SECONDS, ge=0)


def _secret_values(value: Any) -> Iterator[str]:
    """Every secret inside a settings value: SecretStr values and URL credentials."""
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secret_values(getattr(value, name))
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _secret_values(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _secret_values(item)
    elif isinstance(value, str) and "@" in value and "://" in value:
        parts = urlsplit(value)
        if parts.password:
            yield parts.password
        if parts.username:
            yield f"{parts.username}:{parts.password}" if parts.password else parts.username


class Settings(BaseSettings):
    """Every setting of the runtime, the core sections and one per registered platform."""

    model_config = SettingsConfigDict(
        env_prefix="AUTORESPONSE_", env_nested_delimiter="__", extra="ignore"
    )

    llm: LLMSettings = LLMSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    supervision: SupervisionSettings = SupervisionSettings()
    retry: RetrySettings = RetrySettings()
    admin: AdminSettings = AdminSettings()
    journal: JournalSettings = JournalSettings()
    data_dir: Path = Path("~/.local/share/autoresponse")
    log_level: str = "INFO"

    def __new__(cls, *args: Any, **kwargs: Any) -> Settings:
        # ``Settings()`` means the settings of every registered platform too.
        target = _with_platforms(platforms()) if cls is Settings else cls
        return super().__new__(target)

    @classmethod
    def load(cls, config_file: str | Path | None = None, *,
             defaults: dict[str, Any] | None = None, **overrides: Any) -> Settings:
        """Settings from every source; ``config_file`` is a TOML file."""
        if config_file is not None and not Path(config_file).is_file():
            raise FileNotFoundError(f"config file not found: {config_file}")
        file_token = _config_file.set(Path(config_file) if config_file else None)
        defaults_token = _defaults.set(defaults or {})
        try:
            return cls(**overrides)
        finally:
            _config_file.reset(file_token)
            _defaults.reset(defaults_token)

    def section(self, name: str) -> Any:
        """The settings of the platform (or core section) called ``name``."""
        return getattr(self, name)

    def secrets(self) -> list[str]:
        """Every secret configured anywhere (for redaction): SecretStr values, URL
        credentials, and what platforms name as secrets."""
        found = set(_secret_values(self))
        for platform in platforms():
            section = getattr(self, platform.name, None)
            if section is not None:
                found.update(s for s in platform.secrets(section) if s)
        return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)

    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file.get()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        defaults = _defaults.get()
        if defaults:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=defaults))
        return tuple(sources)


@lru_cache(maxsize=16)
def _with_platforms(registered: tuple[Platform, ...]) -> type[Settings]:
    """The Settings class with one section per registered platform."""
    sections: dict[str, Any] = {p.name: (p.settings, Field(default_factory=p.settings)) for p in registered}
    return create_model("Settings", __base__=Settings, __module__=__name__, **sections)
