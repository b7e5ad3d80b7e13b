"""One registration per platform: a platform defined here joins the configuration,
the tree, the action schema and the log redaction with no other edit."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from conftest import environment, free_port
from pydantic import BaseModel, SecretStr

from autoresponse import Application, Settings
from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.kernel.testkit import FaultInjector
from autoresponse.actors import routes
from autoresponse.actors.failures import FAILURE_NOTICE, FailureNotices
from autoresponse.actors.inbound import StrangerGate, StrangerSettings, stranger_gate, take_request
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.limits import STRANGERS_REMEMBERED
from autoresponse.actors.prompts import full_json_instructions
from autoresponse.app import names_in
from autoresponse.cli import RedactSecrets
from autoresponse.config import ConfigError
from autoresponse.interfaces.console import Console
from autoresponse.messages import (
    Envelope,
    MessageAction,
    OriginalContext,
    OutboundMessage,
    UserRequest,
    message_action_for,
)
from autoresponse.supervisors import ChildSpec, Mount, Platform, registered

PAGER_TOKEN = "pager-secret-0123456789"


class PagerSettings(BaseModel):
    enabled: bool = False
    token: SecretStr | None = None


class MessagePagerAction(MessageAction):
    """Page someone."""

    interface: ClassVar[str | None] = "pager"
    type: Literal["message_pager"]


class PagerSender(TypedActor):
    def __init__(self, pages: list[str]) -> None:
        super().__init__()
        self.pages = pages

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        self.pages.append(message.text)


class PagerCall(BaseModel):
    """What the pager's own API hands its inbound actor."""

    pager: str


class PagerInterface(TypedActor):
    @handles
    def on_call(self, call: PagerCall, env: Envelope) -> None:
        context = OriginalContext(chat_id=call.pager, interface_name="pager")
        self.send(routes.CONVERSATIONS, UserRequest(text="paged", context=context), cause=env)


def pager_origin(call: Any) -> OriginalContext | None:
    try:
        return OriginalContext(chat_id=call.pager, interface_name="pager")
    except Exception:
        return None


def _mount(m: Mount) -> None:
    pages: list[str] = []
    m.expose(pages)
    m.pipeline(ChildSpec(routes.sender("pager"), PagerSender, (pages,)))
    m.inbound(ChildSpec(routes.interface("pager"), PagerInterface))
    m.origin(PagerCall, pager_origin)


PAGER = Platform("pager", PagerSettings, _mount, actions=(MessagePagerAction,), interface="pager",
                 interface_aliases=("beeper",))


@pytest.fixture
def pager() -> Iterator[Platform]:
    with registered(PAGER) as platform:
        yield platform


def test_a_new_platform_has_its_settings_section_from_the_environment(
    pager: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESPONSE_PAGER__ENABLED", "true")
    monkeypatch.setenv("AUTORESPONSE_PAGER__TOKEN", PAGER_TOKEN)
    settings = Settings.load()
    assert settings.section("pager").enabled is True
    assert PAGER_TOKEN in settings.secrets()


def test_a_new_platform_joins_the_tree_and_the_schema_and_answers(pager: Platform, tmp_path: Path) -> None:
    settings = Settings.load(pager={"enabled": True, "token": PAGER_TOKEN}, admin={"enabled": False},
                             events={"enabled": False}, console={"read_stdin": False}, data_dir=tmp_path)
    app = Application(settings, console=Console(io.StringIO())).start()
    try:
        assert "sender.pager" in names_in(app.tree())
        assert app.runtime.cell("sender.pager").alive
        assert routes.chat_actions(app.runtime, "pager")[0] == "message_pager"
        assert '"message_pager"' in full_json_instructions(["message_pager"])
        # A request from the pager (by its alias) is answered on the pager, through the LLM.
        context = OriginalContext(chat_id="ops", message_id=1, interface_name="beeper")
        envelope = app.runtime.send(routes.LLM, UserRequest(text="hello", context=context))
        assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, 15)
        assert len(app.resource("pager")) == 1
    finally:
        app.stop()


