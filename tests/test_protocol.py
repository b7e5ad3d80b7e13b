"""The LLM's own protocol: reasoning is never executed, native tool calls are actions, a
server's refusal steps the protocol down once, re-asks answer places, usage is counted,
budgets and fallbacks hold.

Against the fake OpenAI-compatible server (a real aiohttp server on 127.0.0.1), driven
through the real HTTP engine. Re-ask delays run on a ManualClock the tests advance."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from conftest import ask, system_message

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.limits import LLM_MAX_TOKENS
from autoresponse.actors.llm import EngineChain, HttpEngine, LLMError, NoticeEngine
from autoresponse.actors.llm.client import BUDGET_NOTICE, TOO_LONG_NOTICE, WINDOW_NOTICE
from autoresponse.actors.llm.reasoning import split_reasoning
from autoresponse.actors.extractor import rejection
from autoresponse.actors.llm.budget import ContextBudget, request_tokens
from autoresponse.actors.prompts import (
    PLAIN_RETRY_NOTE,
    build_chat_request,
    build_reask_request,
    plain_retry,
    render_openai_messages,
)
from autoresponse.actors.retry import DONE_NOTICE, GIVE_UP_NOTICE
from autoresponse.actors.routes import LLM, executor, sender
from autoresponse.messages import ActionRequest, OriginalContext, OutboundMessage, PromptRequest, ToolCall, Turn
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse

MakeApp = Callable[..., Application]
FAST = {"backoff_min": 5.0, "backoff_max": 20.0}
DRAFT = '{"actions": [{"type": "terminal", "payload": {"command": "echo DRAFT-RAN"}}]}'


def say(text: str) -> dict[str, Any]:
    return {"type": "message_console", "payload": {"text": text}}


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def replies(app: Application, text: str, clock: ManualClock) -> list[OutboundMessage]:
    with app.runtime.probe(sender("console")) as out:
        ask(app, text, clock=clock)
        return out.bodies(OutboundMessage)


# ------------------------------------------------------------------ reasoning


@pytest.mark.parametrize("reply", [
    f"<think>The user may want {DRAFT}</think>The answer is 42.",
    f"<thinking>{DRAFT}</thinking>\nThe answer is 42.",
    f"<reasoning>draft: {DRAFT}</reasoning>The answer is 42.",
    f"<THINK>{DRAFT}</THINK>The answer is 42.",
    f"\ufeff<think>{DRAFT}</think>The answer is 42.",
    f"\u200b <think>{DRAFT}</think>The answer is 42.",
    f"{DRAFT} no, too risky.</think>The answer is 42.",
    f"[plan] 1. {DRAFT} 2. refuse</think>The answer is 42.",
    f"The template opened it: {DRAFT}</think>The answer is 42.",
], ids=["think", "thinking", "reasoning", "upper-case", "byte-order-mark", "zero-width-space",
        "closing-tag-only-after-json", "closing-tag-only-after-a-list", "closing-tag-only"])
def test_a_drafted_command_in_reasoning_never_runs(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, reply: str
) -> None:
    fake_llm.script(FakeResponse(content=reply))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"stream": False})
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "what is the answer?", manual_clock)
        assert ran.envelopes == []
    assert [m.text for m in sent] == ["The answer is 42."]  # prose after the reasoning is the answer
    assert len(fake_llm.requests) == 1


def test_an_unterminated_reasoning_block_is_no_answer_and_runs_nothing(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content=f"<think>still drafting {DRAFT}"), actions(say("Here you go.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, llm={"stream": False})
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "hello", manual_clock)
        assert ran.envelopes == []
    assert [m.text for m in sent] == ["Here you go."]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_fields_never_become_actions_or_previews(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, stream: bool
) -> None:
    fake_llm.script(FakeResponse(content=json.dumps({"actions": [say("Done thinking.")]}),
                                 reasoning=f"maybe {DRAFT} or not", piece=8))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"stream": stream, "protocol": "text"})
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "hello", manual_clock)
        assert ran.envelopes == []
    assert [m.text for m in sent if not m.preview] == ["Done thinking."]
    assert not any("DRAFT" in m.text or "maybe" in m.text for m in sent)


def test_a_streamed_preview_never_shows_reasoning(fake_llm: FakeLLMServer) -> None:
    answer = json.dumps({"actions": [say("The disk is fine, 42% used.")]})
    fake_llm.script(FakeResponse(content=f"<think>I wonder {DRAFT}</think>{answer}", piece=4))
    seen: list[str] = []
    prompt = build_chat_request("disk?", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console", "terminal"])

    async def run() -> str:
        async with HttpEngine(fake_llm.base_url, model="fake", stream=True, protocol="text") as engine:
            return (await engine.answer(prompt, seen.append)).text

    assert asyncio.run(run()) == answer
    assert seen and not any("think" in s or "wonder" in s for s in seen)


@pytest.mark.parametrize("reply", [
    "Reasoning models wrap their scratchpad in a <think> tag; the answer follows it.",
    json.dumps({"actions": [say("Use the <reasoning> element, closed by </reasoning>.")]}),
    json.dumps({"actions": [say("Close it with </think> and go on.")]}),
], ids=["prose", "action", "closing-tag"])
def test_an_answer_that_mentions_a_reasoning_tag_reaches_the_user_whole(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, reply: str
) -> None:
    """Only blocks the reply starts with are reasoning: a tag further on is the answer's."""
    fake_llm.script(FakeResponse(content=reply))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"stream": False})
    [sent] = replies(app, "how do reasoning models mark their thoughts?", manual_clock)
    expected = json.loads(reply)["actions"][0]["payload"]["text"] if reply.startswith("{") else reply
    assert sent.text == expected and not sent.notice
    assert len(fake_llm.requests) == 1  # nothing was re-asked


def test_splitting_reasoning_is_linear_on_hostile_input() -> None:
    hostile = "<think>a</think>" * 50_000 + "<think>" * 50_000 + "</thinking>" * 50_000
    answer, thought = split_reasoning(hostile)
    assert answer == "" and thought.startswith("a")


# ------------------------------------------------------------------ native protocol


def test_tool_calls_become_actions_and_the_output_comes_back_through_the_llm(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """Unscripted, the fake answers offline in the protocol asked: tool_calls here."""
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    sent = replies(app, "run echo hello-tools", manual_clock)
    assert len(sent) == 1 and "hello-tools" in sent[0].text
    chat, delivery = fake_llm.requests
    assert sorted(t["function"]["name"] for t in chat.body["tools"]) == ["message_console", "terminal"]
    assert chat.body["tool_choice"] == "auto" and "response_format" not in chat.body
    # The format travels in tools, not again in the prompt: no schema text for a model to copy.
    assert "$defs" not in chat.messages[0]["content"] and "JSON schemas" not in chat.messages[0]["content"]
    assert [t["function"]["name"] for t in delivery.body["tools"]] == ["message_console"]
    assert delivery.body["tool_choice"] == "required"
    assert chat.body["max_tokens"] == LLM_MAX_TOKENS


def test_streamed_tool_call_deltas_become_actions(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(tool_calls=(("message_console", {"text": "streamed in pieces"}),), piece=3))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"stream": True})
    sent = replies(app, "hi", manual_clock)
    assert [m.text for m in sent if not m.preview] == ["streamed in pieces"]
    assert fake_llm.requests[0].body["stream_options"] == {"include_usage": True}


