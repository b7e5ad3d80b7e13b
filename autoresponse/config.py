"""Settings: environment (AUTORESPONSE_..., nested with __), an optional TOML file, defaults.

>>> import os
>>> os.environ["AUTORESPONSE_TERMINAL__ENABLED"] = "true"
>>> Settings.load().terminal.enabled
True
>>> del os.environ["AUTORESPONSE_TERMINAL__ENABLED"]

Priority, highest first: explicit arguments, environment, the TOML file given
with ``--config``, the caller's defaults (``autoresponse demo`` enables a small
terminal allowlist), then the built-in defaults.

``Settings.load`` is strict, because a typo must not silently mean "the
default": a TOML file that does not parse, a key that no model has (in the file
or as an ``AUTORESPONSE_`` variable) and a value that does not validate each
raise ``ConfigError``, whose message is one line that names the variable or the
file's ``[section] key``, says what was expected and never shows a secret. Keys
are checked inside a variable's JSON value (``AUTORESPONSE_TELEGRAM='{...}'``) and
in lists of tables (``[[llm.fallbacks]]``) too; a JSON value that does not parse is
named, never shown. A variable cannot name a list's item
(``AUTORESPONSE_LLM__FALLBACKS__0__MODEL``): it is refused, saying that a list is set
whole, as JSON, in the list's own variable (``AUTORESPONSE_LLM__FALLBACKS``) or the file.

The core sections are below; every registered platform adds its own section,
named after it, with its own settings model (``Settings()`` builds the class
that holds them all).
"""

from __future__ import annotations

import contextvars
import difflib
import json
import math
import os
import re
import threading
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import SplitResult, urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SecretBytes,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError, to_jsonable_python
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

import autoresponse.interfaces  # noqa: F401  (registers the built-in platforms)
from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.limits import (
    APPROVAL_TIMEOUT_SECONDS,
    BATCH_WAIT_SECONDS,
    DRAIN_SECONDS,
    JOURNAL_RETENTION_SECONDS,
    LLM_CONNECT_TIMEOUT_SECONDS,
    LLM_DEADLINE_SECONDS,
    LLM_MAX_ATTEMPTS,
    LLM_BREAKER_COOLDOWN_SECONDS,
    LLM_BREAKER_FAILURES,
    LLM_MAX_IN_FLIGHT,
    LLM_MAX_RESPONSE_BYTES,
    LLM_MAX_TOKENS,
    LLM_READ_TIMEOUT_SECONDS,
    LLM_REQUEST_TIMEOUT_SECONDS,
    MAILBOX_CAPACITY,
    MAX_ACTIONS_PER_REPLY,
    MAX_HOPS,
    MAX_OPEN_ITEMS,
    MAX_RESTARTS,
    MEDIA_MAX_DOCUMENT_CHARS,
    MEDIA_MAX_FILE_BYTES,
    MEDIA_MAX_IMAGE_BYTES,
    MEDIA_TIMEOUT_SECONDS,
    MEMORY_MAX_TOKENS,
    MEMORY_RETENTION_SECONDS,
    MESSAGE_ATTEMPTS,
    NATS_ACK_WAIT_SECONDS,
    NATS_LEASE_SECONDS,
    RESTART_BACKOFF_JITTER,
    RESTART_BACKOFF_MAX_SECONDS,
    RESTART_BACKOFF_MIN_SECONDS,
    RESTART_BACKOFF_RESET_SECONDS,
    RESTART_PERIOD_SECONDS,
)
from autoresponse.actors.retry import RetrySettings
from autoresponse.interfaces.credentials import stripped
from autoresponse.redaction import MIN_SECRET_CHARS, Redactor
from autoresponse.supervisors import Platform, RestartIntensity, platforms

ENV_PREFIX = "AUTORESPONSE_"
ENV_NESTED_DELIMITER = "__"

# What ``Settings.load`` hands to ``settings_customise_sources`` (the TOML file's
# contents and the caller's defaults); None outside a ``load``.
_file_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("file_data", default=None)
_defaults: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("defaults", default=None)


def _not_blank(path: Any) -> Any:
    """``Path("")`` is the current directory: ``AUTORESPONSE_DATA_DIR=`` would silently put
    the databases wherever the command happened to be started."""
    if isinstance(path, str) and not path.strip():
        raise PydanticCustomError("blank_path",
                                  "should be a path, not empty (that would be the current directory)")
    return path


#: A path setting that may not be empty.
_NonBlankPath = Annotated[Path, BeforeValidator(_not_blank)]