def test_a_new_platforms_secrets_are_redacted_from_every_log_line(pager: Platform) -> None:
    settings = Settings.load(pager={"enabled": True, "token": PAGER_TOKEN})
    record = logging.LogRecord("any.library", logging.INFO, __file__, 1,
                               "calling https://pager.example/%s/send", (PAGER_TOKEN,), None)
    RedactSecrets(settings.secrets()).filter(record)
    assert PAGER_TOKEN not in record.getMessage() and "[secret]" in record.getMessage()


def test_an_unregistered_platform_leaves_no_trace() -> None:
    with registered(PAGER):
        assert "pager" in type(Settings()).model_fields
    assert "pager" not in type(Settings()).model_fields
    assert message_action_for("pager") is None
    assert OriginalContext(chat_id=1, interface_name="beeper").interface_name == "beeper"


def test_a_new_platforms_input_that_crashes_its_interface_every_time_tells_its_user_once(
        pager: Platform, tmp_path: Path) -> None:
    """The kernel knows no platform's inputs: the origin a platform registers
    (``Mount.origin``) says whom to tell when its interface never turned one into a request."""
    settings = Settings.load(pager={"enabled": True}, admin={"enabled": False}, events={"enabled": False},
                             console={"read_stdin": False}, supervision={"message_attempts": 2},
                             data_dir=tmp_path)
    app = Application(settings, console=Console(io.StringIO())).start()
    try:
        app.runtime.fault = FaultInjector(actors={routes.interface("pager")}, times=2)
        envelope = app.runtime.send(routes.interface("pager"), PagerCall(pager="ops"))
        assert envelope is not None and app.runtime.wait_idle(timeout=15)
        [letter] = app.runtime.dead_letters.letters()
        assert (letter.reason, letter.actor) == ("crash", "interface.pager")
        assert app.resource("pager") == [FAILURE_NOTICE]
    finally:
        app.stop()


# ---------------------------------------------------------------- each platform's origin


class Notices:
    """A runtime stand-in that records what ``FailureNotices`` sends."""

    def __init__(self) -> None:
        self.sent: list[OutboundMessage] = []

    def has(self, name: str) -> bool:
        return True

    def send(self, to: str, body: OutboundMessage, **kw: Any) -> None:
        self.sent.append(body)


def told(input_type: type, origin: Callable[[Any], OriginalContext | None], item: Any) -> list[Any]:
    """The chats FailureNotices tells when ``item`` dies of a crash, unread."""
    runtime = Notices()
    notices = FailureNotices(runtime)  # type: ignore[arg-type]
    notices.origin(input_type, origin)
    notices(Envelope.new(item), "crash", "interface.any")
    return [m.context.chat_id for m in runtime.sent]


ALLOWED, STRANGER = 7, 99
#: Each platform's credentials, whole: an allowlist without them is a settings error.
CREDENTIALS: dict[str, dict[str, Any]] = {
    "telegram": {"token": "123456:TEST-TOKEN"}, "x": {"bearer_token": "user-context-token"},
    "reddit": {"client_id": "reddit-app", "client_secret": "app-secret", "refresh_token": "refresh"},
    "telethon": {"api_id": 12345, "api_hash": "0123abcd", "session": "1AbC..."}}


def _telegram(policy: str) -> tuple[type, Any, Callable[[int], Any]]:
    from autoresponse.interfaces.telegram import TelegramSettings
    from autoresponse.interfaces.telegram.interface import TelegramText, origin

    def make(user: int) -> TelegramText:
        return TelegramText(update_id=1, chat_id=user, chat_type="private", message_id=5, user_id=user,
                            text="run df -h")
    return TelegramText, origin(TelegramSettings(**CREDENTIALS["telegram"], allowed_users=[ALLOWED],
                                                 strangers=policy)), make