#: OpenAI's current models (o-series, gpt-5.x) answer a request with ``max_tokens`` so.
REFUSES_MAX_TOKENS = json.dumps({"error": {
    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
               "Use 'max_completion_tokens' instead.",
    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})


def test_a_model_that_refuses_max_tokens_is_asked_with_max_completion_tokens_from_then_on(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """The refusal names max_completion_tokens as what to use instead: that is the refusal
    of max_tokens, learnt once; the user gets the answer, and no request after the first
    carries max_tokens again."""
    def openai(body: dict[str, Any]) -> FakeResponse | None:
        return FakeResponse(status=400, body=REFUSES_MAX_TOKENS) if "max_tokens" in body else None

    with FakeLLMServer(responder=openai) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock)
        sent = replies(app, "run echo hello-o-series", manual_clock)
        assert len(sent) == 1 and not sent[0].notice and "hello-o-series" in sent[0].text
        assert "max_tokens" in llm.requests[0].body
        assert len(llm.requests) == 3  # the refusal, the chat turn, its delivery
        for request in llm.requests[1:]:
            assert "max_tokens" not in request.body
            assert request.body["max_completion_tokens"] == LLM_MAX_TOKENS


async def test_a_server_that_refuses_both_token_limits_is_an_error_not_a_loop() -> None:
    refuses_both = json.dumps({"error": {
        "message": "Unsupported parameter: 'max_completion_tokens' is not supported with this model.",
        "type": "invalid_request_error", "param": "max_completion_tokens", "code": "unsupported_parameter"}})
    with FakeLLMServer(responder=lambda body: FakeResponse(status=400, body=refuses_both)) as llm:
        llm.script(FakeResponse(status=400, body=REFUSES_MAX_TOKENS))
        async with HttpEngine(llm.base_url, model="fake") as engine:
            with pytest.raises(LLMError, match="HTTP 400: .*'max_completion_tokens' is not supported"):
                await asyncio.wait_for(engine.complete([{"role": "user", "content": "hi"}]), 30)
        assert ["max_tokens" in r.body for r in llm.requests] == [True, False]


def test_vllms_context_error_naming_both_limits_is_no_refusal_of_either(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """vLLM names max_tokens and max_completion_tokens when a request does not fit: that
    is the request shrunk, not max_tokens learnt as refused."""
    too_big = json.dumps({"object": "error", "type": "BadRequestError", "param": "max_tokens", "code": 400,
                          "message": "'max_tokens' or 'max_completion_tokens' is too large: 1200. This model's "
                                     "maximum context length is 4096 tokens and your request has 3500 input tokens"})
    with FakeLLMServer() as llm:
        llm.script(FakeResponse(status=400, body=too_big))
        app = make_app(base_url=llm.base_url, clock=manual_clock)
        [answer] = replies(app, "run echo still-fits", manual_clock)
        assert not answer.notice and "still-fits" in answer.text
        assert all("max_tokens" in r.body and "max_completion_tokens" not in r.body for r in llm.requests)


@pytest.mark.parametrize(("tools", "json_schema", "spoken"), [
    (True, True, "tools"), (False, True, "json_schema"), (False, False, "text")])
def test_auto_steps_down_once_and_remembers(
    make_app: MakeApp, manual_clock: ManualClock, tools: bool, json_schema: bool, spoken: str
) -> None:
    with FakeLLMServer(tools=tools, json_schema=json_schema) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, admin={"enabled": True, "port": 0})
        first = replies(app, "hello", manual_clock)
        second = replies(app, "hello again", manual_clock)
        assert len(first) == len(second) == 1 and "Hello" in first[0].text
        refused = [r for r in llm.requests if ("tools" in r.body and not tools)
                   or ("response_format" in r.body and not json_schema)]
        # Each refusal happened once, on the first call; the second call went straight to the level learnt.
        assert len(refused) == (not tools) + (not json_schema)
        last = llm.requests[-1].body
        assert ("tools" in last) == (spoken == "tools")
        assert ("response_format" in last) == (spoken == "json_schema")
        with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
            status = json.load(response)
        [engine] = status["reports"]["llm"]["engines"]
        assert engine["protocol"] == spoken and engine["configured_protocol"] == "auto"
    assert app.runtime.dead_letters.letters() == []


def test_a_delivery_turn_stays_fail_closed_in_json_schema_mode(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"protocol": "json_schema"})
    sent = replies(app, "run echo via-schema", manual_clock)
    assert len(sent) == 1 and "via-schema" in sent[0].text
    chat, delivery = fake_llm.requests
    schema = json.dumps(delivery.body["response_format"])
    assert delivery.body["response_format"]["json_schema"]["strict"] is True
    assert '"message_console"' in schema and '"terminal"' not in schema
    assert "$defs" not in delivery.messages[0]["content"]


def test_a_re_ask_in_tools_mode_answers_the_rejected_call_with_a_tool_message(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(tool_calls=(("message_console", {"text": "first part"}),
                                             ("terminal", {"cmd": "df -h"}))),
                    FakeResponse(tool_calls=(("terminal", {"command": "echo fixed"}),)),
                    FakeResponse(tool_calls=(("message_console", {"text": "fixed ran"}),)))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    sent = replies(app, "do two things", manual_clock)
    assert [m.text for m in sent] == ["first part", "fixed ran"]
    reask = fake_llm.requests[1].messages
    assert reask[-1]["role"] == "tool" and reask[-1]["content"].startswith("error:")
    assert reask[-2]["role"] == "tool" and reask[-2]["content"].startswith("done")
    assert reask[-3]["role"] == "assistant" and len(reask[-3]["tool_calls"]) == 2
    assert reask[-1]["tool_call_id"] == reask[-3]["tool_calls"][1]["id"]


def test_each_rejected_tool_call_is_told_its_own_error(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(tool_calls=(("teleport", {"to": "mars"}), ("message_console", '{"text": '),
                                             ("terminal", "[1, 2"))),
                    FakeResponse(tool_calls=(("message_console", {"text": "fixed"}),)))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    assert [m.text for m in replies(app, "three things", manual_clock)] == ["fixed"]
    reask = fake_llm.requests[1].messages
    called = {c["id"]: c["function"]["name"] for c in reask[-4]["tool_calls"]}
    told = {called[m["tool_call_id"]]: m["content"] for m in reask[-3:]}
    assert "unknown action type 'teleport'" in told["teleport"]
    assert "'message_console': its arguments are not JSON" in told["message_console"]
    assert "'terminal': its arguments are not JSON" in told["terminal"]


