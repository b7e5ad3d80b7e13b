"""The whole loop: console → LLM → executor → LLM (delivery) → console, against a fake LLM."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel
from conftest import ask, console_text, system_messages, wait_for

from autoresponse import Application, request_llm_delivery
from autoresponse.actors.kernel import ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import CONVERSATIONS, LLM, executor, interface, sender
from autoresponse.actors.kernel.testkit import FaultInjector
from autoresponse.actors.failures import FAILURE_NOTICE, NOTICE_SUFFIX
from autoresponse.actors.retry import OUTCOME_NOTICES
from autoresponse.actors.prompts import build_chat_request
from autoresponse.messages.approval import ApprovalAnswer
from autoresponse.app import RETRY
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.messages import (
    ActionRequest,
    Envelope,
    LLMRequest,
    OriginalContext,
    OutboundMessage,
    Rejection,
    ReplyDelivered,
    UserRequest,
)

MakeApp = Callable[..., Application]


def actions(*items: dict) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def terminal(command: str) -> dict:
    return {"type": "terminal", "payload": {"command": command}}


def reply(text: str, **payload: object) -> dict:
    return {"type": "message_console", "payload": {"text": text, **payload}}


def test_the_delivery_request_carries_output_context_and_only_message_actions(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(LLM) as at_llm:
        ask(app, "run echo hello-from-the-terminal")
        delivery = at_llm.expect(LLMRequest, where=lambda r: r.prompt.mode == "delivery").body

    # In process: built from a PromptRequest in delivery mode, around an output system message.
    assert delivery.prompt.system_message is not None
    assert delivery.prompt.system_message.type == "output"
    # On the wire: what the fake LLM received.
    chat, sent = fake_llm.requests
    assert chat.messages[-1]["content"] == "run echo hello-from-the-terminal"
    message = json.loads(sent.messages[-1]["content"])["system_message"]
    assert message["type"] == "output"
    [output] = message["outputs"]
    assert output["command"] == "echo hello-from-the-terminal"
    assert output["output"].strip() == "hello-from-the-terminal"
    assert message["original_context"] == {
        "chat_id": "console", "message_id": 1, "interface_name": "console",
        "original_command": "run echo hello-from-the-terminal",
        "user_name": message["original_context"]["user_name"], "chat_type": "private",
        "autonomous": False,
    }
    # Fail-closed in the tools protocol too: only the reply's message action is offered.
    assert [t["function"]["name"] for t in sent.body["tools"]] == ["message_console"]
    assert sent.body["tool_choice"] == "required"
    instructions = message["full_json_instructions"]
    assert "message_console" in instructions and "terminal" not in instructions


def test_the_reply_goes_to_the_original_chat_as_a_reply(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(actions(terminal("echo 42")), actions(reply("The answer is 42.")))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "what is the answer?")
        [sent] = out.bodies(OutboundMessage)
    assert (sent.chat_id, sent.reply_to_message_id, sent.text) == ("console", 1, "The answer is 42.")
    assert "↳#1 │ The answer is 42." in console_text(app)


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_a_reply_comes_back_on_either_event_loop(make_app: MakeApp, fake_llm: FakeLLMServer,
                                                  event_loop: str) -> None:
    """The setting ``runtime.event_loop`` chooses the loop all I/O runs on (a real LLM call,
    a real subprocess here), and the whole path works on either."""
    fake_llm.script(actions(terminal("echo 42")), actions(reply("The answer is 42.")))
    app = make_app(base_url=fake_llm.base_url, runtime={"event_loop": event_loop})
    assert (type(app.runtime.io.loop).__module__.split(".")[0] == "uvloop") is (event_loop == "uvloop")
    ask(app, "what is the answer?")
    assert "↳#1 │ The answer is 42." in console_text(app)


def test_a_delivery_answers_its_own_chat_whatever_target_it_names(make_app: MakeApp,
                                                                   fake_llm: FakeLLMServer) -> None:
    """Output of the user's action goes back to the user's chat, nowhere else: a target a
    delivery names (its own chat, a name, another chat's id that a chat turn would send
    to) is no choice of chat there. The message goes to the original chat, not re-asked."""
    fake_llm.script(actions(terminal("echo 1")), actions(reply("here", target="console")),
                    actions(terminal("echo 2")), actions(reply("not elsewhere", target="elsewhere")),
                    actions(terminal("echo 3")), actions(reply("nor there", target=12345)))
    app = make_app(base_url=fake_llm.base_url, retry={"max_attempts": 0})
    with app.runtime.probe(sender("console")) as out, app.runtime.probe(RETRY) as retry:
        for text in ("first", "second", "third"):
            ask(app, text)
        assert [(m.chat_id, m.text) for m in out.bodies(OutboundMessage)] == [
            ("console", "here"), ("console", "not elsewhere"), ("console", "nor there")]
        assert retry.bodies(Rejection) == []


#: llama.cpp's server as /props describes it: a chat template without tools, so the engine
#: speaks json_schema (a grammar), as it did live with SmolLM2-135M.
LLAMA_CPP_PROPS = {"default_generation_settings": {"n_ctx": 4096}, "chat_template_caps": {"supports_tools": False}}


def test_a_command_output_delivered_with_a_junk_target_reaches_the_user(make_app: MakeApp) -> None:
    """SmolLM2-135M under the grammar delivered `date`'s output as the text and again as
    "target" (it fills in every field it sees). The output is what the user asked for: the
    target is dropped, and traced, and the text shown at once, never thrown away for a
    re-ask (asked again without the grammar, the model answered nonsense)."""
    def model(body: dict[str, Any]) -> str:
        asked = str(body["messages"][-1]["content"])
        if '"type": "output"' not in asked:
            return json.dumps({"actions": [terminal("date")]})
        output = json.loads(asked)["system_message"]["outputs"][0]["output"]
        return json.dumps({"actions": [reply(output, target=output)]})

    with FakeLLMServer(responder=model, props=LLAMA_CPP_PROPS) as llm:
        app = make_app(base_url=llm.base_url)
        with app.runtime.probe(sender("console")) as out:
            envelope = ask(app, "date")
            sent = out.bodies(OutboundMessage)
    [output] = json.loads(llm.requests[1].messages[-1]["content"])["system_message"]["outputs"]
    assert [(m.chat_id, m.text, m.notice) for m in sent] == [("console", output["output"], False)]
    # The chat turn and its delivery, both under the grammar: nothing asked again.
    assert ["response_format" in r.body for r in llm.requests] == [True, True]
    notes = [note for hop in app.runtime.trace(envelope.correlation_id) for note in hop.get("notes", ())]
    assert "action 1 (message_console): dropped what cannot apply in this chat" in notes


def test_several_outputs_are_delivered_in_one_llm_turn(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    app = make_app(base_url=fake_llm.base_url)
    ctx = OriginalContext(chat_id="console", message_id=9, interface_name="console",
                          original_command="check the box")
    with app.runtime.probe(sender("console")) as out:
        env = request_llm_delivery(
            "Filesystem 42%", ctx, action_type="terminal", command="df -h",
            action_outputs=[{"action_type": "terminal", "command": "uptime", "output": "load 0.1"},
                            {"action_type": "terminal", "command": "date", "output": "Mon"}],
            runtime=app.runtime,
        ).envelope
        assert env is not None and app.runtime.wait_idle(env.correlation_id, 15)
        [sent] = out.bodies(OutboundMessage)
    [request] = fake_llm.requests
    outputs = json.loads(request.messages[-1]["content"])["system_message"]["outputs"]
    assert [o["command"] for o in outputs] == ["df -h", "uptime", "date"]
    assert sent.reply_to_message_id == 9
    assert "`uptime` finished" in sent.text and "`date` finished" in sent.text


def test_the_seeds_call_is_awaited_with_a_dict_context_whose_extra_keys_reach_the_llm(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    """The seed's interfaces write ``await request_llm_delivery(output=..., original_context={...},
    action_type=..., command=...)`` from a coroutine, with keys of their own in the context."""
    app = make_app(base_url=fake_llm.base_url)
    seed_context = {"chat_id": "console", "message_id": 5, "interface_name": "console",
                    "original_command": "synth, run df -h",
                    "action_specific_data": {"mount": "/", "threshold": 90}}

    async def seed_interface() -> Any:
        return await request_llm_delivery(output="/dev/sda1 42%", original_context=seed_context,
                                          action_type="terminal", command="df -h")

    with app.runtime.probe(sender("console")) as out:
        envelope = app.runtime.io.run(seed_interface(), timeout=10)  # awaited on the runtime's loop
        assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, 15)
        [reply] = out.bodies(OutboundMessage)
    assert reply.reply_to_message_id == 5
    [request] = fake_llm.requests
    message = json.loads(request.messages[-1]["content"])["system_message"]
    assert message["original_context"]["action_specific_data"] == {"mount": "/", "threshold": 90}
    # From a plain thread the same call sends at once, and needs no await.
    assert request_llm_delivery("x", seed_context, action_type="terminal").envelope is not None
    assert app.runtime.wait_idle(timeout=15)


def test_request_llm_delivery_uses_the_running_runtime(make_app: MakeApp) -> None:
    app = make_app()
    ctx = OriginalContext(chat_id="console", message_id=3, interface_name="console")
    with app.runtime.probe(sender("console")) as out:
        request_llm_delivery("done", ctx, action_type="terminal", command="make")
        assert "`make` finished" in out.expect(OutboundMessage, timeout=15).body.text


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("Sure! {oops this is not json", "invalid JSON"),
        ('{"type": "teleport", "payload": {"to": "mars"}}', "unknown action type 'teleport'"),
        ('{"type": "terminal", "payload": {"cmd": "df -h"}}', "payload.command: Field required"),
    ],
    ids=["invalid-json", "unknown-type", "invalid-payload"],
)
def test_bad_llm_output_becomes_an_error_system_message(
    make_app: MakeApp, fake_llm: FakeLLMServer, bad: str, error: str
) -> None:
    fake_llm.script(FakeResponse(content=bad))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(executor("terminal")) as ran, app.runtime.probe(RETRY) as retry:
        ask(app, "run df -h")
        assert ran.envelopes == []
        [rejected] = retry.bodies(Rejection)
    message = rejected.message
    assert message.type == "error"
    assert error in message.errors[0]
    assert message.your_reply == bad
    assert message.error_retry_policy and "Answer only for the rejected positions" in message.error_retry_policy
    assert message.original_context.original_command == "run df -h"
    assert "Allowed action types in this turn" in message.full_json_instructions


def test_a_delivery_turn_never_runs_a_command(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(actions(terminal("echo first")), actions(terminal("echo second")))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(executor("terminal")) as ran, app.runtime.probe(RETRY) as retry:
        ask(app, "run echo first")
        assert [r.action.payload.command for r in ran.bodies(ActionRequest)] == ["echo first"]
        [rejected] = retry.bodies(Rejection)
    assert rejected.prompt.mode == "delivery"
    assert "'terminal' is not allowed in this turn; allowed: message_console" in rejected.message.errors[0]


def test_the_hop_limit_ends_a_chain(make_app: MakeApp) -> None:
    app = make_app(runtime={"max_hops": 3})
    envelope = app.runtime.accept(interface("console"), ConsoleInput(text="run date")).result(5)
    assert app.runtime.wait_idle(timeout=15)
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "hop limit"
    assert letter.envelope.hops == 4
    assert console_text(app).count(FAILURE_NOTICE) == 1  # whoever asked is told
    assert journal_state(app, envelope.correlation_id) == "dead"  # a failure: not resumed, not done


def journal_state(app: Application, correlation: str) -> str:
    """The state its journal item closed in: its close is written as its work ends, which
    may be just after ``wait_idle`` returns."""
    assert app.journal is not None
    path = app.journal.path

    def closed() -> str | None:
        with sqlite3.connect(path) as db:
            [(state,)] = db.execute("SELECT state FROM items WHERE correlation = ?", (correlation,))
        return None if state == "open" else state

    return wait_for(closed, timeout=10)


def test_a_failure_is_told_once_a_request_and_only_where_someone_waits_for_an_answer(make_app: MakeApp) -> None:
    """One notice however many of a request's messages die; none for a reason that has its
    own word or reaches nobody, an autonomous turn, a reminder's turn (its scheduler tries
    it again), a notice or a preview that failed, a reply's memory, or an approval."""
    app = make_app()
    console = OriginalContext(chat_id="console", message_id=1, interface_name="console")
    post = app.runtime.dead_letters.post
    request = Envelope.new(UserRequest(text="hi", context=console))
    with app.runtime.probe(sender("console")) as out:
        post(request, "crash", actor=LLM)
        post(request.child(LLMRequest(prompt=build_chat_request("hi", console, allowed_actions=("message_console",)))),
             "hop limit", actor=LLM)
        for reason in ("unreachable chat", "retries exhausted", "no handler"):
            post(Envelope.new(UserRequest(text="hi", context=console)), reason, actor=LLM)
        for context in (console.model_copy(update={"autonomous": True}),
                        console.model_copy(update={"receipt_to": "events", "receipt_key": "event-7"})):
            post(Envelope.new(UserRequest(text="hi", context=context)), "crash", actor=LLM)
        for quiet in (OutboundMessage.reply(console, "a notice", notice=True),
                      OutboundMessage.reply(console, "half a reply", preview=True, key="k"),
                      ReplyDelivered(context=console, text="said"),
                      ApprovalAnswer(approval_id=None, approve=True, context=console)):
            post(Envelope.new(quiet), "crash", actor=sender("console"))
        assert app.runtime.wait_idle(timeout=10)
        [notice] = out.envelopes
    assert notice.body.text == FAILURE_NOTICE and notice.body.notice
    # Work of its own: the request's item closes whatever becomes of the notice.
    assert notice.correlation_id == request.correlation_id + NOTICE_SUFFIX
    assert console_text(app).count(FAILURE_NOTICE) == 1


