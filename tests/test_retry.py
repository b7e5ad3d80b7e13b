"""Error routing: invalid LLM replies are re-asked by retry actors, within bounds.

A re-ask waits its delay on a timer of the runtime's clock: these tests run the application
on a ManualClock, and ``ask(..., clock=...)`` fires the timers in turn (no real waiting)."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ask, system_message, system_messages

from autoresponse import Application
from autoresponse.actors.failures import FAILURE_NOTICE
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.kernel.testkit import InjectedFault
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.prompts import error_retry_policy
from autoresponse.actors.retry import DONE_NOTICE, GIVE_UP_NOTICE, OUTCOME_NOTICES, PARTLY_DONE_NOTICE
from autoresponse.actors.routes import BUILDER, DISPATCHER, LLM, executor, sender
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.messages import (
    ActionRequest,
    Envelope,
    LLMReply,
    LLMRequest,
    OriginalContext,
    OutboundMessage,
    UserRequest,
)

MakeApp = Callable[..., Application]
#: Re-ask delays as long as in production: the clock is a ManualClock, they cost no real time.
FAST = {"backoff_min": 5.0, "backoff_max": 20.0}


def say(text: str, **payload: Any) -> dict[str, Any]:
    return {"type": "message_console", "payload": {"text": text, **payload}}


def content(*actions: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(actions)}))


def test_one_bad_reply_is_re_asked_once_and_answered_once(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content="Sure thing! {not json"), content(say("All good now.")))
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        envelope = app.runtime.send("interface.console", ConsoleInput(text="hello"))
        assert envelope is not None
        assert manual_clock.wait_for_sleepers(1)  # the re-ask waits for its delay ...
        assert manual_clock.pending() == [5.0] and len(fake_llm.requests) == 1
        manual_clock.advance(5)  # ... and is sent once it has passed
        assert app.runtime.wait_idle(envelope.correlation_id, timeout=15)
        assert [m.text for m in out.bodies(OutboundMessage)] == ["All good now."]
    first, reask = fake_llm.requests
    error = system_message(reask)
    assert error["type"] == "error"
    assert error["error_retry_policy"] == error_retry_policy(["message_console", "terminal"], "tools")
    assert "Answer only for the rejected positions" in error["error_retry_policy"]
    assert error["your_reply"] == "Sure thing! {not json"
    assert error["errors"] and "invalid JSON" in error["errors"][0]
    # The conversation so far is kept: the user's text and the rejected reply.
    assert reask.messages[-3:-1] == [{"role": "user", "content": "hello"},
                                     {"role": "assistant", "content": "Sure thing! {not json"}]
    assert app.runtime.dead_letters.letters() == []


def test_valid_actions_run_once_and_only_the_invalid_are_re_asked(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(
        content(say("part one"), {"type": "teleport", "payload": {}}),
        # The re-ask repeats the message already delivered, then adds the fixed one.
        content(say("part one"), say("part two")),
    )
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "tell me in two parts", clock=manual_clock)
        assert [m.text for m in out.bodies(OutboundMessage)] == ["part one", "part two"]
    errors = system_message(fake_llm.requests[1])["errors"]
    assert errors == ["action 2: unknown action type 'teleport'; allowed: message_console, terminal"]


def test_a_turn_that_stays_invalid_is_dead_lettered_with_a_notice_while_other_chats_are_served(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.responder = lambda body: "I refuse to speak {JSON" if "garbage please" in json.dumps(body) else None
    app = make_app(base_url=fake_llm.base_url, retry={"max_attempts": 2, "backoff_min": 0.3}, clock=manual_clock)
    bad = OriginalContext(chat_id="A", message_id=1, interface_name="console", original_command="garbage please")
    good = OriginalContext(chat_id="B", message_id=2, interface_name="console", original_command="hello")
    with app.runtime.probe(sender("console")) as out:
        env_bad = app.runtime.send(LLM, UserRequest(text="garbage please", context=bad))
        env_good = app.runtime.send(LLM, UserRequest(text="hello", context=good))
        served = out.expect(OutboundMessage, where=lambda m: m.chat_id == "B", timeout=10)
        served_at = manual_clock.time()  # chat A's re-asks are still waiting for their delay
        assert manual_clock.advance_until(lambda: app.runtime.inflight.count(env_bad.correlation_id) == 0)
        assert app.runtime.wait_idle(env_bad.correlation_id, timeout=20)
        assert app.runtime.wait_idle(env_good.correlation_id, timeout=20)
        [notice] = [m for m in out.bodies(OutboundMessage) if m.chat_id == "A"]
    assert "Hello!" in served.body.text
    assert notice.notice and notice.text == GIVE_UP_NOTICE and notice.reply_to_message_id == 1
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "retries exhausted"
    assert letter.detail.startswith("still invalid after 2 re-asks: your reply is not an action list")
    assert letter.time > served_at  # chat B was answered while chat A was still being retried
    asked_for_a = [r for r in fake_llm.requests if "garbage please" in r.raw]
    assert len(asked_for_a) == 3  # the first ask and two re-asks


def test_the_notice_can_be_switched_off(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.responder = lambda body: "never {JSON"
    app = make_app(base_url=fake_llm.base_url, retry={"max_attempts": 1, "notify_user": False, **FAST},
                   clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "hello", clock=manual_clock)
        assert out.envelopes == []
    assert [d.reason for d in app.runtime.dead_letters.letters()] == ["retries exhausted"]
    assert len(fake_llm.requests) == 2


def test_an_autonomous_turn_that_gives_up_says_nothing(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A stranger's turn (``strangers = "converse"``) the bot may leave unanswered: when its
    re-asks run out nothing is posted (on X or Reddit it would be public), only the dead letter."""
    fake_llm.responder = lambda body: "never {JSON"
    app = make_app(base_url=fake_llm.base_url, retry={"max_attempts": 1, **FAST}, clock=manual_clock)
    ctx = OriginalContext(chat_id="A", message_id=1, interface_name="console", original_command="hi",
                          autonomous=True)
    with app.runtime.probe(sender("console")) as out:
        env = app.runtime.send(LLM, UserRequest(text="hi", context=ctx))
        assert manual_clock.advance_until(lambda: app.runtime.inflight.count(env.correlation_id) == 0)
        assert app.runtime.wait_idle(env.correlation_id, timeout=20)
        assert out.envelopes == []
    assert [d.reason for d in app.runtime.dead_letters.letters()] == ["retries exhausted"]


