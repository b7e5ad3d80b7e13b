"""Approval for risky actions (``terminal.approval = "ask"``): the command waits for its
owner or an approver to press Approve (a Telegram inline keyboard against the fake Bot
API, driven through python-telegram-bot; a prompt at the console), and the wait and the
decision are journaled.

The bot and the fake share a ManualClock: the expiry is a timer of the runtime's clock.
While an approval waits, the tests wait for the bot in real time (``wait_for``) and
advance the clock only on purpose, so that no pacing wait they fire is the expiry's."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import console_text, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors.approvals import CANNOT_RUN, FORGED, NOT_AN_APPROVER
from autoresponse.actors.journal import SqliteJournal
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.retry import GIVE_UP_NOTICE, OUTCOME_NOTICES
from autoresponse.app import StartError
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import Call, FakeTelegramServer

OWNER = 7
APPROVER = 99
STRANGER = 555
CHAT = 42
TIMEOUT = 120.0


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def run(command: str) -> FakeResponse:
    return actions({"type": "terminal", "payload": {"command": command}})


def say(text: str) -> FakeResponse:
    return actions({"type": "message_telegram_bot", "payload": {"text": text}})


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


@pytest.fixture
def ask_approval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings as an operator gives them."""
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__APPROVAL", "ask")
    monkeypatch.setenv("AUTORESPONSE_APPROVERS", f"[{APPROVER}]")
    monkeypatch.setenv("AUTORESPONSE_APPROVAL_TIMEOUT", str(TIMEOUT))


@pytest.fixture
def start_bot(ask_approval: None, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
              make_app: Callable[..., Application]) -> Callable[..., Application]:
    """A bot whose terminal asks for approval; called again, the same bot after a restart
    (the same data directory, so the same journal), maybe with other users or commands."""
    def start(allowed_users: tuple[int, ...] = (OWNER,), allowed: tuple[str, ...] = ("echo",)) -> Application:
        return make_app(base_url=fake_llm.base_url, allowed=allowed, telegram={
            "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
            "allowed_users": list(allowed_users), "poll_timeout": 1,
        }, clock=fake_telegram.clock)
    return start


def until(fake: FakeTelegramServer, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Fire the bot's timers in turn (a chat's pacing) until ``condition()`` holds: only once
    nothing waits for approval, whose expiry is a timer too."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition, timeout), "condition not met"
    return condition()


def prompts(fake: FakeTelegramServer, chat_id: int = CHAT) -> list[Call]:
    """The messages sent to ``chat_id`` with buttons under them."""
    return [c for c in fake.sent(chat_id) if c.params.get("reply_markup")]


def texts(fake: FakeTelegramServer, chat_id: int = CHAT) -> list[str]:
    return [c.params["text"] for c in fake.sent(chat_id)]


def answers(fake: FakeTelegramServer) -> list[dict[str, Any]]:
    return [c.params for c in fake.calls_to("answerCallbackQuery")]


def outputs(llm: FakeLLMServer) -> list[str]:
    """The command outputs the LLM was shown."""
    return [o["output"] for m in system_messages(llm, "output") for o in m["outputs"]]


def ask_for(fake: FakeTelegramServer, text: str) -> Call:
    """The user asks; the approval prompt that comes back to their chat."""
    fake.push_text(text, chat_id=CHAT, user_id=OWNER)
    [prompt] = wait_for(lambda: prompts(fake))
    return prompt


def test_approve_runs_the_command(start_bot: Callable[[], Application], fake_llm: FakeLLMServer,
                                  fake_telegram: FakeTelegramServer) -> None:
    fake_llm.script(run("echo approved-ok"), say("It printed approved-ok."))
    start_bot()
    prompt = ask_for(fake_telegram, "print approved-ok")
    assert "`echo approved-ok`" in prompt.params["text"]
    buttons = prompt.params["reply_markup"]["inline_keyboard"][0]
    assert [b["text"] for b in buttons] == ["Approve", "Deny"]
    [to_approver] = wait_for(lambda: prompts(fake_telegram, APPROVER))  # the approver is asked too
    assert "asked me to run `echo approved-ok`" in to_approver.params["text"]
    assert outputs(fake_llm) == []  # nothing ran yet

    fake_telegram.press(prompt, "Approve", user_id=OWNER)
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert answer["text"] == "Approved: running `echo approved-ok`." and answer["show_alert"] is False
    [edit] = wait_for(lambda: fake_telegram.calls_to("editMessageReplyMarkup"))  # the buttons are taken away
    assert edit.params["message_id"] == prompt.message_id
    until(fake_telegram, lambda: "It printed approved-ok." in texts(fake_telegram))  # paced after the prompt
    assert outputs(fake_llm) == ["approved-ok\n"]
    reply = fake_telegram.sent(CHAT)[-1]
    assert reply.params["reply_parameters"]["message_id"] == fake_telegram.sent(CHAT)[0].params[
        "reply_parameters"]["message_id"]  # threaded to the user's request, as the prompt was