class PagerInput(BaseModel):
    """A platform's input that no platform mounted here registers an origin for."""

    chat: str


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the letters keep the malformed inputs
def test_an_input_that_dies_unread_is_told_by_its_platforms_origin_once_and_a_malformed_one_never(
        make_app: MakeApp) -> None:
    """An input its interface never turned into a request is told of through the origin its
    platform registered, once a request; one the origin cannot read (or that makes it raise,
    or that it gives no context for) is told nothing, and nothing crashes."""
    app = make_app()
    post = app.runtime.dead_letters.post
    line = Envelope.new(ConsoleInput(text="run date"))
    with app.runtime.probe(sender("console")) as out:
        for malformed in (ConsoleInput.model_construct(text=None), ConsoleInput.model_construct(),
                          ConsoleInput.model_construct(text="hi", chat_id=["not", "a", "chat"]),
                          ConsoleInput(text="/approve")):  # an approval's answer asked for nothing
            post(Envelope.new(malformed), "crash", actor=interface("console"))
        post(line, "malformed input", actor=interface("console"))  # not a reason told
        assert app.runtime.wait_idle(timeout=10)
        assert out.envelopes == []
        post(line, "crash", actor=interface("console"))
        post(line.child(ConsoleInput(text="run date")), "actor stopped", actor=interface("console"))
        assert app.runtime.wait_idle(timeout=10)
        [notice] = out.envelopes
        post(Envelope.new(PagerInput(chat="c")), "crash", actor="interface.pager")  # no origin
        app.notices.origin(PagerInput, lambda item: 1 / 0)  # an origin that raises names nobody
        post(Envelope.new(PagerInput(chat="c")), "crash", actor="interface.pager")
        app.notices.origin(PagerInput, lambda item: {"chat_id": item.chat})  # nor one that names no context
        post(Envelope.new(PagerInput(chat="c")), "crash", actor="interface.pager")
        assert app.runtime.wait_idle(timeout=10)
        assert out.envelopes == [notice]
    assert notice.body.text == FAILURE_NOTICE and notice.body.notice
    assert notice.body.context.chat_id == "console"
    assert notice.correlation_id == line.correlation_id + NOTICE_SUFFIX
    assert console_text(app).count(FAILURE_NOTICE) == 1
    assert len(app.runtime.dead_letters.letters()) == 10  # every letter kept, whatever was said