def test_a_dead_lettered_turn_can_be_replayed(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content="{nope"), FakeResponse(content="{still nope"))
    app = make_app(base_url=fake_llm.base_url, retry={"max_attempts": 1, "notify_user": False, **FAST},
                   clock=manual_clock)
    ask(app, "hello", clock=manual_clock)
    [letter] = app.runtime.dead_letters.letters()
    # The LLM behaves now: replaying asks again, with the errors so far, and answers the user.
    with app.runtime.probe(sender("console")) as out:
        env = app.runtime.replay(letter.id)
        assert env is not None and env.attempt == 2
        assert app.runtime.wait_idle(env.correlation_id, timeout=10)
        [reply] = out.bodies(OutboundMessage)
    assert reply.reply_to_message_id == 1 and not reply.notice
    assert system_message(fake_llm.requests[-1])["your_reply"] == "{still nope"


@pytest.mark.parametrize(("max_errors", "shown", "rest"), [(10, 10, 5), (12, 12, 3), (20, 15, 0)])
def test_errors_are_cut_once_to_the_configured_number(
    make_app: MakeApp, fake_llm: FakeLLMServer, max_errors: int, shown: int, rest: int,
    manual_clock: ManualClock
) -> None:
    bad = [{"type": "teleport", "payload": {"to": n}} for n in range(15)]
    fake_llm.script(content(*bad), content(say("Fixed.")))
    app = make_app(base_url=fake_llm.base_url, retry={**FAST, "max_errors": max_errors},
                   runtime={"max_actions": 20}, clock=manual_clock)
    ask(app, "hello", clock=manual_clock)
    errors = system_message(fake_llm.requests[1])["errors"]
    listed = [e for e in errors if not e.startswith("...")]
    assert len(listed) == shown
    assert errors[shown:] == ([f"... and {rest} more errors"] if rest else [])


# ------------------------------------------------------------------ what the user hears when a turn gives up