def _x(policy: str) -> tuple[type, Any, Callable[[int], Any]]:
    from autoresponse.interfaces.x.interface import XMention, origin
    from autoresponse.interfaces.x.settings import XSettings

    def make(user: int) -> XMention:
        return XMention(post_id=100 + user, conversation_id=user, author_id=user, text="@synth run df -h")
    return XMention, origin(XSettings(**CREDENTIALS["x"], allowed_users=[ALLOWED], strangers=policy)), make


def _reddit(policy: str) -> tuple[type, Any, Callable[[int], Any]]:
    from autoresponse.interfaces.reddit.interface import RedditItem, origin
    from autoresponse.interfaces.reddit.settings import RedditSettings

    def make(user: int) -> RedditItem:
        return RedditItem(fullname=f"t1_{user}", kind="username_mention", author=f"user{user}",
                          body="u/synth run df -h", link_id=str(user))
    return RedditItem, origin(RedditSettings(**CREDENTIALS["reddit"], allowed_users=[f"u/user{ALLOWED}"],
                                             strangers=policy)), make


def _telethon(policy: str) -> tuple[type, Any, Callable[[int], Any]]:
    from autoresponse.interfaces.telethon.interface import UserbotText, origin
    from autoresponse.interfaces.telethon.settings import TelethonSettings

    def make(user: int) -> UserbotText:
        return UserbotText(chat_id=user, message_id=5, sender_id=user, chat_type="private", text="run df -h")
    return UserbotText, origin(TelethonSettings(**CREDENTIALS["telethon"], allowed_users=[ALLOWED],
                                                strangers=policy)), make


PLATFORM_ORIGINS = {"telegram": _telegram, "x": _x, "reddit": _reddit, "telethon": _telethon}


@pytest.mark.parametrize("policy", ["silent", "refuse", "converse"])
@pytest.mark.parametrize("platform", PLATFORM_ORIGINS)
def test_each_platforms_origin_tells_an_allowed_user_and_never_a_stranger_or_a_malformed_input(
        platform: str, policy: str) -> None:
    """Whoever is allowed hears that their input died unread; a stranger never does: refused
    or ignored, nobody would have answered them, and a stranger's autonomous turn (converse)
    is never told either (on X and Reddit a notice is public: a crafted input must not make
    the account post). An input the origin cannot read names nobody, and raises nothing."""
    input_type, origin, make = PLATFORM_ORIGINS[platform](policy)
    assert len(told(input_type, origin, make(ALLOWED))) == 1
    assert told(input_type, origin, make(STRANGER)) == []
    stranger = origin(make(STRANGER))
    assert stranger is None if policy != "converse" else stranger.autonomous
    for malformed in (input_type.model_construct(), input_type.model_construct(chat_id=[1], author_id=[1],
                                                                                 author="x", post_id="x")):
        assert origin(malformed) is None
        assert told(input_type, origin, malformed) == []
    assert origin(object()) is None and origin(None) is None


def test_telegrams_origin_tells_a_group_only_of_a_message_meant_for_the_bot() -> None:
    input_type, origin, make = _telegram("refuse")
    chatter = make(ALLOWED).model_copy(update={"chat_id": -300, "chat_type": "group"})
    assert told(input_type, origin, chatter) == []
    assert told(input_type, origin, chatter.model_copy(update={"addressed": True})) == [-300]


# ---------------------------------------------------------------- strangers, within bounds