def test_a_request_that_dies_closes_its_journal_item_as_dead_and_its_user_is_told(make_app: MakeApp) -> None:
    app = make_app(supervision={"message_attempts": 2})
    app.runtime.fault = FaultInjector(actors={LLM}, times=2)
    envelope = app.runtime.accept(interface("console"), ConsoleInput(text="run date")).result(5)
    assert app.runtime.wait_idle(envelope.correlation_id, 15) and app.runtime.wait_idle(timeout=15)
    assert console_text(app).count(FAILURE_NOTICE) == 1
    # Closed, not left to resume (its finish is a lazy write: committed within milliseconds).
    assert app.journal is not None and wait_for(lambda: app.journal.unfinished() == [], timeout=5)
    assert journal_state(app, envelope.correlation_id) == "dead"


def test_an_unreachable_llm_gives_the_user_a_notice(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=401))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "hello")
        [notice] = out.bodies(OutboundMessage)
    assert notice.notice and "could not reach the language model" in notice.text
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "llm unavailable" and "HTTP 401" in letter.detail


PIPELINE = ["interface.console", "llm", "dispatcher", "executor.terminal", "builder", "sender.console"]


@pytest.mark.parametrize("actor", PIPELINE)
def test_a_crash_in_any_pipeline_actor_loses_nothing(make_app: MakeApp, actor: str) -> None:
    app = make_app()
    app.runtime.fault = FaultInjector(actors={actor}, times=1)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "run echo one")
        # The supervisor restarted the actor and it handled the same message again.
        assert "`echo one` finished" in out.expect(OutboundMessage, timeout=5).body.text
    assert app.runtime.dead_letters.letters() == []
    assert app.runtime.cell(actor).restarts == 1
    assert app.runtime.cell(actor).last_failure.message == f"injected fault in {actor}"


