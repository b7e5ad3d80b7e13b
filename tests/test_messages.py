"""The protocol: action models, the generated schema, system messages, prompts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from autoresponse.actors.prompts import (
    build_chat_request,
    build_delivery_request,
    full_json_instructions,
    render_openai_messages,
    response_format,
    tool_definitions,
)
from autoresponse.interfaces.terminal import TerminalAction
from autoresponse.messages import (
    ActionResult,
    OriginalContext,
    SystemMessage,
    action_models,
    parse_action,
)

CTX = OriginalContext(chat_id=42, message_id=7, interface_name="console", original_command="run df -h")


def schema_of(instructions: str) -> dict[str, Any]:
    return json.loads(instructions.rsplit("\n", 1)[1])


def action_types_in(schema: Any) -> set[str]:
    """Every value the schema allows for an action's "type" field."""
    found: set[str] = set()
    if isinstance(schema, dict):
        tag = schema.get("properties", {}).get("type")
        if isinstance(tag, dict):
            found |= set(tag.get("enum", [])) | ({tag["const"]} if "const" in tag else set())
        for value in schema.values():
            found |= action_types_in(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= action_types_in(value)
    return found


def test_bash_is_an_alias_of_terminal() -> None:
    action = parse_action({"type": "bash", "payload": {"command": "uptime"}})
    assert isinstance(action, TerminalAction)
    assert action.type == "terminal"


def test_the_schema_shown_is_generated_from_the_models() -> None:
    every = [m.action_type() for m in action_models()]
    schema = schema_of(full_json_instructions(every))
    assert action_types_in(schema) == {"terminal", "event", "message_console", "message_telegram_bot",
                                       "message_reddit", "message_x", "message_telethon"}
    # A field added to a model shows up without writing the schema again.
    assert "command" in json.dumps(schema) and "repeat" in json.dumps(schema)


def test_instructions_list_only_the_allowed_actions() -> None:
    schema = schema_of(full_json_instructions(["message_console"]))
    assert action_types_in(schema) == {"message_console"}


def test_unknown_action_types_cannot_be_allowed() -> None:
    with pytest.raises(ValueError, match="teleport"):
        full_json_instructions(["teleport"])


def test_an_error_system_message_needs_its_errors_and_policy() -> None:
    with pytest.raises(ValidationError):
        SystemMessage(type="error", original_context=CTX, full_json_instructions="x")


def test_a_non_zero_exit_is_never_ok() -> None:
    assert ActionResult(action_type="terminal", output="", exit_code=1).ok is False


def test_oversized_message_text_is_an_invalid_payload() -> None:
    with pytest.raises(ValidationError, match="at most 32000"):
        parse_action({"type": "message_console", "payload": {"text": "x" * 32_001}})


#: Texts that show nothing, as models write them: spaces and line breaks, Unicode spaces and
#: separators, zero-width characters and the BOM, a soft hyphen, Hangul fillers, a lone
#: variation selector.
BLANK = [" \n ", "\t\r\n", "\u00a0\u2007\u202f\u3000", "\u2028\u2029\x85",
         "\u200b\u200c\u200d\u2060\ufeff", " \u200b\n\u00ad ", "\u3164\u115f\uffa0", "\ufe0f"]


def message_types() -> list[str]:
    return sorted(m.action_type() for m in action_models() if m.kind == "message")


@pytest.mark.parametrize("text", BLANK, ids=range(len(BLANK)))
def test_blank_message_text_is_an_invalid_payload_of_every_message_action(text: str) -> None:
    assert {"message_console", "message_reddit", "message_telegram_bot"} <= set(message_types())
    for kind in message_types():
        with pytest.raises(ValidationError, match="the text is blank"):
            parse_action({"type": kind, "payload": {"text": text}})


@pytest.mark.parametrize("text", [" ok ", "\u200bhi\u200b", "\U0001f642", "\u00a0.\u00a0", "\u3164a",
                                  "\n\n```\nx\n```"])
def test_message_text_with_anything_to_show_is_valid(text: str) -> None:
    for kind in message_types():
        assert parse_action({"type": kind, "payload": {"text": text}}).payload.text == text  # kept as written


def test_the_schema_shown_says_a_message_may_not_be_blank() -> None:
    for kind in message_types():
        schema = schema_of(full_json_instructions([kind]))
        [text] = [d["properties"]["text"] for d in schema["$defs"].values()
                  if "text" in d.get("properties", {})]
        assert "never only spaces or invisible characters" in text["description"]
        assert text["type"] == "string" and text["minLength"] == 1  # still a plain, valid string schema
        # The schemas a server enforces say so too (tools, json_schema): a description, no pattern.
        [tool] = tool_definitions([kind])
        assert "never only spaces" in tool["function"]["parameters"]["properties"]["text"]["description"]
        assert "never only spaces" in json.dumps(response_format([kind]))
        assert '"pattern"' not in json.dumps(schema)


def test_a_delivery_prompt_carries_the_system_message_and_its_context() -> None:
    message = SystemMessage(
        type="output", original_context=CTX,
        full_json_instructions=full_json_instructions(["message_console"]),
        outputs=[ActionResult(action_type="terminal", command="df -h", output="/ 42%")],
    )
    prompt = build_delivery_request(message, allowed_actions=["message_console"])
    assert prompt.mode == "delivery"
    rendered = render_openai_messages(prompt)
    sent = json.loads(rendered[-1]["content"])["system_message"]
    assert sent["type"] == "output"
    assert sent["original_context"]["chat_id"] == 42
    assert sent["outputs"][0]["output"] == "/ 42%"


def test_a_chat_prompt_shows_the_rules_in_the_system_turn() -> None:
    prompt = build_chat_request("run df -h", CTX, allowed_actions=["terminal", "message_console"])
    system, user = render_openai_messages(prompt)
    assert "Allowed action types in this turn: message_console, terminal." in system["content"]
    assert user == {"role": "user", "content": "run df -h"}