class _Runtime:
    """What ``take_request`` asks of an interface's runtime: its clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock


class Door:
    """An interface actor as ``take_request`` sees it: its runtime, and what it sends."""

    def __init__(self, runtime: _Runtime) -> None:
        self.runtime = runtime
        self.sent: list[Any] = []

    def send(self, to: str, body: Any, **kw: Any) -> None:
        self.sent.append(body)

    def take(self, interface: str, user: int, settings: Any, *, allowed: bool = False,
             media_group: str | None = None) -> None:
        context = OriginalContext(chat_id=user, message_id=1, interface_name=interface, user_id=user,
                                  chat_type="private")
        take_request(self, "hello", context, Envelope.new(PagerCall(pager="x")),  # type: ignore[arg-type]
                     allowed=allowed, policy=settings, media_group=media_group)


def _settings(platform: str, **fields: Any) -> StrangerSettings:
    from autoresponse.interfaces.reddit.settings import RedditSettings
    from autoresponse.interfaces.telegram import TelegramSettings
    from autoresponse.interfaces.telethon.settings import TelethonSettings
    from autoresponse.interfaces.x.settings import XSettings
    kinds: dict[str, type[StrangerSettings]] = {"telegram": TelegramSettings, "x": XSettings,
                                                "reddit": RedditSettings, "telethon": TelethonSettings}
    return kinds[platform](**fields)


@pytest.mark.parametrize("policy", ["silent", "refuse", "converse"])
@pytest.mark.parametrize("platform", PLATFORM_ORIGINS)
def test_each_platform_answers_a_stranger_within_bounds_a_window_and_an_allowed_user_always(
        platform: str, policy: str, caplog: pytest.LogCaptureFixture) -> None:
    """Two bots set to answer strangers, or one stranger's script, would be answered without
    end: a stranger gets one refusal (it says the same every time) or ``stranger_turns``
    autonomous turns a window, then nothing, with one log line, until the window is over.
    An allowed user is never counted; nor is the same name on another platform."""
    caplog.set_level(logging.DEBUG, logger="autoresponse.inbound")
    clock = ManualClock()
    door = Door(_Runtime(clock))
    settings = _settings(platform, strangers=policy, stranger_turns=3)
    answers = {"silent": 0, "refuse": 1, "converse": 3}[policy]

    def infos() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]

    for _ in range(5):
        door.take(platform, STRANGER, settings)
        door.take(platform, ALLOWED, settings, allowed=True)
    theirs = [m for m in door.sent if m.context.user_id == STRANGER]
    assert len(theirs) == answers
    assert all(isinstance(m, OutboundMessage if policy == "refuse" else UserRequest) for m in theirs)
    assert all(m.context.autonomous for m in theirs if isinstance(m, UserRequest))
    assert [m.text for m in door.sent if m.context.user_id == ALLOWED] == ["hello"] * 5
    assert len(infos()) == (2 if policy == "refuse" else 1)  # the refusal, and the first left unanswered
    assert "until their window of 1 hour is over" in infos()[-1]
    elsewhere = "reddit" if platform != "reddit" else "x"
    door.take(elsewhere, STRANGER, settings)  # the same id on another platform: a stranger of its own
    assert len(door.sent) == 5 + answers + (policy != "silent")

    clock.advance(settings.stranger_window - 1)  # still in the window: neither answered nor logged
    door.sent.clear()
    logged = len(infos())
    door.take(platform, STRANGER, settings)
    assert door.sent == [] and len(infos()) == logged
    clock.advance(1)  # the window is over: they are answered again, as at first
    for _ in range(5):
        door.take(platform, STRANGER, settings)
    assert len(door.sent) == answers


def test_the_items_of_a_strangers_album_are_one_turn() -> None:
    """An album comes as one message per item, and is one turn: it is counted once."""
    door = Door(_Runtime(ManualClock()))
    settings = _settings("telethon", strangers="converse", stranger_turns=1)
    for _ in range(3):
        door.take("telethon", STRANGER, settings, media_group="album-1")
    door.take("telethon", STRANGER, settings, media_group="album-2")  # the next turn: past the bound
    door.take("telethon", STRANGER, settings)
    assert [m.media_group for m in door.sent] == ["album-1"] * 3


def test_a_strangers_album_is_refused_once() -> None:
    """Refused, an album's items are not a refusal each: the stranger hears it once."""
    door = Door(_Runtime(ManualClock()))
    settings = _settings("telegram", strangers="refuse")
    for _ in range(10):
        door.take("telegram", STRANGER, settings, media_group="album-1")
    assert [m.text for m in door.sent] == [settings.refusal]