@pytest.mark.parametrize("answer", [
    FakeResponse(content=""),
    FakeResponse(content="", reasoning="The output shows the load average, so I should say ..."),
    FakeResponse(content='{"actions": []}'),
    FakeResponse(content="garbage {"),
], ids=["empty", "reasoning-only", "empty-action-list", "garbage"])
def test_a_delivery_turn_that_gives_up_says_the_command_ran_and_invites_no_retry(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, answer: FakeResponse
) -> None:
    """The command ran; its delivery turn answers nothing usable, however often asked: the
    user hears that it was done (asking again would run it twice), never silence."""
    def responder(body: dict[str, Any]) -> FakeResponse | None:
        delivery = '"system_message"' in str(body["messages"][-1].get("content"))
        return answer if delivery else None  # the chat turn: the stand-in runs `uptime`

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(executor("terminal")) as ran, app.runtime.probe(sender("console")) as out:
        ask(app, "run uptime", clock=manual_clock)
        assert [r.action.payload.command for r in ran.bodies(ActionRequest)] == ["uptime"]
        sent = out.bodies(OutboundMessage)
    assert [(m.text, m.notice) for m in sent] == [(DONE_NOTICE, True)]
    assert "try" not in DONE_NOTICE and "rephras" not in DONE_NOTICE
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "retries exhausted"
    output, *reasks = system_messages(fake_llm)
    assert output["type"] == "output" and [m["type"] for m in reasks] == ["error", "error"]
    if answer.content != "garbage {":
        assert all(m["errors"][-1].endswith("the user is still waiting for the result: present it "
                                            "to them in a message") for m in reasks)


@pytest.mark.parametrize("command, notice", [
    ("uptime", OUTCOME_NOTICES["done"]),
    ("date --date=notadate", OUTCOME_NOTICES["failed"]),  # it ran, and exited 1
], ids=["succeeded", "failed"])
def test_a_delivery_turn_that_gives_up_says_what_became_of_the_command(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, command: str, notice: str
) -> None:
    """A command that failed is never called done: the user hears it did not succeed."""
    def responder(body: dict[str, Any]) -> FakeResponse | None:
        if system_message(SimpleNamespace(messages=body["messages"])) is None:  # the chat turn
            return content({"type": "terminal", "payload": {"command": command}})
        return FakeResponse(content='{"actions": []}')

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "please run it", clock=manual_clock)
        sent = [(m.text, m.notice) for m in out.bodies(OutboundMessage)]
    [output] = system_messages(fake_llm, "output")
    assert output["outputs"][0]["ok"] is (command == "uptime")
    assert sent == [(notice, True)]


def test_a_delivery_turns_empty_answer_is_nothing_more_only_once_it_delivered(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """Two delivery turns answer nothing to their re-ask: the one whose first answer reached
    the user ends there; the one whose first answer was all rejected gets a notice."""
    def responder(body: dict[str, Any]) -> FakeResponse | None:
        message = system_message(SimpleNamespace(messages=body["messages"]))
        if message is None:
            return None  # a chat turn: the stand-in runs the command
        if message["type"] == "error":
            return FakeResponse(content='{"actions": []}')
        shown = [say("Up for a while."), {"type": "teleport", "payload": {}}]
        return content(*shown) if "uptime" in json.dumps(message) else content(shown[1])

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "run uptime", clock=manual_clock)
        assert [(m.text, m.notice) for m in out.bodies(OutboundMessage)] == [("Up for a while.", False)]
        assert app.runtime.dead_letters.letters() == []
        ask(app, "run date", clock=manual_clock)
        assert [(m.text, m.notice) for m in out.bodies(OutboundMessage)][1:] == [(DONE_NOTICE, True)]
    assert [d.reason for d in app.runtime.dead_letters.letters()] == ["retries exhausted"]


def test_a_chat_turn_that_gives_up_after_doing_part_of_it_says_so(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(content(say("Here is part one."), {"type": "teleport", "payload": {}}),
                    FakeResponse(content="{nope"), FakeResponse(content="{still nope"))
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "tell me in two parts", clock=manual_clock)
        sent = out.bodies(OutboundMessage)
    assert [(m.text, m.notice) for m in sent] == [("Here is part one.", False), (PARTLY_DONE_NOTICE, True)]
    assert [d.reason for d in app.runtime.dead_letters.letters()] == ["retries exhausted"]


# ------------------------------------------------------------------ what the user hears when a request dies