def test_deny_tells_the_llm_which_tells_the_user(start_bot: Callable[[], Application], fake_llm: FakeLLMServer,
                                                 fake_telegram: FakeTelegramServer) -> None:
    fake_llm.script(run("echo denied-never"), say("OK: the approver said no, so I did not run it."))
    start_bot()
    prompt = ask_for(fake_telegram, "print something")
    [to_approver] = wait_for(lambda: prompts(fake_telegram, APPROVER))
    fake_telegram.press(to_approver, "Deny", user_id=APPROVER)  # from the approver's own chat
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert answer["text"] == "Denied: `echo denied-never` will not run."
    until(fake_telegram, lambda: "OK: the approver said no, so I did not run it." in texts(fake_telegram))
    [error] = system_messages(fake_llm, "error")
    assert "`echo denied-never`" in error["errors"][0] and "denied" in error["errors"][0]
    assert "did not run" in error["error_retry_policy"]  # not a re-ask's policy
    assert outputs(fake_llm) == []  # it never ran
    assert prompt.params["reply_markup"]  # (the requester's copy stays; pressing it now is too late)


def test_a_denial_the_llm_cannot_put_into_words_is_told_as_a_denial(
        start_bot: Callable[[], Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer) -> None:
    """The LLM answers nothing about the denial, however often asked: the user hears that it
    was denied and did not run, never an invitation to ask for it again."""
    fake_llm.script(run("echo denied-never"), *[FakeResponse(content='{"actions": []}')] * 3)
    start_bot()
    ask_for(fake_telegram, "print something")
    [to_approver] = wait_for(lambda: prompts(fake_telegram, APPROVER))
    fake_telegram.press(to_approver, "Deny", user_id=APPROVER)
    wait_for(lambda: answers(fake_telegram))  # the press is taken
    until(fake_telegram, lambda: OUTCOME_NOTICES["denied"] in texts(fake_telegram), timeout=60)
    assert GIVE_UP_NOTICE not in texts(fake_telegram)
    assert outputs(fake_llm) == []  # it never ran


def test_an_approval_expires_on_the_clock_with_a_notice(
    start_bot: Callable[[], Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
    manual_clock: ManualClock
) -> None:
    fake_llm.script(run("echo too-late"))
    start_bot()
    prompt = ask_for(fake_telegram, "print too-late")
    manual_clock.advance(TIMEOUT - 1)
    assert 1.0 in [round(left, 6) for left in manual_clock.pending()]  # the expiry: a second to go
    assert not any("in time" in t for t in texts(fake_telegram))
    manual_clock.advance(1)
    # Paced after the prompt: when the bot heard the prompt's answer only after the clock
    # had moved on (a slow machine), the notice waits a second of that clock.
    notice = until(fake_telegram, lambda: [t for t in texts(fake_telegram) if "in time" in t])
    assert notice == ["Nobody approved `echo too-late` in time, so it did not run."]
    fake_telegram.press(prompt, "Approve", user_id=OWNER)
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert answer["text"] == "Too late: `echo too-late` was already expired." and answer["show_alert"] is True
    [edit] = wait_for(lambda: fake_telegram.calls_to("editMessageReplyMarkup"))  # the stale buttons go
    assert edit.params["message_id"] == prompt.message_id
    assert outputs(fake_llm) == [] and len(fake_llm.requests) == 1


def test_a_stranger_and_a_forged_callback_are_refused_and_logged(
    start_bot: Callable[[], Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="autoresponse.approvals")
    fake_llm.script(run("echo guarded"), say("Done."))
    start_bot()
    prompt = ask_for(fake_telegram, "print guarded")
    fake_telegram.press(prompt, "Approve", user_id=STRANGER)
    approval_id = prompt.params["reply_markup"]["inline_keyboard"][0][0]["callback_data"].split(":", 1)[1]
    tampered = approval_id[:-1] + ("y" if approval_id.endswith("x") else "x")  # one in 62 ids ends in x
    fake_telegram.push_callback(f"approve:{tampered}", user_id=OWNER, chat_id=CHAT, message_id=prompt.message_id)
    fake_telegram.push_callback("run:rm -rf /", user_id=OWNER, chat_id=CHAT, message_id=prompt.message_id)
    refused = wait_for(lambda: len(answers(fake_telegram)) == 3 and answers(fake_telegram))
    # Each press is answered by a request of its own, so the three may arrive in any order.
    assert sorted((a["text"], a["show_alert"]) for a in refused) == sorted([
        (NOT_AN_APPROVER, True), (FORGED, True), (FORGED, True)])
    assert fake_telegram.calls_to("editMessageReplyMarkup") == []  # still waiting, buttons and all
    assert outputs(fake_llm) == []
    log = caplog.text
    assert "not an approver" in log and f"(user {STRANGER})" in log
    assert "forged or tampered" in log and "is no approval's" in log

    fake_telegram.press(prompt, "Approve", user_id=OWNER)  # the one who asked still may
    wait_for(lambda: len(answers(fake_telegram)) == 4)
    until(fake_telegram, lambda: "Done." in texts(fake_telegram))  # paced after the prompt
    assert outputs(fake_llm) == ["guarded\n"]


def left_waiting(start_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
                 word: str, then: FakeResponse) -> Call:
    """A bot asked to ``echo word`` (the LLM answering ``then`` after it) stopped while the
    command waits for approval: the approver's prompt."""
    fake_llm.script(run(f"echo {word}"), then)
    first = start_bot()
    prompt = ask_for(fake_telegram, f"print {word}")
    wait_for(lambda: prompts(fake_telegram, APPROVER))
    assert first.runtime.wait_idle(timeout=10)
    first.stop()
    return prompt


def test_a_restart_while_waiting_still_waits_then_approve_works(
    start_bot: Callable[[], Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
    manual_clock: ManualClock
) -> None:
    prompt = left_waiting(start_bot, fake_llm, fake_telegram, "after-restart", say("It printed after-restart."))

    start_bot()  # the same journal
    # It still waits, until the time it was given then; half of it passes.
    assert TIMEOUT in [round(left, 6) for left in manual_clock.pending()]
    manual_clock.advance(TIMEOUT / 2)
    fake_telegram.press(prompt, "Approve", user_id=OWNER)  # the button shown before the restart
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert answer["text"] == "Approved: running `echo after-restart`."
    until(fake_telegram, lambda: "It printed after-restart." in texts(fake_telegram))
    assert outputs(fake_llm) == ["after-restart\n"]
    assert len(prompts(fake_telegram)) == 1  # the request was not asked again, nor offered twice
    assert not any("in time" in t for t in texts(fake_telegram))


def test_a_requester_no_longer_allowed_after_a_restart_may_not_approve(
    start_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """The operator took the requester off ``allowed_users`` and restarted: their own
    pending command is no longer theirs to approve; an approver still may."""
    fake_llm.script(run("echo revoked"), say("It printed revoked."))
    first = start_bot()
    prompt = ask_for(fake_telegram, "print revoked")
    [to_approver] = wait_for(lambda: prompts(fake_telegram, APPROVER))
    assert first.runtime.wait_idle(timeout=10)
    first.stop()

    start_bot(allowed_users=(OWNER + 1,))  # the same journal; the requester revoked
    fake_telegram.press(prompt, "Approve", user_id=OWNER)
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert (answer["text"], answer["show_alert"]) == (NOT_AN_APPROVER, True)
    assert fake_telegram.calls_to("editMessageReplyMarkup") == []  # still waiting
    assert outputs(fake_llm) == [] and len(fake_llm.requests) == 1  # nothing ran

    fake_telegram.press(to_approver, "Approve", user_id=APPROVER)  # an approver keeps their right
    wait_for(lambda: len(answers(fake_telegram)) == 2)
    assert answers(fake_telegram)[1]["text"] == "Approved: running `echo revoked`."
    until(fake_telegram, lambda: "It printed revoked." in texts(fake_telegram))
    assert outputs(fake_llm) == ["revoked\n"]


def test_an_approval_of_a_command_taken_off_the_allowlist_cannot_run(
    start_bot: Callable[..., Application], fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """A restart took the command's program off the allowlist: approving it says it can no
    longer run (not "Approved: running"), settles it, and nothing runs."""
    fake_llm.script(run("echo unlisted"), say("never said"))
    first = start_bot(allowed=("echo", "uptime"))
    prompt = ask_for(fake_telegram, "print unlisted")
    [to_approver] = wait_for(lambda: prompts(fake_telegram, APPROVER))
    assert first.runtime.wait_idle(timeout=10)
    first.stop()

    start_bot(allowed=("uptime",))  # echo removed
    fake_telegram.press(to_approver, "Approve", user_id=APPROVER)
    [answer] = wait_for(lambda: answers(fake_telegram))
    said = CANNOT_RUN.format(command="`echo unlisted`",
                             reason="terminal: 'echo' is not on the allowlist (allowed: uptime)")
    assert (answer["text"], answer["show_alert"]) == (said, True)
    [edit] = wait_for(lambda: fake_telegram.calls_to("editMessageReplyMarkup"))  # settled: the buttons go
    assert edit.params["message_id"] == to_approver.message_id
    until(fake_telegram, lambda: said in texts(fake_telegram))  # the requester's chat hears it too
    fake_telegram.press(prompt, "Approve", user_id=OWNER)
    wait_for(lambda: len(answers(fake_telegram)) == 2)
    assert answers(fake_telegram)[1]["text"] == "Too late: `echo unlisted` was already refused."
    assert outputs(fake_llm) == [] and len(fake_llm.requests) == 1  # nothing ran, the LLM was not asked again


@pytest.mark.parametrize("turned_off", ["approval", "terminal"])
def test_a_command_left_waiting_when_approvals_are_turned_off_is_declined_with_a_notice(
    turned_off: str, start_bot: Callable[..., Application], make_app: Callable[..., Application],
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator set approval = "never" (or turned the terminal off) and restarted while a
    command waited: nobody may approve it now, so at the start it is declined as an expiry
    is, and its user told; the journal settles it, and the old button says so (not forged)."""
    prompt = left_waiting(start_bot, fake_llm, fake_telegram, "switched-off", say("never said"))

    monkeypatch.setenv("AUTORESPONSE_TERMINAL__APPROVAL", "never")
    if turned_off == "approval":
        second = start_bot()
    else:  # the same bot, without its terminal
        second = make_app(base_url=fake_llm.base_url, terminal=False, telegram={
            "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
            "allowed_users": [OWNER], "poll_timeout": 1}, clock=fake_telegram.clock)
    said = "Not approved: approvals were turned off while `echo switched-off` waited, so it did not run."
    until(fake_telegram, lambda: said in texts(fake_telegram))  # the requester hears it
    notice = next(c for c in fake_telegram.sent(CHAT) if c.params["text"] == said)
    assert notice.params["reply_parameters"]["message_id"] == prompt.params["reply_parameters"]["message_id"]
    assert isinstance(second.journal, SqliteJournal)
    assert [a["state"] for a in second.journal.approvals(None)] == ["declined"]  # settled in the journal

    fake_telegram.press(prompt, "Approve", user_id=OWNER)  # the button shown before the restart
    [answer] = wait_for(lambda: answers(fake_telegram))
    assert (answer["text"], answer["show_alert"]) == ("Too late: `echo switched-off` was already declined.", True)
    assert outputs(fake_llm) == [] and len(fake_llm.requests) == 1  # nothing ran, the LLM was not asked again
    assert texts(fake_telegram).count(said) == 1


def test_the_console_prompts_and_takes_a_typed_answer(fake_llm: FakeLLMServer, tmp_path: Path,
                                                      manual_clock: ManualClock) -> None:
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "echo typed-ok"}}),
                    actions({"type": "message_console", "payload": {"text": "It printed typed-ok."}}))
    settings = Settings.load(llm={"base_url": fake_llm.base_url}, admin={"enabled": False},
                             events={"enabled": False}, console={"read_stdin": False}, data_dir=tmp_path,
                             terminal={"enabled": True, "allowed_commands": ["echo"], "approval": "ask"})
    app = Application(settings, console=Console(io.StringIO()), clock=manual_clock).start()
    try:
        app.runtime.send("interface.console", ConsoleInput(text="print typed-ok"))
        prompt = wait_for(lambda: "Approval needed" in console_text(app) and console_text(app))
        assert "may I run `echo typed-ok`?" in prompt and "Approve: type /approve " in prompt
        assert outputs(fake_llm) == []
        app.runtime.send("interface.console", ConsoleInput(text="/approve"))
        wait_for(lambda: "It printed typed-ok." in console_text(app))
        assert "Approved: running `echo typed-ok`." in console_text(app)
        assert outputs(fake_llm) == ["typed-ok\n"]
    finally:
        app.stop()


def test_approval_refuses_to_start_without_a_journal_to_keep_it(
    ask_approval: None, make_app: Callable[..., Application]
) -> None:
    with pytest.raises(StartError, match=r"terminal approval = \"ask\" needs the SQLite journal"):
        make_app(journal={"enabled": False})