def test_a_re_ask_of_a_huge_tool_call_keeps_the_question_and_each_call_with_its_answer(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A model that wrote pages (over the message limit) in a small window: the re-ask
    replays an excerpt of its call, so the question and the call still fit beside the
    tool turn answering it; a server checks that every tool turn answers a call."""
    fake_llm.script(FakeResponse(tool_calls=(("message_console", {"text": "word " * 8_000}),)),
                    FakeResponse(tool_calls=(("message_console", {"text": "short now"}),)))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST,
                   llm={"protocol": "tools", "context_tokens": 12_000})
    assert [m.text for m in replies(app, "write me a long essay", manual_clock)] == ["short now"]
    roles = [m["role"] for m in fake_llm.requests[1].messages]
    assert roles == ["system", "user", "assistant", "tool"]
    question, call, answer = fake_llm.requests[1].messages[1:]
    assert "write me a long essay" in question["content"]
    [replayed] = call["tool_calls"]
    assert replayed["id"] == answer["tool_call_id"]
    arguments = json.loads(replayed["function"]["arguments"])  # still JSON, and short
    assert "[...]" in arguments["text"] and len(replayed["function"]["arguments"]) < 1_000


def _reasked(prompt: PromptRequest, calls: int) -> PromptRequest:
    """``prompt`` asked again after a reply of ``calls`` tool calls, all refused (none: in words)."""
    tool_calls = [ToolCall(id=f"c{prompt.reask}-{n}", name="message_console", arguments='{"text": "no"}')
                  for n in range(calls)]
    error = rejection(prompt, "", [f"action {n + 1}: refused" for n in range(max(calls, 1))])
    return build_reask_request(prompt, error, tool_calls=tool_calls, max_errors=10)


def _answered_calls(messages: list[dict[str, Any]]) -> bool:
    """Every tool turn answers a call of the assistant turn before it."""
    called: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            called = {c["id"] for c in message.get("tool_calls") or ()}
        elif message["role"] == "tool" and message["tool_call_id"] not in called:
            return False
    return True


@pytest.mark.parametrize("reasks", [1, 2])
def test_a_re_ask_trimmed_to_fit_keeps_its_question_and_each_call_with_its_answer(reasks: int) -> None:
    """Memory goes first, then the older rejected answers, each whole; the question the
    user asked stays, and no tool turn is left without the call it answers."""
    memory = tuple(Turn(role=role, content=f"memory {n}: " + "once upon a time " * 60)
                   for n in range(3) for role in ("user", "assistant"))
    prompt = build_chat_request("what is the weather?", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"], turns=memory)
    for _ in range(reasks):
        prompt = _reasked(prompt, calls=3)
    window = request_tokens(prompt.model_copy(update={"turns": prompt.turns[len(memory):]}), "tools")
    fitted = ContextBudget(window=window + 400, reserve=100).fit(prompt, "tools")
    messages = render_openai_messages(fitted, "tools")
    assert _answered_calls(messages)
    kept = [m for m in messages if m["role"] == "user" and "weather" in m["content"]]
    assert len(kept) == 1 and not any("memory" in str(m["content"]) for m in messages)
    tighter = ContextBudget(window=window - 50, reserve=100).fit(prompt, "tools")
    messages = render_openai_messages(tighter, "tools")
    assert _answered_calls(messages) and any("weather" in str(m["content"]) for m in messages)


def test_a_turn_asked_again_plainly_fits_its_window_as_when_first_asked() -> None:
    """``plain_retry`` asks the turn as first asked: its memory is trimmed as then, not kept
    as if it were the exchange of a re-ask."""
    memory = (Turn(role="user", content="memory: " + "once upon a time " * 400), Turn(role="assistant", content="ok"))
    prompt = build_chat_request("what is the weather?", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"], turns=memory)
    plain = plain_retry(_reasked(prompt, calls=0))
    budget = ContextBudget(window=request_tokens(prompt.model_copy(update={"turns": ()}), "json_schema") + 500,
                           reserve=100)
    messages = render_openai_messages(budget.fit(plain, "json_schema"), "json_schema")
    assert not any("memory" in str(m["content"]) for m in messages)
    assert "weather" in messages[-1]["content"]


def test_a_re_ask_too_big_for_the_window_is_not_the_users_to_send_shorter() -> None:
    """What did not fit is the runtime's re-ask, not the user's words: the user hears the
    re-ask path's own notice; a chat turn's own message too long is theirs to shorten."""
    from autoresponse.actors.llm.client import failure_notice
    from autoresponse.messages import LLMFailure

    prompt = build_chat_request("hi", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"])
    reask = _reasked(prompt, calls=0)
    assert failure_notice(LLMFailure(prompt=reask, error="too long", too_long=True)) == GIVE_UP_NOTICE
    assert failure_notice(LLMFailure(prompt=prompt, error="too long", too_long=True)) == TOO_LONG_NOTICE


@pytest.mark.parametrize("refusal", ["this model does not support tool use", "Tool calling is not supported",
                                     "tools are not supported by this model"])
def test_a_400_that_refuses_tools_in_its_own_words_is_learnt(fake_llm: FakeLLMServer, refusal: str) -> None:
    fake_llm.script(FakeResponse(status=400, body=json.dumps({"error": {"message": refusal}})))
    prompt = build_chat_request("hi", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"])

    async def run() -> str:
        async with HttpEngine(fake_llm.base_url, model="fake", stream=False) as engine:
            await engine.answer(prompt)  # asked again at once, without tools
            return engine.mode

    assert asyncio.run(run()) == "json_schema"


def test_a_400_about_a_tool_turn_is_never_learnt_as_a_refusal_of_tools(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=400, body=json.dumps({"error": {
        "message": "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'",
        "type": "invalid_request_error"}})))
    prompt = build_chat_request("hi", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"])

    async def run() -> str:
        async with HttpEngine(fake_llm.base_url, model="fake", stream=False) as engine:
            with pytest.raises(LLMError, match="HTTP 400"):
                await engine.answer(prompt)
            await engine.answer(prompt)
            return engine.mode

    assert asyncio.run(run()) == "tools"
    assert ["tools" in r.body for r in fake_llm.requests] == [True, True]


# ------------------------------------------------------------------ re-asks answer places


def test_an_empty_answer_to_a_re_ask_is_nothing_more(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("Working on it, the answer is 42."), {"type": "teleport", "payload": {}}),
                    FakeResponse(content='{"actions": []}'))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    sent = replies(app, "what is the answer?", manual_clock)
    assert [m.text for m in sent] == ["Working on it, the answer is 42."]
    assert GIVE_UP_NOTICE not in [m.text for m in sent]
    assert len(fake_llm.requests) == 2  # one re-ask, then done
    assert app.runtime.dead_letters.letters() == []


@pytest.mark.parametrize("answer", [
    FakeResponse(content=""),
    FakeResponse(content=" \n\t "),
    FakeResponse(content="", reasoning="The user greets me. I could answer with a greeting ..."),
    FakeResponse(content="<think>The user greets me, so I will answer with"),
    FakeResponse(content='{"actions": []}'),
    FakeResponse(content="", reasoning="Let me think step by step ...", finish_reason="length"),
], ids=["empty", "blank", "reasoning-only", "unterminated-think", "empty-action-list", "reasoning-cut-off"])
def test_an_answer_of_nothing_is_no_answer_and_the_user_hears_so(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, answer: FakeResponse
) -> None:
    """A model that answers nothing every time (a reasoning model spending its tokens on
    thought does) leaves the user with the give-up notice and the turn a dead letter, never
    with silence: nothing was said or done, so its re-asks' empty answers are not "nothing
    more" either."""
    fake_llm.responder = lambda body: answer
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    sent = replies(app, "hello", manual_clock)
    assert [(m.text, m.notice) for m in sent] == [(GIVE_UP_NOTICE, True)]
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "retries exhausted"
    cut_off = answer.finish_reason == "length"
    assert len(fake_llm.requests) == (2 if cut_off else 3)  # a reply cut off gets one shorter try
    for reask in fake_llm.requests[1:]:
        errors = system_message(reask)["errors"]
        assert errors[-1].endswith("the user is still waiting for an answer: answer them, "
                                   "or carry out what they asked")
        assert "cut off at its token limit" in errors[0] if cut_off else len(errors) == 1


def test_words_may_take_the_place_of_a_refused_command_said_twice(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A small model says the same invented command twice: neither is carried out (the
    repeat shares its first's fate), so the message its re-ask answers with goes out."""
    fruit = {"type": "terminal", "payload": {"command": "fruit"}}
    fake_llm.script(actions(fruit, fruit), actions(say("An apple.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, allowed=["echo"])
    with app.runtime.probe(executor("terminal")) as ran:
        assert [m.text for m in replies(app, "Name a fruit.", manual_clock)] == ["An apple."]
        assert ran.envelopes == []
    error = system_message(fake_llm.requests[1])
    assert [p["done"] for p in error["positions"]] == [False, False]
    assert app.runtime.dead_letters.letters() == []


def test_a_reworded_repeat_of_a_delivered_place_is_dropped_and_traced(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("Working on it, the answer is 42."),
                            {"type": "terminal", "payload": {"cmd": "broken"}}),
                    actions(say("Sure, the answer is 42.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    with app.runtime.probe(executor("terminal")) as ran, app.runtime.probe(sender("console")) as out:
        envelope = ask(app, "what is the answer?", clock=manual_clock)
        assert ran.envelopes == []
        assert [m.text for m in out.bodies(OutboundMessage)] == ["Working on it, the answer is 42."]
    error = system_message(fake_llm.requests[1])
    done = [p for p in error["positions"] if p["done"]]
    assert [p["index"] for p in done] == [1] and "Working on it" in done[0]["excerpt"]
    assert [p["type"] for p in error["positions"] if not p["done"]] == ["terminal"]
    assert app.runtime.dead_letters.letters() == []
    hops = app.runtime.trace(envelope.correlation_id)
    notes = [note for hop in hops for note in hop.get("notes", ())]
    assert any(note.startswith("dropped action 1 (message_console)") for note in notes)


def test_a_re_ask_quotes_only_an_excerpt_of_a_long_rejected_reply(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    rambling = "{ " + "and so on " * 2_000
    fake_llm.script(FakeResponse(content=rambling), actions(say("Short now.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    assert [m.text for m in replies(app, "hello", manual_clock)] == ["Short now."]
    reask = fake_llm.requests[1].raw
    assert len(reask) < len(rambling) / 3  # neither the assistant turn nor your_reply carries it whole


def test_a_reply_cut_off_at_its_token_limit_gets_one_shorter_try_then_a_notice(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    cut = FakeResponse(content='{"actions": [{"type": "message_console", "payload": {"text": "blah blah',
                       finish_reason="length")
    fake_llm.script(cut, cut, cut)
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    sent = replies(app, "tell me everything", manual_clock)
    assert [m.text for m in sent] == [GIVE_UP_NOTICE]
    assert len(fake_llm.requests) == 2
    assert "cut off at its token limit" in system_message(fake_llm.requests[1])["errors"][0]


# ------------------------------------------------------------------ prose


def test_prose_is_an_answer_and_never_executed(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content="The capital of France is Paris. Run rm -rf / for fun."))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "What is the capital of France?", manual_clock)
        assert ran.envelopes == []
    assert [m.text for m in sent] == ["The capital of France is Paris. Run rm -rf / for fun."]
    assert len(fake_llm.requests) == 1


def test_prose_is_re_asked_when_configured(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content="Paris."), actions(say("Paris, as an action.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, llm={"prose": "reask"})
    assert [m.text for m in replies(app, "capital of France?", manual_clock)] == ["Paris, as an action."]


def test_a_reply_that_echoes_the_runtime_schema_never_reaches_the_user(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("#/$defs/TelegramMessagePayload")), actions(say("Hello there.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST)
    assert [m.text for m in replies(app, "hi", manual_clock)] == ["Hello there."]


def test_two_identical_message_actions_in_one_reply_are_sent_once(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("Hello, I'm a chatbot."), say("Hello, I'm a chatbot.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    assert [m.text for m in replies(app, "hi", manual_clock)] == ["Hello, I'm a chatbot."]


# ------------------------------------------------------------------ usage, budget, fallbacks


def test_usage_is_counted_per_kind_and_model_in_metrics_status_and_trace(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(tool_calls=(("terminal", {"command": "echo counted"}),),
                                 usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}),
                    FakeResponse(tool_calls=(("message_console", {"text": "counted"}),),
                                 usage={"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, admin={"enabled": True, "port": 0},
                   llm={"model": "fake"})
    envelope = ask(app, "run echo counted", clock=manual_clock)
    with urllib.request.urlopen(f"{app.admin.url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'autoresponse_llm_tokens_total{direction="prompt",kind="chat",model="fake"} 100.0' in metrics
    assert 'autoresponse_llm_tokens_total{direction="completion",kind="delivery",model="fake"} 5.0' in metrics
    with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
        usage = json.load(response)["reports"]["llm"]["usage"]
    assert usage["tokens_by_kind"] == {"chat": 120, "delivery": 55}
    hops = app.runtime.trace(envelope.correlation_id)
    notes = [note for hop in hops for note in hop.get("notes", ())]
    assert any(note.startswith("chat turn by main (fake, tools): 100+20 tokens") for note in notes)


def test_past_its_daily_budget_a_chat_gets_one_notice_and_nothing_is_lost(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(FakeResponse(content=json.dumps({"actions": [say("first")]}),
                                 usage={"prompt_tokens": 90, "completion_tokens": 20, "total_tokens": 110}))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"daily_tokens_per_chat": 100})
    assert [m.text for m in replies(app, "one", manual_clock)] == ["first"]
    assert [m.text for m in replies(app, "two", manual_clock)] == [BUDGET_NOTICE]
    assert replies(app, "three", manual_clock) == []  # one notice, not one per message
    letters = app.runtime.dead_letters.letters()
    assert [d.reason for d in letters] == ["token budget", "token budget"]
    assert len(fake_llm.requests) == 1
    app.usage.daily_tokens_per_chat = None  # the next day, or a bigger budget: replay
    with app.runtime.probe(sender("console")) as out:
        env = app.runtime.replay(letters[0].id)
        assert env is not None and app.runtime.wait_idle(env.correlation_id, 10)
        assert len(out.bodies(OutboundMessage)) == 1


def test_a_dead_main_engine_falls_back_and_its_circuit_opens(make_app: MakeApp, manual_clock: ManualClock) -> None:
    with FakeLLMServer() as main, FakeLLMServer() as spare:
        main.responder = lambda body: FakeResponse(status=500)
        app = make_app(base_url=main.base_url, clock=manual_clock, admin={"enabled": True, "port": 0},
                       llm={"max_attempts": 1, "breaker_failures": 2,
                            "fallbacks": [{"name": "spare", "base_url": spare.base_url, "model": "small"}]})
        for n in range(4):
            sent = replies(app, f"hello {n}", manual_clock)
            assert len(sent) == 1 and "Hello" in sent[0].text
        assert len(main.requests) == 2  # then its circuit opened: no more hammering
        assert len(spare.requests) == 4
        with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
            engines = json.load(response)["reports"]["llm"]["engines"]
        assert [(e["name"], e["circuit"]) for e in engines] == [("main", "open"), ("spare", "closed")]
        assert app.usage.replies["spare"] == 4


def test_requests_the_main_engine_refuses_never_open_its_circuit_for_everyone(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """A 400 about one request's content says nothing of the next: the main engine still
    answers the others (a spare answers what it refused)."""
    flagged = FakeResponse(status=400, body=json.dumps({"error": {
        "message": "Invalid prompt: flagged as potentially violating our usage policy"}}))
    with FakeLLMServer() as main, FakeLLMServer() as spare:
        main.responder = lambda body: flagged if "forbidden" in body["messages"][-1]["content"] else None
        app = make_app(base_url=main.base_url, clock=manual_clock,
                       llm={"max_attempts": 1, "breaker_failures": 2, "protocol": "text",
                            "fallbacks": [{"name": "spare", "base_url": spare.base_url, "model": "small"}]})
        for n in range(4):
            [answer] = replies(app, f"forbidden words {n}", manual_clock)
            assert "Hello" in answer.text or "offline" in answer.text
        [innocent] = replies(app, "hello there", manual_clock)
        assert "Hello" in innocent.text
        assert [r.messages[-1]["content"] for r in main.requests][-1].endswith("hello there")
        assert len(spare.requests) == 4
        assert app.usage.replies["main"] == 1


def test_a_half_open_circuit_lets_one_call_through_and_the_rest_fall_back(fake_llm: FakeLLMServer) -> None:
    now = [0.0]
    prompt = build_chat_request("hi", OriginalContext(chat_id=1, interface_name="console"),
                                allowed_actions=["message_console"])

    async def run() -> list[str]:
        async with HttpEngine(fake_llm.base_url, model="fake", stream=False, protocol="text", max_attempts=1,
                              read_timeout=10.0) as main:
            chain = EngineChain([("main", main), ("offline", NoticeEngine())], failures=1, cooldown=60.0,
                                clock=lambda: now[0])
            fake_llm.script(FakeResponse(status=500))
            assert (await chain.answer(prompt)).engine == "offline"  # its circuit opens
            now[0] += 61.0  # cooled down: half open
            fake_llm.script(FakeResponse(content=json.dumps({"actions": [say("probed")]}), delay=0.5))
            answers = await asyncio.gather(*(chain.answer(prompt) for _ in range(5)))
            assert chain.breakers["main"].state == "closed"  # the probe answered
            return [a.engine for a in answers]

    engines = asyncio.run(run())
    assert sorted(engines) == ["main", "offline", "offline", "offline", "offline"]
    assert len(fake_llm.requests) == 2  # the failure, then one probe


def test_offline_closes_the_chain_with_a_short_notice(make_app: MakeApp, manual_clock: ManualClock) -> None:
    with FakeLLMServer() as main:
        main.responder = lambda body: FakeResponse(status=503)
        app = make_app(base_url=main.base_url, clock=manual_clock,
                       llm={"max_attempts": 1, "fallbacks": [{"base_url": "offline"}]})
        [sent] = replies(app, "hello", manual_clock)
    assert "can't think right now" in sent.text


def test_the_prompt_a_chat_turn_sends_is_lean_where_the_format_is_enforced() -> None:
    import autoresponse.interfaces  # noqa: F401  (registers the actions)
    prompt = build_chat_request("hi", OriginalContext(chat_id=1, interface_name="telegram"),
                                allowed_actions=["message_telegram_bot", "terminal", "event"])
    sizes = {mode: len(json.dumps(render_openai_messages(prompt, mode))) for mode in ("tools", "json_schema", "text")}
    assert sizes["tools"] < sizes["text"] / 3 and sizes["json_schema"] < sizes["text"] / 3



# ------------------------------------------------------------------ the model's limits


def test_auto_follows_what_the_server_says_it_supports(make_app: MakeApp, manual_clock: ManualClock) -> None:
    """llama.cpp's /props: a 4096-token window, and a chat template without tools."""
    props = {"default_generation_settings": {"n_ctx": 4096}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(props=props) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, admin={"enabled": True, "port": 0})
        [sent] = replies(app, "hello", manual_clock)
        assert "Hello" in sent.text
        [request] = llm.requests
        assert "response_format" in request.body and "tools" not in request.body
        with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
            [engine] = json.load(response)["reports"]["llm"]["engines"]
    assert engine["protocol"] == "json_schema" and engine["context_tokens"] == 4096
    assert engine["request_budget_tokens"] == 4096 - LLM_MAX_TOKENS - 96


def long_turns(app: Application, clock: ManualClock, count: int) -> None:
    """Fill the chat's memory with long turns."""
    for n in range(count):
        replies(app, f"story part {n}: " + "once upon a time " * 90, clock)


def test_every_request_fits_the_window_memory_trimmed_from_the_oldest(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    with FakeLLMServer(context=1_600) as llm:  # a bigger request gets llama.cpp's 400
        app = make_app(base_url=llm.base_url, clock=manual_clock,
                       llm={"context_tokens": 1_600, "max_tokens": 200, "protocol": "text"})
        long_turns(app, manual_clock, 4)
        [last] = replies(app, "and what did I say first?", manual_clock)
    assert "offline" in last.text  # answered, not refused
    assert all(r.body["max_tokens"] == 200 for r in llm.requests)
    # The window held for every request, and the newest ones carried less than all the memory.
    assert len(llm.requests) == 5
    assert len(llm.requests[-1].messages) < 2 + 2 * 4


def test_a_context_refusal_shrinks_the_request_once_and_is_never_called_unreachable(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    with FakeLLMServer() as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, llm={"protocol": "text"})
        long_turns(app, manual_clock, 4)
        llm.context = 1_300  # the model turns out smaller than the memory grew
        [answer] = replies(app, "still there?", manual_clock)
        assert not answer.notice and "offline" in answer.text
        refused = [r for r in llm.requests[4:]]
        assert len(refused) == 2  # one refusal, one smaller request that fitted
        # A text that cannot fit whatever is trimmed: the user hears it is too long.
        [notice] = replies(app, "x" * 20_000, manual_clock)
    assert notice.notice and notice.text == TOO_LONG_NOTICE


def test_one_message_the_server_finds_too_big_never_narrows_later_requests(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """A message the estimate misjudges (CJK text, as the server counts it) is refused and
    asked once more, smaller: for that request only. The next one is fitted to the whole
    window again, the chat's memory whole, as before it."""
    def counts_cjk_dearly(body: dict[str, Any]) -> FakeResponse | None:
        if "PASTE" in str(body["messages"][-1].get("content")):
            return FakeResponse(status=400, body=json.dumps({"error": {
                "message": "This model's maximum context length is 3300 tokens. However, you requested "
                           "9000 tokens.", "code": "context_length_exceeded"}}))
        return None

    with FakeLLMServer(responder=counts_cjk_dearly) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock,
                       llm={"context_tokens": 3_300, "max_tokens": 200, "protocol": "text"})
        long_turns(app, manual_clock, 3)  # memory that fits the window, not three quarters of it
        [notice] = replies(app, "PASTE: " + "这是一个很长的文档。" * 30, manual_clock)
        assert notice.notice and notice.text == TOO_LONG_NOTICE
        assert len(llm.requests) == 3 + 2  # refused, and refused once more smaller
        [answer] = replies(app, "and what did I say first?", manual_clock)
        assert not answer.notice
        assert "story part 0" in json.dumps(llm.requests[-1].messages)  # the oldest memory kept


def test_a_delivery_turn_is_measured_as_it_is_sent_not_with_the_text_rules(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """A command's output told in json_schema on a small window: its delivery turn carries
    one line of rules (the schema goes to the server), not the full text rules its
    ``current_text`` holds, so it is sent, and the user hears the output: not "too long",
    which had them ask again and run the command twice."""
    with FakeLLMServer(context=800) as llm:  # the window the budget is told: the server holds to it
        app = make_app(base_url=llm.base_url, clock=manual_clock,
                       llm={"context_tokens": 800, "max_tokens": 200, "protocol": "json_schema"})
        with app.runtime.probe(executor("terminal")) as ran:
            sent = replies(app, "run echo via-small-window", manual_clock)
            assert len(ran.envelopes) == 1
    assert [(m.notice, "via-small-window" in m.text) for m in sent] == [(False, True)]
    assert len(llm.requests) == 2 and not any(llm.refusal(r.body) for r in llm.requests)
    assert app.runtime.dead_letters.letters() == []


def test_a_re_ask_in_text_fits_the_window_its_turn_fitted_and_the_user_is_answered(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """SmolLM2-135M on llama.cpp (text, a 2048-token window) answered "Give me a JSON example
    of a person" with a person in JSON, cut off; its re-ask said the whole rules and schema
    again, twice the request, and the user was told their 34 characters were too long. The
    re-ask keeps the rules where its turn had them, reminds of them, and repeats neither the
    rejected reply nor the command: it is sent, within the window, the schema stated once,
    and the user hears the answer."""
    person = ('```json\n{\n    "name": "John",\n    "age": 30,\n    "address": {\n        "city": "New York"'
              + ',\n        "state": "NY"' * 60)
    with FakeLLMServer(context=1_600) as llm:  # the window the budget is told: the server holds to it
        llm.script(FakeResponse(content=person), actions(say("John, 30, of New York.")))
        app = make_app(base_url=llm.base_url, clock=manual_clock, retry=FAST,
                       llm={"context_tokens": 1_600, "max_tokens": 256, "protocol": "text"})
        sent = replies(app, "Give me a JSON example of a person", manual_clock)
    assert [(m.notice, m.text) for m in sent] == [(False, "John, 30, of New York.")]
    first, reask = llm.requests
    assert llm.refusal(reask.body) is None
    rules = "Each action must match one of these JSON schemas"
    assert json.dumps(reask.messages).count(rules) == 1 and rules in reask.messages[0]["content"]  # as first asked
    error = system_message(reask)
    assert error is not None
    assert "Allowed action types in this turn: message_console" in error["full_json_instructions"]
    assert app.runtime.dead_letters.letters() == []


def test_a_delivery_turn_too_big_for_the_window_is_the_runtimes_not_the_users_message_too_long(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """Outputs that fill the window by themselves: the commands ran, so the user hears that
    it is done, never "send it shorter", and the dead letter names the runtime's message
    (the delivery turn's), not a message the user wrote."""
    echoes = [{"type": "terminal", "payload": {"command": f"echo {n}{'x' * 900}"}} for n in range(4)]
    with FakeLLMServer(context=1_600) as llm:
        llm.script(actions(*echoes))
        app = make_app(base_url=llm.base_url, clock=manual_clock, allowed=["echo"],
                       llm={"context_tokens": 1_600, "max_tokens": 256, "protocol": "text"})
        with app.runtime.probe(executor("terminal")) as ran:
            sent = replies(app, "echo four long lines", manual_clock)
            assert len(ran.envelopes) == 4
    assert [(m.notice, m.text) for m in sent] == [(True, DONE_NOTICE)]
    [letter] = app.runtime.dead_letters.letters()
    assert "the runtime's own message of this delivery turn is too long" in letter.detail
    assert "the message is too long" not in letter.detail


@pytest.mark.parametrize("server", ["llama.cpp", "other"])
def test_a_response_format_costs_prompt_tokens_only_where_the_server_puts_it_in_the_prompt(
    make_app: MakeApp, manual_clock: ManualClock, server: str
) -> None:
    """llama.cpp makes the json_schema response format a grammar beside the prompt: on a
    common small window (1024 tokens, 256 for the reply) the chat's memory fits beside the
    instructions, and the model is shown what the user said before; the status says the
    last request fitted. A server that reads the schema as prompt (OpenAI) has it counted."""
    llama = server == "llama.cpp"
    props = {"default_generation_settings": {"n_ctx": 1024}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(context=1024, props=props if llama else None) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, admin={"enabled": True, "port": 0},
                       llm={"max_tokens": 256, "protocol": "json_schema",
                            **({} if llama else {"context_tokens": 1024})})
        replies(app, "My name is Bob.", manual_clock)
        [answer] = replies(app, "What is my name?", manual_clock)
        with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
            [engine] = json.load(response)["reports"]["llm"]["engines"]
    assert not answer.notice
    last = llm.requests[-1]
    assert "response_format" in last.body and llm.refusal(last.body) is None
    assert ("My name is Bob." in json.dumps(last.messages)) == llama  # the memory, beside the grammar
    assert (engine["last_request_tokens"] <= engine["request_budget_tokens"]) == llama


def test_a_window_the_bots_own_instructions_fill_is_the_operators_failure_not_the_users(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """The text protocol's rules and schema alone overflow a 512-token window: "Hi" is
    not "too long, send it shorter" (nothing the user sends would fit); the user hears
    the window is too small for the bot, and /healthz says the LLM fails, naming the
    window, the protocol and what to change."""
    props = {"default_generation_settings": {"n_ctx": 512}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(context=512, props=props) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, admin={"enabled": True, "port": 0},
                       llm={"protocol": "text"})
        [notice] = replies(app, "Hi", manual_clock)
        try:
            urllib.request.urlopen(f"{app.admin.url}/healthz", timeout=10)
            raise AssertionError("/healthz said ok")
        except urllib.error.HTTPError as exc:
            code, health = exc.code, json.loads(exc.read())
    assert notice.notice and notice.text == WINDOW_NOTICE
    assert (code, health["status"]) == (503, "failing")
    reason = health["failing"][LLM]["reason"]
    assert "512 tokens" in reason and "text protocol" in reason
    assert "llama-server -c" in reason and "AUTORESPONSE_LLM__PROTOCOL=json_schema" in reason


def test_a_window_too_small_for_the_bot_goes_on_to_a_fallback_with_room(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """The main model's window cannot hold the bot's instructions: a fallback engine that
    has room answers the user (the main engine's outage is what the status says)."""
    props = {"default_generation_settings": {"n_ctx": 512}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(context=512, props=props) as small, FakeLLMServer() as big:
        big.script(FakeResponse(content=json.dumps({"actions": [
            {"type": "message_console", "payload": {"text": "Hello from the fallback."}}]})))
        app = make_app(base_url=small.base_url, clock=manual_clock,
                       llm={"protocol": "text", "fallbacks": [{"name": "cloud", "base_url": big.base_url,
                                                                "model": "big"}]})
        [reply] = replies(app, "Hi", manual_clock)
        assert (reply.notice, reply.text) == (False, "Hello from the fallback.")
        assert len(big.requests) == 1


# ------------------------------------------------------------------ hostile answers


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": "garbage"},
    {"role": "assistant", "content": None, "tool_calls": [1, 2, 3]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": "not an object"}]},
    {"role": "assistant", "content": 42},
], ids=["string", "ints", "function-string", "number-content"])
def test_malformed_tool_calls_are_a_clear_error_never_a_crash(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, message: dict[str, Any]
) -> None:
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    fake_llm.script(*[FakeResponse(body=body) for _ in range(3)])
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"max_attempts": 1, "stream": False})
    [notice] = replies(app, "hello", manual_clock)
    assert notice.notice
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "llm unavailable"
    assert "malformed LLM response" in letter.detail or "no text content" in letter.detail


def test_hostile_tool_call_arguments_are_bounded_and_re_asked(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    many = tuple(("message_console", {"text": f"spam {n}"}) for n in range(500))
    fake_llm.script(FakeResponse(tool_calls=(("terminal", deep),)), FakeResponse(tool_calls=many),
                    FakeResponse(tool_calls=(("message_console", {"text": "sane at last"}),)))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, llm={"stream": False})
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "hello", manual_clock)
        assert ran.envelopes == []
    assert [m.text for m in sent] == ["sane at last"]
    first, second = (system_message(r)["errors"] for r in fake_llm.requests[1:3])
    assert "nested too deeply" in first[0] or "not JSON" in first[0]
    assert "at most 10 are allowed" in second[0]


def test_a_tool_call_cut_off_mid_arguments_is_replayed_as_json_a_server_can_read(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """vLLM parses the arguments of every assistant tool call it is sent and refuses the
    request where they are not JSON: a call cut off at the token limit is replayed in its
    re-ask as an excerpt in an object, and the user gets the answer to the re-ask."""
    cut_off = '{"text": "Roses are red, violets are'

    def vllm(body: dict[str, Any]) -> FakeResponse:
        for message in body["messages"]:
            for call in message.get("tool_calls") or ():
                try:
                    json.loads(call["function"]["arguments"])
                except ValueError as exc:
                    return FakeResponse(status=400, body=json.dumps({
                        "object": "error", "type": "BadRequestError", "code": 400, "message": str(exc)}))
        if any(message["role"] == "tool" for message in body["messages"]):  # the re-ask
            return FakeResponse(tool_calls=(("message_console", {"text": "Roses are red."}),))
        return FakeResponse(tool_calls=(("message_console", cut_off),), finish_reason="length")

    with FakeLLMServer(responder=vllm) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, retry=FAST, llm={"stream": False})
        sent = replies(app, "write me a poem", manual_clock)
        assert [(m.notice, m.text) for m in sent] == [(False, "Roses are red.")]
        [replayed] = [m for m in llm.requests[1].messages if m.get("tool_calls")]
        assert json.loads(replayed["tool_calls"][0]["function"]["arguments"]) == {"excerpt": cut_off}


def test_a_target_that_names_this_chat_in_words_answers_this_chat(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """Small models fill the optional target with the interface's name or "me": that is here."""
    fake_llm.script(FakeResponse(tool_calls=(("message_console", {"text": "Paris.", "target": "console"}),
                                             ("message_console", {"text": "And hi.", "target": "me"}))))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    sent = replies(app, "capital of France?", manual_clock)
    assert [(m.text, m.chat_id) for m in sent] == [("Paris.", "console"), ("And hi.", "console")]
    assert len(fake_llm.requests) == 1 and app.runtime.dead_letters.letters() == []


def test_a_re_ask_in_json_schema_mode_is_the_turn_asked_again_plainly(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A grammar keeps a small model's JSON valid, not its sense: the answer it rejected
    (an unknown chat as target) would come back the same under the same grammar at
    temperature 0, and shown the error as JSON it writes JSON back. So the re-ask is the
    turn as first asked, without the grammar, with one plain line on why; words are a reply."""
    junk = {"type": "message_console", "payload": {"text": "Paris", "target": "thecapitaloffrance.com"}}
    fake_llm.script(actions(junk), FakeResponse(content="The capital of France is Paris."))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST,
                   llm={"protocol": "json_schema", "stream": False})
    assert [m.text for m in replies(app, "capital of France?", manual_clock)] == ["The capital of France is Paris."]
    first, second = fake_llm.requests
    assert "response_format" in first.body and "response_format" not in second.body
    assert second.messages[:-1] == first.messages[:-1]  # the same instructions and memory
    asked = second.messages[-1]["content"]
    assert asked.startswith("capital of France?") and "thecapitaloffrance.com" in asked
    assert system_message(second) is None  # no error as JSON to write back
    assert app.runtime.dead_letters.letters() == []


def test_a_model_that_says_the_plain_re_asks_note_back_is_never_shown_it_as_the_answer(
    make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """SmolLM2-135M on llama.cpp ran `uptime` and a command off the allowlist; asked again
    plainly why that one was refused, it answered with the note itself, word for word, at
    every try. The note is the runtime's words, like its schema: the user hears the output
    and the failure notice, never the note, and the chat's memory does not keep it."""
    def model(body: dict[str, Any]) -> str:
        asked = str(body["messages"][-1]["content"])
        if f"({PLAIN_RETRY_NOTE}" in asked:  # the plain re-ask: its note said back
            return asked[asked.index(f"({PLAIN_RETRY_NOTE}"):]
        if '"type": "output"' in asked:
            return json.dumps({"actions": [say(json.loads(asked)["system_message"]["outputs"][0]["output"])]})
        if asked == "uptime":
            return json.dumps({"actions": [{"type": "terminal", "payload": {"command": "uptime"}},
                                           {"type": "terminal", "payload": {"command": "get_uptime_stats"}}]})
        return json.dumps({"actions": [say("Hello.")]})

    props = {"default_generation_settings": {"n_ctx": 4096}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(responder=model, props=props) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, retry=FAST)
        sent = replies(app, "uptime", manual_clock)
        reasked = [r for r in llm.requests if f"({PLAIN_RETRY_NOTE}" in str(r.messages[-1]["content"])]
        replies(app, "hello", manual_clock)
        remembered = llm.requests[-1].messages[:-1]
    assert not any(PLAIN_RETRY_NOTE in m.text for m in sent)
    assert [m.notice for m in sent] == [False, True] and "load average" in sent[0].text
    assert len(reasked) > 1  # the echo was asked again, not taken for an answer
    assert not any(PLAIN_RETRY_NOTE in str(m["content"]) for m in remembered)


def test_plain_words_cut_off_in_a_loop_are_said_once(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    looped = "The sky is blue." + " It is the air that makes it so." * 30 + " It is the a"
    fake_llm.script(FakeResponse(content=looped, finish_reason="length"))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"stream": False})
    assert [m.text for m in replies(app, "What colour is the sky?", manual_clock)] == [
        "The sky is blue. It is the air that makes it so."]


def test_finding_a_loop_takes_linear_time_on_a_huge_reply() -> None:
    from autoresponse.actors.extractor import without_loop

    import random

    rng = random.Random(7)
    text = "".join(rng.choice("abcdefgh ") for _ in range(400_000))  # no loop at all
    assert without_loop(text) == text
    assert without_loop("ab" * 200_000) == "ab"


def test_an_enforced_answer_that_loops_to_its_limit_gets_one_short_plain_try(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A small model can loop inside the JSON a grammar forces on it: the same call asks
    once more, shorter and unconstrained, and a plain answer is the reply."""
    looped = '{"actions": [{"type": "terminal", "payload": {"command": "print_to_json_string_to_json_string'
    fake_llm.script(FakeResponse(content=looped, finish_reason="length"), FakeResponse(content="Paris."))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"protocol": "json_schema", "stream": False})
    with app.runtime.probe(executor("terminal")) as ran:
        assert [m.text for m in replies(app, "capital of France?", manual_clock)] == ["Paris."]
        assert ran.envelopes == []
    first, second = fake_llm.requests
    assert "response_format" in first.body and "response_format" not in second.body
    assert second.body["max_tokens"] == 300


#: A delivery's enforced answer as SmolLM2 wrote it, a whole message and then a loop to
#: the token limit: in the target it copied the output into, or in a second action.
DELIVERY_LOOPS = {
    "in-its-target": '{"actions": [\n{"type": "message_console", "payload": { "text": "hi there\\n", '
                     '"target": "response_json_' + "response_json_" * 60,
    "in-a-second-action": '{"actions": [{"type": "message_console", "payload": {"text": "hi there\\n"}}, '
                          '{"type": "message_console", "payload": {"text": "response_json_' + "response_json_" * 60,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("loop", DELIVERY_LOOPS.values(), ids=DELIVERY_LOOPS.keys())
def test_a_delivery_that_loops_to_its_limit_after_a_whole_message_says_that_message(
    make_app: MakeApp, manual_clock: ManualClock, loop: str, stream: bool
) -> None:
    """The command's output, said whole before the model looped, reaches the user; what
    the model would write asked again, plainly, is never asked for."""
    def model(body: dict[str, Any]) -> FakeResponse:
        if '"type": "output"' in str(body["messages"][-1]["content"]):
            if body.get("response_format"):
                return FakeResponse(content=loop, finish_reason="length")
            return FakeResponse(content="The runtime provides a command-line interface.")
        return actions({"type": "terminal", "payload": {"command": "echo hi there"}})

    props = {"default_generation_settings": {"n_ctx": 4096}, "chat_template_caps": {"supports_tools": False}}
    with FakeLLMServer(responder=model, props=props) as llm:
        app = make_app(base_url=llm.base_url, clock=manual_clock, allowed=["echo"], llm={"stream": stream})
        sent = replies(app, "run the command: echo hi there", manual_clock)
    assert [m.text.strip() for m in sent] == ["hi there"]
    assert all("response_format" in r.body for r in llm.requests)  # never asked again unconstrained


#: What llama.cpp's server says when the grammar it built from a schema or the tools
#: breaks on a token the model wrote (it ends that request; the next may not break).
GRAMMAR_BROKE = 'got exception: Unexpected empty grammar stack after accepting piece: ."}]} (1025)'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("protocol", ["json_schema", "tools"])
def test_a_grammar_that_breaks_mid_answer_gets_the_turn_asked_once_as_json_in_text(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, protocol: str, stream: bool
) -> None:
    """The server's enforcement of the format fails on one answer: that turn is asked once
    more without it (not the same request again), the user gets the answer, and the
    engine goes on speaking its protocol."""
    broke = (FakeResponse(content=json.dumps({"actions": [say("The sky is")]}), stream_error=GRAMMAR_BROKE)
             if stream else FakeResponse(status=500, body=json.dumps(
                 {"error": {"code": 500, "message": GRAMMAR_BROKE, "type": "server_error"}})))
    fake_llm.script(broke, actions(say("The sky is blue.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, llm={"protocol": protocol, "stream": stream})
    assert [m.text for m in replies(app, "what colour is the sky?", manual_clock) if not m.preview] == [
        "The sky is blue."]
    first, second = fake_llm.requests
    constrained = "response_format" if protocol == "json_schema" else "tools"
    assert constrained in first.body
    assert "response_format" not in second.body and "tools" not in second.body
    assert '"actions"' in second.messages[0]["content"]  # asked for JSON in words instead
    # Not learnt: the next turn is asked with the grammar again.
    replies(app, "and the grass?", manual_clock)
    assert constrained in fake_llm.requests[-1].body
    assert app.runtime.dead_letters.letters() == []


def test_an_error_event_in_a_stream_is_the_servers_own_words_and_retried_like_its_status(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """A stream the server ends with an error event is a failure that says what the server
    said (not 'the stream ended'); a 5xx is retried as such, here until it gives up."""
    failing = FakeResponse(content=json.dumps({"actions": [say("half")]}), stream_error="the slot crashed")
    fake_llm.script(failing, failing, failing)
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock,
                   llm={"protocol": "json_schema", "stream": True, "max_attempts": 3})
    sent = replies(app, "hello", manual_clock)
    assert [m.notice for m in sent if not m.preview] == [True]
    assert len(fake_llm.requests) == 3
    assert all("response_format" in r.body for r in fake_llm.requests)  # not a grammar: asked as it was
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "llm unavailable" and "the slot crashed" in letter.detail
    assert "in its stream" in letter.detail


def test_earlier_tool_calls_shown_as_json_in_text_carry_their_payload_as_an_object() -> None:
    """A tools turn asked again as JSON in text shows the calls made before as actions the
    extractor would take: a payload that is an object, not its JSON as a string."""
    ctx = OriginalContext(interface_name="console", chat_id="console", user_id="me")
    turns = (Turn(role="user", content="run it"),
             Turn(role="assistant", content="", tool_calls=(
                 ToolCall(id="c1", name="terminal", arguments='{"command": "echo hi"}'),
                 ToolCall(id="c2", name="terminal", arguments="not json"))))
    prompt = build_chat_request("and now?", ctx, allowed_actions=["terminal", "message_console"], turns=turns)
    shown = json.loads(render_openai_messages(prompt, "text")[2]["content"])
    assert shown["actions"] == [{"type": "terminal", "payload": {"command": "echo hi"}},
                                {"type": "terminal", "payload": "not json"}]


@pytest.mark.parametrize("written", [
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo WRITTEN-OUT"}}\n</tool_call>',
    '{"name": "terminal", "parameters": {"command": "echo WRITTEN-OUT"}}',
    '<tool_call>{"name": "terminal", "arguments": "{\\"command\\": \\"echo WRITTEN-OUT\\"}"}</tool_call>',
    '[TOOL_CALLS] [{"name": "terminal", "arguments": {"command": "echo WRITTEN-OUT"}}]',
    '{"type": "function", "function": {"name": "terminal", "arguments": "{\\"command\\": \\"echo WRITTEN-OUT\\"}"}}',
], ids=["hermes", "llama", "arguments-as-text", "mistral", "openai-shape"])
def test_a_tool_call_the_model_wrote_out_in_words_is_carried_out(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, written: str
) -> None:
    """Where the server's tool parser misses the model's format, its tool call comes as
    text; it was refused for lacking a "type", and the user got the give-up notice."""
    fake_llm.script(FakeResponse(content=written), actions(say("It printed WRITTEN-OUT.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, allowed=["echo"])
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "print it", manual_clock)
        assert [r.action.payload.command for r in ran.bodies(ActionRequest)] == ["echo WRITTEN-OUT"]
    assert [(m.text, m.notice) for m in sent] == [("It printed WRITTEN-OUT.", False)]
    assert "WRITTEN-OUT" in system_message(fake_llm.requests[1])["outputs"][0]["output"]


@pytest.mark.parametrize("quoted", [
    '{"type": "message_console", "payload": {"text": "The model sends {"name": "terminal", '
    '"arguments": {"command": "echo QUOTED"}} to the server."}}',
    'A call looks like {"name": "terminal", "arguments": {"command": "echo QUOTED"}}\n'
    '{"actions": [{"type": "message_console", "payload": {"text": "That is the format."}}]}',
], ids=["inside-a-message", "beside-an-action"])
def test_a_tool_call_quoted_in_words_is_never_carried_out(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, quoted: str
) -> None:
    """Only a reply that is nothing but written-out calls is read as calls: one quoted in a
    message (its quotes unescaped, as models write them) or beside other words ran its
    command, and the explanation never reached the user."""
    fake_llm.script(FakeResponse(content=quoted), actions(say("It looks like a name and its arguments.")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, retry=FAST, allowed=["echo"])
    with app.runtime.probe(executor("terminal")) as ran:
        sent = replies(app, "what does a tool call look like?", manual_clock)
        assert ran.envelopes == []
    assert "It looks like a name and its arguments." in [m.text for m in sent]