@pytest.mark.parametrize("actor", PIPELINE)
def test_a_message_that_always_crashes_its_actor_is_dead_lettered_and_the_user_told(
        make_app: MakeApp, actor: str) -> None:
    app = make_app(supervision={"message_attempts": 3})
    app.runtime.fault = FaultInjector(actors={actor}, times=3)
    ask(app, "run echo one")
    [letter] = app.runtime.dead_letters.letters()
    assert (letter.reason, letter.actor) == ("crash", actor)
    assert letter.error == f"InjectedFault: injected fault in {actor}"
    assert letter.detail == "failed on attempt 3 of 3"
    # Whoever asked hears that it failed, once (a line the console never read too: its
    # platform's origin names its chat).
    assert app.runtime.wait_idle(timeout=10)  # the notice is work of its own
    if actor == "executor.terminal":  # the action's failure, not the request's: told through the LLM
        assert FAILURE_NOTICE not in console_text(app)
        assert "`echo one` failed" in console_text(app)
    else:  # once the command ran (the builder died on its output, the sender on the reply about
        # it), it says so, and not to ask again
        ran = actor in ("builder", "sender.console")
        notice = OUTCOME_NOTICES["done"] if ran else FAILURE_NOTICE
        assert console_text(app).count(notice) == 1
    # The actor still works for the next request.
    with app.runtime.probe(sender("console")) as out:
        ask(app, "run echo two")
        assert "two" in out.expect(OutboundMessage, timeout=5).body.text
    assert app.runtime.cell(actor).restarts == 3