def crash_on(actor: str, picks: Callable[[Any], bool]) -> Callable[[str, Envelope], None]:
    """A ``runtime.fault``: ``actor`` crashes on every attempt at a message ``picks`` picks."""
    def fault(name: str, envelope: Envelope) -> None:
        if name == actor and picks(envelope.body):
            raise InjectedFault(f"injected fault in {actor}")
    return fault


def turn(mode: str, reask: int = 0) -> Callable[[Any], bool]:
    """Picks a message of an LLM turn of ``mode`` (a prompt, its reply), re-asked ``reask`` times."""
    return lambda body: (isinstance(body, (LLMRequest, LLMReply))
                         and (body.prompt.mode, body.prompt.reask) == (mode, reask))


@pytest.mark.parametrize("actor, picks, commands, ran, notice", [
    (BUILDER, lambda body: True, ["uptime"], ["uptime"], OUTCOME_NOTICES["done"]),
    (BUILDER, lambda body: True, ["date --date=notadate"], ["date --date=notadate"], OUTCOME_NOTICES["failed"]),
    (BUILDER, lambda body: True, ["uptime", "hostname"], ["uptime", "hostname"], PARTLY_DONE_NOTICE),
    (LLM, turn("delivery"), ["uptime"], ["uptime"], OUTCOME_NOTICES["done"]),
    (DISPATCHER, turn("delivery"), ["uptime"], ["uptime"], OUTCOME_NOTICES["done"]),
    (LLM, lambda body: isinstance(body, UserRequest), ["uptime"], [], FAILURE_NOTICE),  # nothing ran
], ids=["builder-done", "builder-failed", "builder-one-of-two", "llm-delivery", "dispatcher-delivery",
        "llm-chat-nothing-ran"])
def test_a_request_that_dies_after_its_command_ran_says_so_and_invites_no_retry(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, actor: str,
    picks: Callable[[Any], bool], commands: list[str], ran: list[str], notice: str
) -> None:
    """A message of the request crashes its actor on every attempt after the command ran (the
    builder on its output, the LLM or the dispatcher on its delivery turn): the user hears what
    became of the command, never "Please try again" (asking again would run it twice)."""
    def responder(body: dict[str, Any]) -> FakeResponse | None:
        if system_message(SimpleNamespace(messages=body["messages"])) is None:  # the chat turn
            return content(*({"type": "terminal", "payload": {"command": c}} for c in commands))
        return content(say("Here is what it said."))

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, supervision={"message_attempts": 2})
    app.runtime.fault = crash_on(actor, picks)
    with app.runtime.probe(executor("terminal")) as executed, app.runtime.probe(sender("console")) as out:
        ask(app, "please run it", clock=manual_clock)
        out.expect(OutboundMessage, where=lambda m: m.notice)  # the notice is work of its own
        sent = [(m.text, m.notice) for m in out.bodies(OutboundMessage)]
    assert [r.action.payload.command for r in executed.bodies(ActionRequest)] == ran
    assert [(d.reason, d.actor) for d in app.runtime.dead_letters.letters()][:1] == [("crash", actor)]
    [(text, is_notice)] = sent
    assert is_notice and ("Please try again" in text) == (not ran)  # only when nothing ran
    assert text == notice  # and what became of it, when something did


def test_a_re_ask_that_dies_after_part_of_the_reply_went_out_says_part_was_done(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """Part one of the reply was delivered, its re-ask crashes the LLM on every attempt: the
    user hears that part was done, not that nothing was."""
    fake_llm.script(content(say("Here is part one."), {"type": "teleport", "payload": {}}))
    app = make_app(base_url=fake_llm.base_url, retry=FAST, clock=manual_clock,
                   supervision={"message_attempts": 2})
    app.runtime.fault = crash_on(LLM, turn("chat", reask=1))
    with app.runtime.probe(sender("console")) as out:
        ask(app, "tell me in two parts", clock=manual_clock)
        out.expect(OutboundMessage, where=lambda m: m.notice)
        sent = [(m.text, m.notice) for m in out.bodies(OutboundMessage)]
    assert sent == [("Here is part one.", False), (PARTLY_DONE_NOTICE, True)]
    assert [(d.reason, d.actor) for d in app.runtime.dead_letters.letters()] == [("crash", LLM)]