def test_the_stranger_gate_remembers_a_bounded_number_of_strangers() -> None:
    """The strangers' windows are an LRU: the one least recently heard from is forgotten
    first, and starts afresh should they come back; memory never grows past the bound."""
    gate = StrangerGate(kept=2)

    def admit(who: str) -> str:
        return gate.admit(("x", who), limit=1, window=3600.0, now=0.0)
    assert [admit("a"), admit("b"), admit("a")] == ["answer", "answer", "first past"]  # a is the newest
    assert admit("c") == "answer" and len(gate) == 2  # b, the least recent, is forgotten
    assert [admit("a"), admit("b")] == ["past", "answer"]  # b starts afresh
    runtime = _Runtime(ManualClock())
    assert stranger_gate(runtime) is stranger_gate(runtime)  # type: ignore[arg-type]  # one a runtime
    assert StrangerGate()._kept == STRANGERS_REMEMBERED


# ---------------------------------------------------------------- a platform configured in part


ROOT = Path(__file__).resolve().parent.parent
_APP = ("AUTORESPONSE_REDDIT__CLIENT_SECRET ([reddit] client_secret) and "
        "AUTORESPONSE_REDDIT__PASSWORD ([reddit] password)")
_REFRESH = "AUTORESPONSE_REDDIT__REFRESH_TOKEN ([reddit] refresh_token) instead of the password"
_X_KEYS = ("AUTORESPONSE_X__CONSUMER_KEY ([x] consumer_key), AUTORESPONSE_X__CONSUMER_SECRET ([x] "
           "consumer_secret), AUTORESPONSE_X__ACCESS_TOKEN ([x] access_token) and "
           "AUTORESPONSE_X__ACCESS_TOKEN_SECRET ([x] access_token_secret), or AUTORESPONSE_X__BEARER_TOKEN "
           "([x] bearer_token) instead of the four keys")
_TOKEN = ("Telegram needs a bot token too: set AUTORESPONSE_TELEGRAM__TOKEN ([telegram] token) to the "
          "token @BotFather gave the bot")
#: A platform set up in part, as operators did it: its variables, the docs' TOML example
#: of that platform (or none), and the one line that says what is still missing
#: (``{config}``: the file).
HALF_CONFIGURED: dict[str, tuple[dict[str, str], str | None, str]] = {
    "telegram, allowed users but no token": (
        {"AUTORESPONSE_TELEGRAM__ALLOWED_USERS": "[11111111]"}, None,
        f"AUTORESPONSE_TELEGRAM__ALLOWED_USERS: {_TOKEN}"),
    "telegram, a blank token ($UNSET)": (
        {"AUTORESPONSE_TELEGRAM__TOKEN": "", "AUTORESPONSE_TELEGRAM__ALLOWED_USERS": "[11111111]"}, None,
        f"AUTORESPONSE_TELEGRAM__ALLOWED_USERS: {_TOKEN}"),
    "reddit, the docs' file without the secrets": (
        {}, "reddit",
        f"{{config}}: [reddit] client_id is '...': Reddit needs more to log in: set {_APP}, or {_REFRESH}"),
    "reddit, the client secret but no password": (
        {"AUTORESPONSE_REDDIT__CLIENT_SECRET": "s3cr3t"}, "reddit",
        "{config}: [reddit] client_id is '...': Reddit needs more to log in: set "
        f"AUTORESPONSE_REDDIT__PASSWORD ([reddit] password), or {_REFRESH}"),
    "telethon, no session": (
        {"AUTORESPONSE_TELETHON__API_ID": "123", "AUTORESPONSE_TELETHON__API_HASH": "abc"}, None,
        "AUTORESPONSE_TELETHON__API_ID is 123: Telethon needs more to log in: set "
        "AUTORESPONSE_TELETHON__SESSION ([telethon] session)"),
    "telethon, the docs' file without the secrets": (
        {}, "telethon",
        "{config}: [telethon] api_id is 12345: Telethon needs more to log in: set "
        "AUTORESPONSE_TELETHON__API_HASH ([telethon] api_hash) and AUTORESPONSE_TELETHON__SESSION "
        "([telethon] session)"),
    "x, the docs' file without the keys": (
        {}, "x", f"{{config}}: [x] allowed_users: X needs more to log in: set {_X_KEYS}"),
}