#: The reply the console's sender crashes on, every time (a platform that chokes on its text).
CHOKES = "Here is what it said, in words the platform chokes on."
#: Two attempts at a message, with no backoff between them.
AT_ONCE_TWICE = {"message_attempts": 2, "backoff_min": 0, "backoff_max": 0}


def choking_on(text: str | None) -> Callable[[str, Envelope], None]:
    """A ``runtime.fault``: the console's sender crashes on every attempt at a reply ``text``
    (None: at every message, the notices too)."""
    def fault(actor: str, env: Envelope) -> None:
        body = env.body
        if (actor == sender("console") and isinstance(body, OutboundMessage)
                and text in (None, body.text)):
            raise RuntimeError("the platform's adapter failed on this text")
    return fault


@pytest.mark.parametrize("commands, notice", [
    (["echo ran-once"], OUTCOME_NOTICES["done"]),
    (["date --date=notadate"], OUTCOME_NOTICES["failed"]),
    ([], FAILURE_NOTICE),  # nothing ran: asking again is safe
], ids=["done", "failed", "nothing-ran"])
def test_a_reply_its_sender_crashes_on_every_time_is_told_with_what_its_request_ran(
        make_app: MakeApp, fake_llm: FakeLLMServer, commands: list[str], notice: str) -> None:
    """The reply about a command crashes the console's sender on every attempt: the user's
    notice says what became of the command, and not "Please try again" (asking again ran it
    twice). A reply of a request that ran nothing still invites asking again."""
    fake_llm.script(*([actions(*map(terminal, commands))] if commands else []),
                    actions(reply(CHOKES)))
    app = make_app(base_url=fake_llm.base_url, supervision=AT_ONCE_TWICE)
    app.runtime.fault = choking_on(CHOKES)
    with app.runtime.probe(executor("terminal")) as executed:
        ask(app, "please run it")
        assert app.runtime.wait_idle(timeout=15)  # the notice is work of its own
        ran = [r.action.payload.command for r in executed.bodies(ActionRequest)]
    assert ran == commands  # once
    [letter] = app.runtime.dead_letters.letters()
    assert (letter.reason, letter.actor) == ("crash", "sender.console")
    assert letter.envelope.body.text == CHOKES
    said = console_text(app)
    assert CHOKES not in said
    assert said.count(notice) == 1
    assert ("try again" in said) == (not commands)  # only when nothing ran


