"""Finding actions in what LLMs really write, and rejecting what is wrong."""

from __future__ import annotations

import pytest

from autoresponse.actors.extractor import extract_actions

ALL = ("terminal", "message_console", "event")
TERMINAL = '{"type": "terminal", "payload": {"command": "df -h"}}'


@pytest.mark.parametrize(
    "text",
    [
        f"```json\n{TERMINAL}\n```",
        f"Sure, here you go:\n```\n{TERMINAL}\n```\nAnything else?",
        f"I will check the disks. {TERMINAL} That should do it.",
        f'{{"actions": [{TERMINAL}]}}',
        f"[{TERMINAL}]",
        TERMINAL,
        TERMINAL.replace('"terminal"', '"bash"'),
    ],
    ids=["fenced", "fence-in-prose", "prose", "actions-key", "bare-list", "single", "bash-alias"],
)
def test_the_shapes_llms_answer_in(text: str) -> None:
    found = extract_actions(text, ALL)
    assert found.errors == ()
    assert [(a.type, a.payload.command) for a in found.actions] == [("terminal", "df -h")]


def test_several_actions_in_one_reply_keep_their_order() -> None:
    text = ('{"actions": [{"type": "message_console", "payload": {"text": "checking"}}, '
            f"{TERMINAL}]}}")
    assert [a.type for a in extract_actions(text, ALL).actions] == ["message_console", "terminal"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"actions": [{"type": "terminal", "payload": ', "invalid JSON"),
        ("I cannot do that, sorry.", "no JSON found"),
        ('{"type": "teleport", "payload": {}}', "unknown action type 'teleport'"),
        ('{"type": "terminal", "payload": {"cmd": "df"}}', "invalid payload: payload.command: Field required"),
        ('{"type": "event", "payload": {"date": "soon", "description": "x"}}', "invalid payload: payload.date"),
        ('{"actions": []}', "holds no action"),
        ('{"payload": {"text": "hi"}}', 'missing "type"'),
        ("[1]", "expected an object"),
    ],
)
def test_what_is_wrong_becomes_one_clear_error(text: str, error: str) -> None:
    found = extract_actions(text, ALL)
    assert found.actions == ()
    assert len(found.errors) == 1
    assert error in found.errors[0]


def test_valid_actions_survive_next_to_invalid_ones() -> None:
    text = f'[{TERMINAL}, {{"type": "teleport", "payload": {{}}}}]'
    found = extract_actions(text, ALL)
    assert [a.type for a in found.actions] == ["terminal"]
    assert found.errors == ("action 2: unknown action type 'teleport'; allowed: event, message_console, terminal",)


def test_an_action_the_turn_does_not_allow_is_rejected() -> None:
    found = extract_actions(TERMINAL, ["message_console"])
    assert found.actions == ()
    assert "'terminal' is not allowed in this turn" in found.errors[0]


def test_an_echoed_system_message_is_never_executed() -> None:
    echo = ('{"system_message": {"type": "output", "outputs": []}, '
            f'"actions": [{TERMINAL}]}}')
    found = extract_actions(echo, ALL)
    assert found.actions == ()
    assert "system_message" in found.errors[0]