def docs_example(platform: str, where: Path) -> Path:
    """The TOML example of docs/platforms/<platform>.md, written to a file in ``where``."""
    page = (ROOT / "docs" / "platforms" / f"{platform}.md").read_text()
    config = where / f"{platform}.toml"
    config.write_text(page.split("```toml\n", 1)[1].split("```", 1)[0])
    return config


@pytest.mark.parametrize("case", HALF_CONFIGURED)
def test_a_platform_configured_in_part_is_a_settings_error_naming_what_is_missing(
        case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Not a daemon that starts, looks healthy and never answers on that platform: the
    operator reads which variable (and file key) is still missing. A blank one is missing."""
    variables, docs, expected = HALF_CONFIGURED[case]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config = docs_example(docs, tmp_path) if docs else None
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    assert str(caught.value) == expected.format(config=config)
    assert "s3cr3t" not in str(caught.value)


@pytest.mark.parametrize("case", ["telegram, a blank token ($UNSET)",
                                  "reddit, the client secret but no password",
                                  "telethon, no session", "x, the docs' file without the keys"])
def test_the_daemon_refuses_to_start_a_platform_configured_in_part(case: str, tmp_path: Path) -> None:
    """One line and exit 2, before anything starts: not a healthy daemon without that platform."""
    variables, docs, expected = HALF_CONFIGURED[case]
    config = docs_example(docs, tmp_path) if docs else None
    with subprocess.Popen([sys.executable, "-m", "autoresponse", "run",
                           *(("--config", str(config)) if config else ())],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True,
                          env=environment(**variables, AUTORESPONSE_DATA_DIR=str(tmp_path / "data"),
                                          AUTORESPONSE_ADMIN__PORT=str(free_port()))) as daemon:
        try:
            _, stderr = daemon.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # it started: stop it, and show what it said
            daemon.terminate()
            _, stderr = daemon.communicate(timeout=60)
    assert (daemon.returncode, stderr) == (2, f"autoresponse: {expected.format(config=config)}\n")


def test_a_platform_nobody_set_up_stays_off_its_tuning_or_a_blank_credential_notwithstanding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tuning that works on its defaults, a blank credential (``export ...=$UNSET``) or an
    empty allowlist says no bot is meant: those platforms are simply off, as before."""
    untouched = {"AUTORESPONSE_TELEGRAM__TOKEN": "", "AUTORESPONSE_TELEGRAM__PARSE_MODE": "HTML",
                 "AUTORESPONSE_REDDIT__POLL_INTERVAL": "30", "AUTORESPONSE_REDDIT__PASSWORD": "",
                 "AUTORESPONSE_X__STRANGERS": "refuse", "AUTORESPONSE_TELETHON__ALLOWED_CHATS": "[]"}
    for name, value in untouched.items():
        monkeypatch.setenv(name, value)
    settings = Settings.load()
    assert [name for name in CREDENTIALS if settings.section(name).enabled] == []


@pytest.mark.parametrize("platform", CREDENTIALS)
def test_a_platforms_whole_credentials_turn_it_on(platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Either of Reddit's and X's ways to log in is whole (a refresh token, a bearer token)."""
    for name, value in CREDENTIALS[platform].items():
        monkeypatch.setenv(f"AUTORESPONSE_{platform.upper()}__{name.upper()}", str(value))
    assert Settings.load().section(platform).enabled
