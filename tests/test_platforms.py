"""One registration per platform: a platform defined here joins the configuration,
the tree, the action schema and the log redaction with no other edit."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from pydantic import BaseModel, SecretStr

from autoresponse import Application, Settings
from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors import routes
from autoresponse.actors.prompts import full_json_instructions
from autoresponse.app import names_in
from autoresponse.cli import RedactSecrets
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


def _mount(m: Mount) -> None:
    pages: list[str] = []
    m.expose(pages)
    m.pipeline(ChildSpec(routes.sender("pager"), PagerSender, (pages,)))


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