def test_a_notice_its_sender_crashes_on_too_is_a_dead_letter_and_nothing_more(
        make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    """The console's sender crashes on every message: the reply dies, its notice dies as a
    dead letter of its own, and no notice of the notice follows (nor any other)."""
    fake_llm.script(actions(terminal("echo ran-once")), actions(reply(CHOKES)))
    app = make_app(base_url=fake_llm.base_url, supervision=AT_ONCE_TWICE)
    app.runtime.fault = choking_on(None)
    with app.runtime.probe(sender("console")) as out:
        request = ask(app, "please run it")
        assert app.runtime.wait_idle(timeout=15)
        arrived = [env.body for env in out.envelopes]
    reply_letter, notice_letter = app.runtime.dead_letters.letters()
    assert (reply_letter.reason, reply_letter.envelope.body.text) == ("crash", CHOKES)
    assert notice_letter.reason == "crash"
    assert notice_letter.envelope.body.text == OUTCOME_NOTICES["done"]
    assert notice_letter.envelope.correlation_id == request.correlation_id + NOTICE_SUFFIX
    # Each delivered once (its second attempt is its actor's), and nothing after them.
    assert [m.text for m in arrived] == [CHOKES, OUTCOME_NOTICES["done"]]
    assert OUTCOME_NOTICES["done"] not in console_text(app)


def test_the_offline_engine_runs_the_whole_loop(make_app: MakeApp) -> None:
    app = make_app()
    ask(app, "run uname -s")
    text = console_text(app)
    assert "you     #1 │ run uname -s" in text
    assert "bot    ↳#1 │ `uname -s` finished" in text
    assert "Linux" in text


def test_replies_to_one_chat_keep_the_order_of_its_requests_while_chats_run_in_parallel(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    """The LLM answers a chat's first request slowly and its second fast: the replies still
    go out first, then second. Another chat is not held up meanwhile."""
    def responder(body: dict) -> FakeResponse | None:
        last = body["messages"][-1]["content"]
        if last.startswith("slow"):
            return FakeResponse(delay=1.5, content=json.dumps({"actions": [reply(f"answer to {last}")]}))
        if last.startswith(("fast", "other")):
            return FakeResponse(content=json.dumps({"actions": [reply(f"answer to {last}")]}))
        return None

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url)
    chat_a = OriginalContext(chat_id="a", message_id=1, interface_name="console")
    chat_b = OriginalContext(chat_id="b", message_id=1, interface_name="console")
    with app.runtime.probe(sender("console")) as out:
        for text, ctx in (("slow one", chat_a), ("fast two", chat_a.model_copy(update={"message_id": 2})),
                          ("other chat", chat_b)):
            app.runtime.send(CONVERSATIONS, UserRequest(text=text, context=ctx))
            time.sleep(0.05)
        assert app.runtime.wait_idle(timeout=20)
        replies = [m.text for m in out.bodies(OutboundMessage)]
    assert [r for r in replies if "one" in r or "two" in r] == ["answer to slow one", "answer to fast two"]
    assert replies.index("answer to other chat") < replies.index("answer to slow one")


def test_a_reply_with_a_thousand_commands_runs_none_and_is_re_asked(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(*[terminal(f"echo {n}") for n in range(1000)]), actions(reply("Just one, then.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)  # the re-ask's delay fires when advanced
    with app.runtime.probe(executor("terminal")) as commands, app.runtime.probe(sender("console")) as out:
        ask(app, "flood me", clock=manual_clock)
        assert commands.bodies(ActionRequest) == []  # not one process started
        assert [m.text for m in out.bodies(OutboundMessage)] == ["Just one, then."]
    errors = json.loads(fake_llm.requests[1].messages[-1]["content"])["system_message"]["errors"]
    assert errors == ["your reply has 1000 actions; at most 10 are allowed per reply"]


def test_a_reply_naming_a_lone_surrogate_is_re_asked_and_answered(make_app: MakeApp,
                                                                   fake_llm: FakeLLMServer) -> None:
    # Valid JSON, but its "\ud800" escape is a character no UTF-8 can carry: the re-ask
    # quotes it back to the model (escaped again), and the user gets the answer to that.
    fake_llm.script(FakeResponse(content='{"type": "tele\\ud800port", "payload": {}}'),
                    actions(reply("Teleporting is not something I do.")))
    app = make_app(base_url=fake_llm.base_url)
    ask(app, "teleport me")
    assert "Teleporting is not something I do." in console_text(app)
    [error] = system_messages(fake_llm, "error")
    assert [p["type"] for p in error["positions"]] == ["tele\ud800port"]
    assert "unknown action type 'tele\\ud800port'" in error["errors"][0]