class FallbackSettings(BaseModel):
    """A further engine, asked when the ones before it fail: an OpenAI-compatible server,
    or ``base_url = "offline"`` for a short "I can't think right now" notice."""

    name: str | None = None
    base_url: str
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None

    _api_key = field_validator("api_key", mode="before")(stripped)

    @field_validator("base_url")
    @classmethod
    def _url_or_offline(cls, url: str) -> str:
        return url if url == "offline" else LLMSettings._http_url(url) or ""


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
    #: The whole of one attempt (connect, send, read the body), and all attempts together.
    request_timeout: float = Field(default=LLM_REQUEST_TIMEOUT_SECONDS, gt=0)
    deadline: float = Field(default=LLM_DEADLINE_SECONDS, gt=0)
    max_response_bytes: int = Field(default=LLM_MAX_RESPONSE_BYTES, ge=1)
    #: Stream replies, so a chat sees its answer grow (a server that does not stream
    #: answers as usual).
    stream: bool = True
    #: How actions travel to the model: native tools, a json_schema response format, or
    #: JSON in text; auto starts at tools and steps down when the server refuses one.
    protocol: Literal["auto", "tools", "json_schema", "text"] = "auto"
    #: A reply in plain words: delivered to the chat as the answer, or re-asked for actions.
    prose: Literal["reply", "reask"] = "reply"
    #: Tokens one reply may use (sent as max_tokens on every call).
    max_tokens: int = Field(default=LLM_MAX_TOKENS, ge=16)
    #: The model's context window in tokens; unset, the server is asked (llama.cpp, Ollama, vLLM).
    context_tokens: int | None = Field(default=None, ge=256)
    seed: int | None = None
    #: Tokens one chat may use a day; past it, one notice, and the request waits as a dead letter.
    daily_tokens_per_chat: int | None = Field(default=None, ge=1)
    #: Engines asked in order when this one's retries are exhausted or its circuit is open.
    fallbacks: list[FallbackSettings] = Field(default_factory=list)
    #: Failures in a row that open an engine's circuit, and how long it stays open.
    breaker_failures: int = Field(default=LLM_BREAKER_FAILURES, ge=1)
    breaker_cooldown: float = Field(default=LLM_BREAKER_COOLDOWN_SECONDS, gt=0)
    #: Photos go to the model as images (OpenAI ``image_url`` parts); off, it is told a photo came.
    vision: bool = False
    #: The largest photo size sent to the model (the biggest size under it is chosen).
    max_image_bytes: int = Field(default=MEDIA_MAX_IMAGE_BYTES, ge=1)
    #: The largest file downloaded (a document, a voice note); a bigger one gets a notice.
    max_file_bytes: int = Field(default=MEDIA_MAX_FILE_BYTES, ge=1)
    #: Characters of a text file inlined into the prompt; the rest is cut, and the model told.
    max_document_chars: int = Field(default=MEDIA_MAX_DOCUMENT_CHARS, ge=1)
    #: Seconds reading a message's files may take: its downloads and transcriptions together.
    media_timeout: float = Field(default=MEDIA_TIMEOUT_SECONDS, gt=0)
    #: An OpenAI-compatible ``/audio/transcriptions`` URL: voice notes are transcribed there.
    transcribe_url: str | None = None
    transcribe_model: str = "whisper-1"
    #: The transcription server's key; unset, the LLM's ``api_key`` is used when the server is the LLM's.
    transcribe_api_key: SecretStr | None = None

    _api_keys = field_validator("api_key", "transcribe_api_key", mode="before")(stripped)

    @field_validator("base_url", "transcribe_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        """An http(s) URL with a host, or None (empty too: the offline engine). Refused here,
        as a setting, rather than when the engine is built or the first request fails."""
        if url is None or not url.strip():
            return None
        try:
            parts: SplitResult | None = urlsplit(url)
            _ = parts.port  # reading it raises ValueError for a port that is no number, or too big
        except ValueError:  # that, or an unclosed IPv6 bracket (the message may quote the URL)
            parts = None
        if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                or any(c.isspace() for c in url)):
            raise PydanticCustomError("http_url", "should be an http:// or https:// URL with a host, "
                                                  "e.g. http://127.0.0.1:11434/v1")
        if "?" in url or "#" in url:  # the API's path goes after it: ...?key=X/chat/completions
            raise PydanticCustomError("http_url_query",
                                      "should have no query or fragment (? or #): the API's path is added "
                                      "to its end (a key goes in an api_key setting)")
        return url


#: The levels ``log_level`` takes, as Python's logging names them.
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _level_name(value: Any) -> Any:
    """A level in any case (``debug``). Anything else is left as given, for the Literal to
    refuse with the value the operator wrote; numbers too: logging's numbers take levels
    between the named ones, which nothing here logs at."""
    if isinstance(value, str):
        name = value.strip().upper()
        name = _LEVEL_ALIASES.get(name, name)
        if name in get_args(LogLevel):
            return name
    return value


#: The other names Python's logging takes for two of its levels.
_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def _cpu_core(value: Any) -> Any:
    """``auto``, ``off`` or a core's number (from TOML, or text from the environment)."""
    if value in ("auto", "off") or (type(value) is int and value >= 0):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ValueError("should be auto, off or the number of a core (0, 1, ...)")


class RuntimeSettings(BaseModel):
    max_hops: int = Field(default=MAX_HOPS, ge=1)
    mailbox_capacity: int = Field(default=MAILBOX_CAPACITY, ge=1)
    #: How long a stop waits for work under way; what is left stays open and resumes.
    drain_seconds: float = Field(default=DRAIN_SECONDS, ge=0)
    #: Work accepted from outside and not finished, at most (then sources wait).
    max_open: int = Field(default=MAX_OPEN_ITEMS, ge=1)
    #: Actions one LLM reply may hold; more is an error the LLM is asked to fix.
    max_actions: int = Field(default=MAX_ACTIONS_PER_REPLY, ge=1)
    #: Seconds the outputs of one reply's commands are waited for, to deliver them together.
    batch_wait: float = Field(default=BATCH_WAIT_SECONDS, gt=0)
    #: Command actions a turn the bot starts on its own may use (a reminder, a public
    #: mention), e.g. ["terminal"]; by default such a turn may only reply, or stay silent.
    autonomous_actions: list[str] = Field(default_factory=list)
    #: The event loop that carries all I/O: uvloop's (where installed; asyncio's on
    #: Windows), or "asyncio" for asyncio's own.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    #: The one CPU core a daemon's threads run on: "auto" (the least busy as it starts),
    #: a core's number, or "off" (the scheduler spreads them over every core). Under the
    #: GIL, hand-offs between cores cost more than a second core adds: see actors.kernel.cores.
    cpu_core: Annotated[int | Literal["auto", "off"], BeforeValidator(_cpu_core)] = "auto"
    #: Record every hop of every request: ``autoresponse trace``, the status page's requests
    #: and waterfalls, and OpenTelemetry's spans are made from it. Off, a delivery costs
    #: about a fifth less CPU in process (docs/benchmarks.md), and no request has a trace.
    trace: bool = True


class MemorySettings(BaseModel):
    """Each chat's conversation memory, in ``<data_dir>/memory.sqlite3``."""

    enabled: bool = True
    #: Tokens (about four characters each) a chat's memory may hold; the oldest go first.
    #: At least one: 0 would silently forget every entry (``enabled = false`` turns memory off).
    max_tokens: int = Field(default=MEMORY_MAX_TOKENS, ge=1)
    retention_seconds: float = Field(default=MEMORY_RETENTION_SECONDS, gt=0)


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

    @field_validator("token")
    @classmethod
    def _blank_token_is_none(cls, token: SecretStr | None) -> SecretStr | None:
        """``AUTORESPONSE_ADMIN__TOKEN=`` (empty) is no token: it must not open a public bind."""
        return token if token is not None and token.get_secret_value().strip() else None

    @property
    def url(self) -> str:
        """Where a client on this machine reaches it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"


class OtelSettings(BaseModel):
    """OpenTelemetry traces (``pip install 'autoresponse[otel]'``), exported over OTLP/HTTP
    as the standard ``OTEL_EXPORTER_OTLP_*`` variables say (see ``autoresponse.otel``)."""

    #: Unset: on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set;
    #: true or false says so whatever the environment (``OTEL_SDK_DISABLED=true`` still wins).
    enabled: bool | None = None
    #: The ``service.name`` of the spans, unless ``OTEL_SERVICE_NAME`` or
    #: ``OTEL_RESOURCE_ATTRIBUTES`` name it.
    service_name: str = Field(default="autoresponse", min_length=1, max_length=200)


class LogSettings(BaseModel):
    """How the daemon logs to stderr (the level is the top-level ``log_level``)."""

    #: ``text`` for people; ``json``, one object a line, for a log collector.
    format: Literal["text", "json"] = "text"


class JournalSettings(BaseModel):
    """The delivery journal: ``<data_dir>/journal.sqlite3`` unless a path is given."""

    enabled: bool = True
    #: ``sqlite`` (one daemon, the default) or ``nats``: several daemons share the work
    #: through NATS JetStream (see the ``nats`` section).
    backend: Literal["sqlite", "nats"] = "sqlite"
    path: _NonBlankPath | None = None
    #: Finished work (and its send keys) is forgotten after this long.
    retention_seconds: float = Field(default=JOURNAL_RETENTION_SECONDS, ge=0)


class NatsSettings(BaseModel):
    """The NATS JetStream server of ``journal.backend = "nats"``."""

    url: str = "nats://127.0.0.1:4222"
    #: This daemon's name in the cluster (lease holder, dead letters); default: host-pid.
    node: str | None = Field(default=None, min_length=1, max_length=200)
    #: A work item of a worker not heard from for this long goes to another worker.
    ack_wait_seconds: float = Field(default=NATS_ACK_WAIT_SECONDS, gt=0.5)
    #: A poller's lease lapses this long after its holder's last renewal.
    lease_seconds: float = Field(default=NATS_LEASE_SECONDS, gt=0.5)

    @field_validator("url")
    @classmethod
    def _nats_url(cls, url: str) -> str:
        try:
            parts: SplitResult | None = urlsplit(url)
            assert parts is not None
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise PydanticCustomError("nats_url", "should be a nats:// or tls:// URL with a host and a "
                                      "numeric port, e.g. nats://127.0.0.1:4222")
        return url


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
        try:
            parts = urlsplit(value)
            username, password = parts.username, parts.password
        except ValueError:  # e.g. an unclosed IPv6 bracket: the userinfo is still before the last "@"
            userinfo = re.split(r"[/?#]", value.split("://", 1)[1], maxsplit=1)[0].rpartition("@")[0]
            username, _, password = userinfo.partition(":")
        if password:
            yield password
        if username:
            yield f"{username}:{password}" if password else username


#: The largest number a float setting may hold: the longest wait threading can do (about
#: 292 years). Every float setting is a time or smaller, and a longer one overflows when it
#: is waited for (``drain_seconds = 1e300`` made the stop raise, like ``inf``).
LONGEST_WAIT = int(threading.TIMEOUT_MAX)


def _floats(value: Any,
            loc: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], float]]:
    """Every float beneath ``value``, with where it is: the fields of models, and the
    items of dicts and lists (a platform's dict of models, say)."""
    if isinstance(value, float):
        yield loc, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _floats(getattr(value, name), (*loc, name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _floats(item, (*loc, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _floats(item, (*loc, index))


class ConfigError(Exception):
    """Settings that cannot be used. The message is one line for the operator: where
    (the variable, or the file and its ``[section] key``), what is wrong, never a secret."""


class Settings(BaseSettings):
    """Every setting of the runtime, the core sections and one per registered platform."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, extra="ignore"
    )

    llm: LLMSettings = LLMSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    supervision: SupervisionSettings = SupervisionSettings()
    retry: RetrySettings = RetrySettings()
    admin: AdminSettings = AdminSettings()
    journal: JournalSettings = JournalSettings()
    nats: NatsSettings = NatsSettings()
    memory: MemorySettings = MemorySettings()
    log: LogSettings = LogSettings()
    otel: OtelSettings = OtelSettings()
    data_dir: _NonBlankPath = Path("~/.local/share/autoresponse")
    log_level: Annotated[LogLevel, BeforeValidator(_level_name)] = "INFO"
    #: User ids who may approve any action that waits for approval (``terminal.approval =
    #: "ask"``), besides the user who asked: ``[123, 456]``, or ``["telegram:123"]`` for
    #: one platform's user. Each also gets the approval in their private chat.
    approvers: list[Annotated[str, BeforeValidator(str)]] = Field(default_factory=list)
    #: Seconds an approval waits for a decision (on the runtime's clock); then it expires,
    #: with a notice to the user, and the action does not run.
    approval_timeout: float = Field(default=APPROVAL_TIMEOUT_SECONDS, gt=0)

    def __new__(cls, *args: Any, **kwargs: Any) -> Settings:
        # ``Settings()`` means the settings of every registered platform too.
        target = _with_platforms(platforms()) if cls is Settings else cls
        return super().__new__(target)

    @model_validator(mode="after")
    def _usable_floats(self) -> Settings:
        """inf, nan and numbers beyond ``LONGEST_WAIT`` are refused for every float of every
        section, the platforms' too.

        pydantic takes inf and nan for a ``float`` unless each model says ``allow_inf_nan=False``,
        and the models live in their rooms (``RetrySettings`` in actors, each platform's
        under interfaces), which cannot import a shared base from here: so it is said once,
        here. An endless drain or check interval is never what was meant (``drain_seconds
        = inf`` made the stop overflow; ``check_seconds = inf`` never fired a reminder).
        """
        errors: list[InitErrorDetails] = []
        for loc, value in _floats(self):
            if not math.isfinite(value):
                errors.append(InitErrorDetails(type="finite_number", loc=loc, input=value))
            elif value > LONGEST_WAIT:
                errors.append(InitErrorDetails(type="less_than_equal", loc=loc, input=value,
                                               ctx={"le": LONGEST_WAIT}))
        if errors:  # raised as a ValidationError, pydantic keeps each error's own location
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @model_validator(mode="after")
    def _spans_need_the_trace(self) -> Settings:
        """OpenTelemetry's spans are made from the trace's events: asking for both off and on
        is a mistake to say at once, not a daemon that exports nothing."""
        if self.otel.enabled and not self.runtime.trace:
            raise ValueError("otel.enabled = true needs runtime.trace = true: "
                             "OpenTelemetry's spans are made from every hop's trace")
        return self

    @classmethod
    def load(cls, config_file: str | Path | None = None, *,
             defaults: dict[str, Any] | None = None, **overrides: Any) -> Settings:
        """Settings from every source; ``config_file`` is a TOML file.

        Raises FileNotFoundError when ``config_file`` does not exist, and ConfigError
        (one line, no secrets) for a directory given as the file, a file that does not
        parse, an unknown key in the file or the environment, a variable naming a list's
        item, or a value that does not validate.
        """
        if config_file is not None and not Path(config_file).is_file():
            if Path(config_file).is_dir():
                raise ConfigError(f"the config file {config_file} is a directory; give a TOML file")
            raise FileNotFoundError(f"config file not found: {config_file}")
        model = _with_platforms(platforms()) if cls is Settings else cls
        sources = _Sources(
            overrides=overrides, environment=_environment(), defaults=defaults or {},
            file=Path(config_file) if config_file is not None else None,
            file_data=_read_toml(Path(config_file)) if config_file is not None else {},
        )
        problems = [*sources.unknown_keys(model), *sources.indexed_lists(model),
                    *sources.unreadable_json(model)]
        if problems:
            raise ConfigError("; ".join(problems))
        file_token = _file_data.set(sources.file_data)
        defaults_token = _defaults.set(sources.defaults)
        try:
            return cls(**overrides)
        except SettingsError as exc:
            # Not expected after unreadable_json; still one line rather than a traceback.
            raise ConfigError(f"{exc} ({exc.__cause__})") from None
        except ValidationError as exc:
            raise ConfigError("; ".join(sources.explain(model, error) for error in exc.errors())) from None
        finally:
            _file_data.reset(file_token)
            _defaults.reset(defaults_token)

    def section(self, name: str) -> Any:
        """The settings of the platform (or core section) called ``name``."""
        return getattr(self, name)

    def secrets(self) -> list[str]:
        """Every secret configured anywhere (for redaction): SecretStr values, URL
        credentials, what platforms name as secrets, and the OpenTelemetry exporter's
        (read from its own ``OTEL_EXPORTER_OTLP_*`` variables)."""
        from autoresponse import otel  # imports nothing of OpenTelemetry

        found = set(_secret_values(self)) | set(otel.secrets())
        for platform in platforms():
            section = getattr(self, platform.name, None)
            if section is not None:
                found.update(s for s in platform.secrets(section) if s)
        # A blank value is no secret (credentials.given), and would hide every run of spaces.
        return sorted((s for s in found if len(s) >= MIN_SECRET_CHARS and s.strip()), key=len, reverse=True)

    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser()

    @property
    def journal_path(self) -> Path:
        """Where the delivery journal lives (the application opens the same path)."""
        return self.journal.path or self.data_path / "journal.sqlite3"

    def check_data_dir(self) -> Path:
        """Create the data directory if it is missing; ConfigError if it cannot be used.

        Called before anything starts, so that the operator reads which directory and
        why, not a traceback from whichever store opened it first.
        """
        _usable_directory(self.data_path, f"the data directory {self.data_path} ({ENV_PREFIX}DATA_DIR, data_dir)")
        if self.journal.enabled and self.journal.path is not None:
            where = self.journal_path.parent
            _usable_directory(where, f"the journal's directory {where} ({ENV_PREFIX}JOURNAL__PATH, [journal] path)")
        if self.journal.enabled and self.journal_path.is_dir():
            # Here, not where SQLite opens it: its "unable to open database file" says not which, nor why.
            setting = f" ({ENV_PREFIX}JOURNAL__PATH, [journal] path)" if self.journal.path is not None else ""
            raise ConfigError(f"the journal {self.journal_path}{setting} cannot be used: it is a directory")
        return self.data_path

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
        file_data = _file_data.get()
        if file_data:
            # The TOML file, read and checked by ``load``.
            sources.append(InitSettingsSource(settings_cls, init_kwargs=file_data))
        defaults = _defaults.get()
        if defaults:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=defaults))
        return tuple(sources)


@lru_cache(maxsize=16)
def _with_platforms(registered: tuple[Platform, ...]) -> type[Settings]:
    """The Settings class with one section per registered platform."""
    sections: dict[str, Any] = {p.name: (p.settings, Field(default_factory=p.settings)) for p in registered}
    return create_model("Settings", __base__=Settings, __module__=__name__, **sections)


# ---------------------------------------------------------------- checking the sources


def _usable_directory(path: Path, what: str) -> None:
    """Make sure ``path`` is (or can be made) a writable directory; ConfigError saying why not."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        why = "it is a file" if existing == path else f"{existing} is a file"
        raise ConfigError(f"{what} cannot be used: {why}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be created: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} cannot be used: it is not writable")


def _read_toml(path: Path) -> dict[str, Any]:
    """The parsed file; ConfigError with the file, line and column when it does not parse.

    A UTF-8 byte order mark, which some editors write first, is skipped: tomllib takes it
    for a statement.
    """
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line X, column Y)"
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: the file is not UTF-8") from None
    except RecursionError:  # tomllib recurses into each nested array or table
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None


def _environment() -> dict[tuple[str, ...], tuple[str, str]]:
    """Every ``AUTORESPONSE_`` variable by the path it sets: ("admin", "port") → (name, value).

    Matched without regard to case, as pydantic-settings matches them.
    """
    return {tuple(name[len(ENV_PREFIX):].lower().split(ENV_NESTED_DELIMITER)): (name, value)
            for name, value in os.environ.items() if name.upper().startswith(ENV_PREFIX)}


def _members(annotation: Any) -> list[Any]:
    """The types a field may hold: the members of ``X | Y | None`` without None, or the type itself."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (``Model`` or ``Model | None``), if it holds one."""
    models = [a for a in _members(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def _step(annotation: Any) -> tuple[type[BaseModel] | None, type | None]:
    """What a key path goes on into beneath a field: the model (of ``Model``, ``Model | None``,
    ``dict[str, Model]`` or ``list[Model]``), and the container whose key or index comes
    first (``Mapping`` or ``list``), None for a model itself."""
    model = _model_in(annotation)
    if model is not None:
        return model, None
    members = _members(annotation)
    origin = get_origin(members[0]) if len(members) == 1 else None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        model = _model_in(get_args(members[0])[-1])
        return model, Mapping if model is not None else None
    if isinstance(origin, type) and issubclass(origin, Sequence) and not issubclass(origin, (str, bytes)):
        model = _model_in(get_args(members[0])[0]) if get_args(members[0]) else None
        return model, list if model is not None else None
    return None, None


def _named_step(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """``_step`` as a variable's name can go on: into a model or a dict's key (whether one
    comes first), never into a list's item (a name cannot index a list)."""
    model, container = _step(annotation)
    return (None, False) if container is list else (model, container is Mapping)


def _field_at(model: type[BaseModel], path: Sequence[str | int]) -> FieldInfo | None:
    """The field ``path`` names, walking down nested models (and dicts of models); None
    when it names none: past a plain value, or a dict's key itself."""
    found: FieldInfo | None = None
    inner: type[BaseModel] | None = model
    free_key = False
    for part in path:
        if free_key:
            found, free_key = None, False
            continue
        if inner is None or not isinstance(part, str) or part not in inner.model_fields:
            return None
        found = inner.model_fields[part]
        inner, free_key = _named_step(found.annotation)
    return found


def _unknown(model: type[BaseModel], path: Sequence[str]) -> tuple[int, list[str]] | None:
    """Where ``path`` first names no field: its index and the names known there.

    None when every part is a field (or a key of a dict of models), or when the path
    goes on beneath a plain value: validation speaks for a number, ``_list_named_past``
    for a list.
    """
    free_key = False
    for index, part in enumerate(path):
        if free_key:
            free_key = False
            continue
        if part not in model.model_fields:
            return index, list(model.model_fields)
        inner, free_key = _named_step(model.model_fields[part].annotation)
        if inner is None:
            return None
        model = inner
    return None


def _is_list(annotation: Any) -> bool:
    """Whether a field holds a list (a tuple, a set): what a variable sets whole, as JSON."""
    kinds = [get_origin(a) or a for a in _members(annotation)]
    return bool(kinds) and all(isinstance(kind, type) and issubclass(kind, (Sequence, AbstractSet))
                               and not issubclass(kind, (str, bytes)) for kind in kinds)


def _list_named_past(model: type[BaseModel], path: Sequence[str]) -> int | None:
    """How many parts of a variable's ``path`` name a list setting when the name goes on
    past it, into an item (``llm, fallbacks, 0, model``: 2); None when it does not.
    pydantic-settings makes such a name a dict where the list goes, refused as "should be a
    valid list" without the variable's name: a name cannot index a list."""
    for length in range(1, len(path)):
        found = _field_at(model, path[:length])
        if found is not None and _is_list(found.annotation):
            return length
    return None


def _readings(path: Sequence[str]) -> list[tuple[str, ...]]:
    """The key paths a variable's name may have meant, ``path`` (as it spells them) first:
    all of it one key (``LOG__LEVEL`` for ``LOG_LEVEL``), and a section and a key split at
    each underscore (``TELEGRAM_TOKEN`` for ``TELEGRAM__TOKEN``)."""
    words = [w for w in re.split(r"_+", "_".join(path)) if w]
    splits = [("_".join(words[:i]), "_".join(words[i:])) for i in range(1, len(words))]
    return [tuple(path), ("_".join(words),), *splits]


def _suggested_variable(model: type[BaseModel], path: tuple[str, ...]) -> str:
    """`` (did you mean X?)`` for an unknown variable's ``path``: a reading of it that names
    a setting, else the nearest spelling in the reading that got furthest before a name
    went unknown (none for a whole section where the name went on into one of its keys)."""
    readings = _readings(path)
    for reading in readings:
        if _unknown(model, reading) is None and _field_at(model, reading) is not None:
            return f" (did you mean {ENV_PREFIX}{ENV_NESTED_DELIMITER.join(reading).upper()}?)"
    unknown = [(reading, where) for reading in readings if (where := _unknown(model, reading)) is not None]
    if not unknown:
        return ""
    furthest = max(index for _, (index, _) in unknown)
    for reading, (index, known) in unknown:
        if index < furthest:
            continue

        def variable(key: str, *, at: tuple[str, ...] = reading, index: int = index) -> str:
            """The variable as it would be spelled with ``key`` in place of the typo."""
            return ENV_PREFIX + ENV_NESTED_DELIMITER.join((*at[:index], key, *at[index + 1:])).upper()

        suggestion = _did_you_mean(reading[index], known, variable)
        if suggestion:
            return suggestion
    return ""


def _value_model(model: type[BaseModel],
                 path: Sequence[str]) -> tuple[type[BaseModel] | None, type | None, bool]:
    """What the JSON value of the variable at ``path`` becomes: the model (None for a plain
    value), the container of such models it is (``Mapping``, ``list``, or None), and whether
    its keys match in any case, as pydantic-settings matches them through nested models
    (not past a dict's key or in a list's items)."""
    inner: type[BaseModel] | None = model
    container: type | None = None
    any_case = True
    for part in path:
        if container is Mapping:  # the dict's own key
            container, any_case = None, False
            continue
        if inner is None or container is not None or part not in inner.model_fields:
            return None, None, False
        inner, container = _step(inner.model_fields[part].annotation)
    return inner, container, any_case


def _unknown_in(model: type[BaseModel], data: Any, where: tuple[str | int, ...] = (), *,
                container: type | None = None,
                any_case: bool = False) -> Iterator[tuple[tuple[str | int, ...], Any, list[str]]]:
    """Keys of parsed TOML or JSON that no model has: each one's path, its value and the
    names known there.

    ``data`` is what ``model`` is made from, or with ``container`` a dict or list of such
    (``[[llm.fallbacks]]``); only what becomes a model is walked, validation speaks for
    the rest. ``any_case``: keys match in any case (see ``_value_model``).
    """
    if container is not None:
        if isinstance(data, container):
            items = data.items() if isinstance(data, Mapping) else enumerate(data)
            for key, item in items:  # past a dict's key or in a list, keys match as spelled
                yield from _unknown_in(model, item, (*where, key))
        return
    if not isinstance(data, Mapping):
        return
    for key, value in data.items():
        name = key.lower() if any_case and isinstance(key, str) else key
        if name not in model.model_fields:
            yield (*where, key), value, list(model.model_fields)
            continue
        inner, inner_container = _step(model.model_fields[name].annotation)
        if inner is not None:
            yield from _unknown_in(inner, value, (*where, key), container=inner_container, any_case=any_case)


def _did_you_mean(word: str, known: list[str], spell: Callable[[str], str]) -> str:
    """`` (did you mean X?)`` for the known name nearest to ``word``, spelled as the source spells it."""
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {spell(close[0])}?)" if close else ""


def _reads_json(annotation: Any) -> bool:
    """Whether pydantic-settings reads the field's environment value as JSON: lists,
    dicts and models. A union counts only if every member does (else a plain value may fit)."""
    def container(a: Any) -> bool:
        kind = get_origin(a) or a
        return (isinstance(kind, type) and not issubclass(kind, (str, bytes))
                and issubclass(kind, (BaseModel, Mapping, Sequence, AbstractSet)))
    members = _members(annotation)
    return bool(members) and all(container(a) for a in members)


def _annotation_at(model: type[BaseModel], loc: Sequence[str | int]) -> Any:
    """The type of the deepest field on the way to ``loc`` (through nested models, dicts
    and lists of models): the field's own, or the one a bad item, key or member is in.
    None when ``loc`` names no field."""
    found: Any = None
    inner: type[BaseModel] | None = model
    container: type | None = None
    for part in loc:
        if container is not None:  # the dict's key or the list's index
            container = None
            continue
        if inner is None or not isinstance(part, str) or part not in inner.model_fields:
            break
        found = inner.model_fields[part].annotation
        inner, container = _step(found)
    return found


def _holds_secret(annotation: Any) -> bool:
    """Whether a SecretStr is anywhere inside: ``SecretStr | None``, ``list[SecretStr]``, a
    model with one (a section, ``list[FallbackSettings]``)."""
    pending, seen = [annotation], set()
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, (SecretStr, SecretBytes)):
            return True
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation not in seen:
            seen.add(annotation)
            pending.extend(f.annotation for f in annotation.model_fields.values())
        pending.extend(get_args(annotation))
    return False


def _is_secret(model: type[BaseModel], loc: Sequence[str | int]) -> bool:
    """Whether the value at ``loc`` may be a secret, which must never be shown: the field
    it is in holds one (``[llm] api_key``, ``fallbacks[0].api_key``, a whole ``[telegram]``)."""
    annotation = _annotation_at(model, loc)
    return annotation is not None and _holds_secret(annotation)


def _shown(value: Any) -> str | None:
    """The bad value as the operator may see it: None for containers, which might hold a
    secret; URL credentials replaced, and a URL's query and fragment (where a key may be)
    cut to ``?...``. (A secret setting's value is not shown at all: see ``explain``.)"""
    if not isinstance(value, (str, int, float, bool, type(None))):
        return None
    if isinstance(value, str) and "://" in value and re.search(r"[?#]", value):
        value = re.split(r"[?#]", value, maxsplit=1)[0] + "?..."
    text = repr(value)
    for hidden in sorted(_secret_values(value), key=len, reverse=True):
        text = text.replace(hidden, "[secret]")
    return text if len(text) <= 80 else text[:77] + "..."


def _holds(data: Any, loc: Sequence[str | int]) -> bool:
    """Whether the nested dict ``data`` sets ``loc`` (or the list an index in ``loc`` points into)."""
    for part in loc:
        if not isinstance(data, Mapping):
            return isinstance(part, int)
        if part not in data:
            return False
        data = data[part]
    return True


def _suffix(parts: Sequence[str | int]) -> str:
    """``.key`` and ``[index]`` parts, e.g. ``.allowed_users[1]``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _toml_name(loc: Sequence[str | int], *, section: bool = False) -> str:
    """``[section] key`` as the TOML file spells it; ``[section]`` for a table."""
    first_index = next((i for i, p in enumerate(loc) if isinstance(p, int)), len(loc))
    keys, rest = loc[:first_index], _suffix(loc[first_index:])
    if section:
        return f"[{'.'.join(map(str, keys))}]"
    if len(keys) == 1:
        return f"{keys[0]}{rest}"
    return f"[{'.'.join(map(str, keys[:-1]))}] {keys[-1]}{rest}"


@dataclass
class _Sources:
    """What ``Settings.load`` reads, kept to check it and to name the source of a bad value."""

    overrides: Mapping[str, Any]
    environment: Mapping[tuple[Any, ...], tuple[str, str]]
    defaults: dict[str, Any]
    file: Path | None = None
    file_data: dict[str, Any] = field(default_factory=dict)

    def unknown_keys(self, model: type[BaseModel]) -> Iterator[str]:
        """Keys no model has, each with its nearest known spelling: a typo is an error, not a
        default. In the file (in its lists of tables too), in variables' names, and inside
        the JSON a variable holds (a whole section, a list of fallbacks)."""
        # pydantic-settings matches the file's top-level keys in any case
        file_data = {key.lower(): value for key, value in self.file_data.items()}
        for path, value, known in _unknown_in(model, file_data):
            # An unknown table inside a list's item is named as a key: [llm] fallbacks[0].x
            section = isinstance(value, Mapping) and not any(isinstance(p, int) for p in path)
            spell = (lambda key: f"[{key}]") if section and len(path) == 1 else str
            yield (f"{self.file}: unknown {'section' if section else 'key'} "
                   f"{_toml_name(path, section=section)}{_did_you_mean(str(path[-1]), known, spell)}")
        for path, (name, value) in sorted(self.environment.items()):
            if _unknown(model, path) is not None:
                yield f"{name} is not a setting{_suggested_variable(model, path)}"
                continue
            inner, container, any_case = _value_model(model, path)
            if inner is None:
                continue
            try:
                data = json.loads(value)
            except (ValueError, RecursionError):
                continue  # unreadable_json says so
            for where, _, known in _unknown_in(inner, data, container=container, any_case=any_case):
                key = str(where[-1])
                yield f"{name}{_suffix(where[:-1])}: unknown key {key}{_did_you_mean(key, known, str)}"

    def indexed_lists(self, model: type[BaseModel]) -> Iterator[str]:
        """Variables that name an item of a list (``AUTORESPONSE_LLM__FALLBACKS__0__MODEL``),
        each with the variable (and the file's key) that sets the whole list. The value is
        never shown: it may be a secret (a fallback's api_key)."""
        for path, (name, _) in sorted(self.environment.items()):
            length = _list_named_past(model, path)
            if length is not None:
                whole = ENV_PREFIX + ENV_NESTED_DELIMITER.join(path[:length]).upper()
                yield (f"{name} is not a setting: a list is set whole, as JSON, in {whole} "
                       f"(or {_toml_name(path[:length])} in the TOML file)")

    def unreadable_json(self, model: type[BaseModel]) -> Iterator[str]:
        """Environment values that must be JSON (lists, dicts, whole sections) and are not.
        The value is never shown, as any part of it may be a secret (a section's token, a
        fallback's api_key): the JSON error's message and position say where it went wrong."""
        for path, (name, value) in sorted(self.environment.items()):
            found = _field_at(model, path)
            if found is None or not value or not _reads_json(found.annotation):
                continue
            try:
                json.loads(value)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
                members = _members(found.annotation)
                listed = any(issubclass(get_origin(a) or a, (Sequence, AbstractSet)) for a in members)
                expected = 'a JSON list, e.g. ["a", "b"]' if listed else 'a JSON object, e.g. {"k": "v"}'
                yield f"{name}: expected {expected} ({exc})"

    def name(self, loc: Sequence[str | int]) -> str:
        """Where the value at ``loc`` came from, in priority order: an argument, a variable,
        the file's ``[section] key``, or (for defaults) the dotted setting."""
        if not loc:
            return "the settings"
        dotted = _suffix(loc).removeprefix(".")
        if _holds(self.overrides, loc):
            return f"the argument {dotted}"
        for n in range(len(loc), 0, -1):
            if tuple(loc[:n]) in self.environment:
                return self.environment[tuple(loc[:n])][0] + _suffix(loc[n:])
        if self.file is not None and _holds(self.file_data, loc):
            return f"{self.file}: {_toml_name(loc)}"
        return f"the setting {dotted}"

    def explain(self, model: type[BaseModel], error: Any) -> str:
        """One validation error as one line: where, the bad value (unless secret), what was expected."""
        message = error["msg"].replace("Input should be ", "should be ", 1).removeprefix("Value error, ")
        loc = error["loc"]
        if error["type"] == "missing":
            return f"{self.name(loc)}: {message}"
        shown = _shown(error["input"])
        if shown is not None and _is_secret(model, loc):
            return f"{self.name(loc)} (a secret, not shown): {message}"
        return f"{self.name(loc)}{'' if shown is None else ' is ' + shown}: {message}"


# ---------------------------------------------------------------- where each value came from


@dataclass(frozen=True)
class Shown:
    """One setting as ``autoresponse config show`` prints it."""

    key: str  # dotted, e.g. "llm.base_url"
    value: Any  # as JSON, secrets replaced by "[secret]"
    source: str  # a variable, the file's "[section] key", the command's defaults, "built-in default"


def _leaf_settings(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every setting beneath ``value``: the fields of nested models, each down to a plain value."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _leaf_settings(getattr(value, name), (*path, name))
    else:
        yield path, value


def _redacted(value: Any, redact: Redactor) -> Any:
    """``value`` (as JSON) with every secret replaced, inside lists and objects too."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v, redact) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, redact) for k, v in value.items()}
    return value


def describe(config_file: str | Path | None = None, *, defaults: dict[str, Any] | None = None,
             defaults_source: str = "the command's defaults") -> list[Shown]:
    """Every effective setting, its value (secrets redacted) and its source.

    pydantic does not record where a value came from, so each source is asked on its
    own, in priority order: pydantic-settings' environment source, the TOML file, the
    command's ``defaults``; a key none of them holds has its built-in default.
    Raises what ``Settings.load`` raises.
    """
    settings = Settings.load(config_file, defaults=defaults)
    variables = _environment()
    from_environment = EnvSettingsSource(type(settings))()
    file_data = {k.lower(): v for k, v in _read_toml(Path(config_file)).items()} if config_file else {}
    redact = Redactor(settings.secrets())

    def source(path: tuple[str, ...]) -> str:
        if _holds(from_environment, path):
            # The variable that set it: AUTORESPONSE_LLM__MODEL, or AUTORESPONSE_LLM holding JSON.
            return next((variables[path[:n]][0] for n in range(len(path), 0, -1) if path[:n] in variables),
                        "the environment")
        if _holds(file_data, path):
            return f"{config_file}: {_toml_name(path)}"
        if _holds(defaults or {}, path):
            return defaults_source
        return "built-in default"

    return [Shown(".".join(path),
                  "[secret]" if isinstance(value, (SecretStr, SecretBytes)) else
                  _redacted(to_jsonable_python(value), redact),
                  source(path))
            for path, value in _leaf_settings(settings)]
