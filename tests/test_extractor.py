"""Finding actions in what LLMs really write, and rejecting what is wrong."""

from __future__ import annotations

import doctest
import json
import queue
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from autoresponse.actors import extractor
from autoresponse.actors.extractor import Extraction, extract_actions, extract_tool_calls
from autoresponse.actors.limits import MAX_ACTIONS_PER_REPLY, MAX_JSON_DEPTH, MAX_REPLY_CHARS
from autoresponse.messages import ToolCall

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
        ('{"type": "message_console", "payload": {"text": " \\n\\u00a0\\u200b "}}',
         "invalid payload: payload.text: the text is blank (only spaces or invisible characters)"),
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


@pytest.mark.parametrize("text", ["Sure, here it is.", "\u200b\u3164 \u2060"], ids=["words", "invisible"])
def test_only_a_reply_that_would_show_is_prose(text: str) -> None:
    """Prose is delivered as the reply: one that would show nothing is no answer (the
    message action it would become refuses blank text), so it is re-asked instead."""
    found = extract_actions(text, ALL)
    assert found.prose is bool(text.strip("\u200b\u3164 \u2060"))


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


def test_an_echo_inside_broken_json_is_never_executed() -> None:
    # The trailing comma breaks the whole; the actions inside it must not run alone.
    echo = ('{"system_message": {"type": "output", "outputs": []}, '
            f'"actions": [{TERMINAL}],}}')
    found = extract_actions(echo, ALL)
    assert found.actions == ()
    assert found.errors == ("your reply carries a system_message; that is runtime data and is never executed",)


@pytest.mark.parametrize("key", [r"system\u005fmessage", r"\u0073ystem_message"])
def test_an_echo_spelled_with_json_escapes_is_never_executed(key: str) -> None:
    """JSON decodes ``\\u005f`` to ``_``: the key is the same, in a reply or a tool call."""
    echo = f'{{"{key}": {{"type": "output", "outputs": []}}, "actions": [{TERMINAL}]}}'
    assert "system_message" not in echo and json.loads(echo).keys() >= {"system_message"}
    found = extract_actions(echo, ALL)
    assert found.actions == ()
    assert found.errors == (extractor._ECHO_ERROR,)
    call = ToolCall(id="c1", name="terminal", arguments=f'{{"command": "df -h", "nested": {{"{key}": 1}}}}')
    called = extract_tool_calls((call,), ALL)
    assert called.actions == ()
    assert called.errors == (extractor._ECHO_ERROR,)


def test_the_module_example_holds() -> None:
    assert doctest.testmod(extractor).failed == 0


def test_the_dispatchers_examples_hold() -> None:
    from autoresponse.actors import dispatcher

    assert doctest.testmod(dispatcher).failed == 0


# ------------------------------------------------- JSON among fences, quotes and prose


def message(text: str) -> str:
    return json.dumps({"type": "message_console", "payload": {"text": text}})


def texts(found: Extraction) -> list[str]:
    return [a.payload.text if a.type == "message_console" else a.payload.command
            for a in found.actions]


def test_code_fences_inside_a_json_string_are_text() -> None:
    shown = "Here's your disk usage:\n```\nFilesystem  Use%\n/dev/sda1  42%\n```\nAll fine."
    text = '```json\n{"actions": [' + message(shown) + ']}\n```'
    assert "\\n```\\n" in text  # the inner fences sit in the JSON string, escaped
    found = extract_actions(text, ALL)
    assert found.errors == ()
    assert [a.type for a in found.actions] == ["message_console"]
    assert texts(found) == [shown]


@pytest.mark.parametrize(
    "shown",
    ['braces { and } and [ and ]', 'a "quoted" word', "a back\\slash \\", 'all: {"[\\"]}', "```"],
    ids=["brackets", "quotes", "backslashes", "mixed", "fence"],
)
@pytest.mark.parametrize(
    "wrap",
    ["{}", "Sure! {} Anything else?", "Here:\n```json\n{}\n```\nDone.", "```\n{}\n```"],
    ids=["bare", "prose", "fenced-in-prose", "fenced"],
)
def test_json_strings_may_hold_anything(shown: str, wrap: str) -> None:
    found = extract_actions(wrap.format(message(shown)), ALL)
    assert found.errors == ()
    assert texts(found) == [shown]


def test_two_separate_json_objects_both_count_in_order() -> None:
    text = f"First I check:\n{TERMINAL}\nthen I tell you:\n{message('checking {disks}')}"
    assert texts(extract_actions(text, ALL)) == ["df -h", "checking {disks}"]


@pytest.mark.parametrize(
    "text",
    [
        f"```json\n{TERMINAL}\n```\nIf you need more {{ just ask.",
        f"```json\n{TERMINAL}\n```\nUse [ and {{ with care: \"like {{ this\"",
        f'I will use {{the "quote\n{TERMINAL}',
        f'I will use {{the "quote {TERMINAL}',
        f'Type "{{" to open an object: {TERMINAL}',
        f"{{ a brace around it: {TERMINAL} }}",
        f"Step [1], see [2]: ```json\n{TERMINAL}\n```",
        f"Set {{x}} to [] first.\n{TERMINAL}",
    ],
    ids=["stray-brace-after", "stray-brackets-and-quotes-after", "brace-and-quote-before",
         "brace-and-quote-same-line", "quoted-brace", "brace-around", "footnotes", "empty-groups"],
)
def test_stray_brackets_and_quotes_in_prose_are_no_json(text: str) -> None:
    found = extract_actions(text, ALL)
    assert found.errors == ()
    assert texts(found) == ["df -h"]


def test_a_raw_newline_in_a_string_is_invalid_json() -> None:
    found = extract_actions('{"type": "message_console", "payload": {"text": "a\nb"}}', ALL)
    assert found.actions == ()
    assert found.errors == (
        "your reply is not an action list: invalid JSON (Invalid control character at at line 1 column 51)",)


def test_a_reply_cut_short_is_invalid_json_where_it_stops() -> None:
    found = extract_actions(f"Sure, here it is: {TERMINAL[:40]}", ALL)
    assert found.errors == (
        "your reply is not an action list: invalid JSON (Unterminated string starting at at line 1 column 52)",)


# ------------------------------------------------------------------- the limits


def test_a_reply_over_the_size_limit_is_not_read() -> None:
    text = TERMINAL + " " * (MAX_REPLY_CHARS - len(TERMINAL) + 1)
    found = extract_actions(text, ALL)
    assert found.actions == ()
    assert found.errors == (
        f"your reply is {MAX_REPLY_CHARS + 1:,} characters long; at most {MAX_REPLY_CHARS:,} are allowed",)
    assert texts(extract_actions(text[:MAX_REPLY_CHARS], ALL)) == ["df -h"]


@pytest.mark.parametrize(
    "text",
    ['{"actions": [' + ", ".join([TERMINAL] * 1000) + "]}", "\n".join([TERMINAL] * 1000)],
    ids=["one-list", "separate-objects"],
)
def test_a_reply_with_too_many_actions_runs_none(text: str) -> None:
    found = extract_actions(text, ALL)
    assert found.actions == ()
    assert found.errors == (
        f"your reply has 1000 actions; at most {MAX_ACTIONS_PER_REPLY} are allowed per reply",)


def test_the_action_limit_is_inclusive_and_can_be_set() -> None:
    text = "[" + ", ".join([TERMINAL] * MAX_ACTIONS_PER_REPLY) + "]"
    assert len(extract_actions(text, ALL).actions) == MAX_ACTIONS_PER_REPLY
    found = extract_actions(text, ALL, max_actions=2)
    assert found.actions == ()
    assert found.errors == (f"your reply has {MAX_ACTIONS_PER_REPLY} actions; at most 2 are allowed per reply",)


def nested(depth: int, inner: str = "") -> str:
    """``inner`` inside ``depth`` lists."""
    return "[" * depth + inner + "]" * depth


def test_nesting_up_to_the_limit_is_read_and_deeper_is_not() -> None:
    # TERMINAL itself nests two deep.
    assert extract_actions(nested(MAX_JSON_DEPTH - 2, TERMINAL), ALL).errors == (
        "action 1: expected an object, got list",)
    assert extract_actions(nested(MAX_JSON_DEPTH - 1, TERMINAL), ALL).errors == (
        f"your reply is not an action list: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)",)


def test_json_nested_too_deeply_does_not_stop_the_rest() -> None:
    found = extract_actions(f"{TERMINAL}\nand {nested(100)}", ALL)
    assert texts(found) == ["df -h"]
    assert found.errors == (
        f"part of your reply was not read: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)",)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, nested(100_000), '{"a":' * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
     '{"actions": [' + nested(100_000, TERMINAL) + "]}"],
    ids=["open-lists", "closed-lists", "open-objects", "closed-objects", "deep-inside-actions"],
)
def test_deep_nesting_is_an_error_never_a_recursion_error(text: str) -> None:
    found = extract_actions(text, ALL, max_chars=len(text))
    assert found.actions == ()
    assert found.errors == (
        f"your reply is not an action list: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)",)


def test_the_echo_check_walks_any_depth() -> None:
    deep: Any = {"system_message": {}}
    for _ in range(100_000):
        deep = [deep]
    assert extractor._carries_system_message(deep)


# --------------------------------------------------------- linear in the reply's size

T = TypeVar("T")
MB = 1_000_000


def fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def prose_with_braces(size: int) -> str:
    words = ["the", "disk", "is", "full", "{", "{", "}", "see", "[1]", "it's", '"df"', "\n"]
    rng = random.Random(7)
    return fill(" ".join(rng.choice(words) for _ in range(size // 3)), size)


def within(seconds: float, work: Callable[[], T]) -> T:
    """What ``work`` returns, computed in a thread that must finish within ``seconds``:
    far longer than linear work takes on a busy machine, far shorter than quadratic
    work on the same input (the former extractor took minutes on 1 MB)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(exc)

    worker = threading.Thread(target=run, name="extract-under-test", daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still extracting after {seconds} s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


GARBAGE = {
    "open-braces": lambda: "{" * MB,
    "open-brackets": lambda: "[" * MB,
    "closed-brackets": lambda: nested(MB // 2),
    "prose-with-braces": lambda: prose_with_braces(MB),
    "stray-brace-every-few-words": lambda: fill("a { b ", MB),
    "keys-never-closed": lambda: fill('{"a": ', MB),
    "unterminated-string": lambda: '{"a": "' + "x" * MB,
    "escaped-quotes": lambda: fill('"\\', MB),
}


@pytest.mark.parametrize("make", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_megabyte_of_garbage_is_rejected_quickly(make: Callable[[], str]) -> None:
    text = make()
    found = within(10, lambda: extract_actions(text, ALL, max_chars=len(text)))
    assert found.actions == ()
    assert len(found.errors) == 1
    assert found.errors[0].startswith("your reply ")


COSTLIEST = {  # the most work per character: many tiny groups, strings that are no strings
    "empty-objects": "{}",
    "footnotes": "[1]",
    "quoted-braces": '"{',
    "brace-quotes": '{"',
    "words-after-strings": '{"a" b ',
}


@pytest.mark.parametrize("unit", COSTLIEST.values(), ids=COSTLIEST.keys())
def test_the_costliest_replies_within_the_size_limit_are_rejected_quickly(unit: str) -> None:
    text = fill(unit, MAX_REPLY_CHARS)
    found = within(10, lambda: extract_actions(text, ALL))
    assert found.actions == ()
    assert found.errors


def test_a_garbage_reply_does_not_hold_up_the_next_one() -> None:
    # One dispatcher reads replies one after the other, as here.
    replies: queue.Queue[str] = queue.Queue()
    results: queue.Queue[Extraction] = queue.Queue()

    def dispatcher() -> None:
        for _ in range(2):
            results.put(extract_actions(replies.get(), ALL, max_chars=2 * MB))

    worker = threading.Thread(target=dispatcher, name="dispatcher-under-test", daemon=True)
    worker.start()
    replies.put(prose_with_braces(MB) + fill("a { b ", MB // 2))
    replies.put(f"Sure: {TERMINAL}")
    try:
        garbage = results.get(timeout=10)
        found = results.get(timeout=10)
    finally:
        worker.join(10)
    assert garbage.actions == ()
    assert texts(found) == ["df -h"]


# ------------------------------------------------------ a reply cut off in a loop

#: Plain-word replies a small model looped in until its token limit, each as (its first
#: words, the phrase it then repeats, what the user is to get): the first two are
#: SmolLM2's own answers to "Translate hello into French" and "Write a haiku about rain".
LOOPED = {
    "french-apology": ("Je suis désolé, ", "je suis désolé, ", "Je suis désolé"),
    "haiku-lines": ("Rain, a fleeting, a fleeting, a fleeting,\n",
                    "A fleeting, a fleeting, a fleeting,\n",
                    "Rain, a fleeting, a fleeting, a fleeting"),
    "english-words-only": ("", "I love you so much ", "I love you so much"),
    "accented-words-only": ("Ça a été très compliqué ", "ça a été très compliqué ",
                            "Ça a été très compliqué"),
    "sentences": ("The sky is blue.", " It is the air.", "The sky is blue. It is the air."),
}


@pytest.mark.parametrize("first, phrase, said", LOOPED.values(), ids=LOOPED.keys())
def test_a_reply_cut_off_in_a_loop_says_its_phrase_once_and_whole(
    first: str, phrase: str, said: str
) -> None:
    # The token limit may cut the last repetition anywhere, even inside a word.
    for cut in range(len(phrase)):
        text = first + phrase * 36 + phrase[:cut]
        assert (cut, extractor.without_loop(text)) == (cut, said)


def test_the_looped_replies_seen_live_are_not_cut_inside_a_word() -> None:
    """The shapes of repro/loop_cut.py: the user got "Je suis désolé, je suis dé"."""
    apology = "Je suis désolé, " + "je suis désolé, " * 36 + "je suis dé"
    haiku = ("Rain, a fleeting, a fleeting, a fleeting,\n"
             + "A fleeting, a fleeting, a fleeting,\n" * 19 + "A fleeting")
    assert extractor.without_loop(apology) == "Je suis désolé"
    assert extractor.without_loop(haiku) == "Rain, a fleeting, a fleeting, a fleeting"


@pytest.mark.parametrize(
    "text, said",
    [
        ("Je suis désolé, " + "je suis désolé, " * 6_400, "Je suis désolé"),  # 100 kB
        ("AB" * 50_000 + "ab" * 50_000, "AB"),  # a loop that differs only in capitals, long
        ("ab" * 100_000, "ab"),
    ],
    ids=["phrase", "capitals", "no-word-end"],
)
def test_cutting_a_huge_loop_takes_linear_time(text: str, said: str) -> None:
    assert within(10, lambda: extractor.without_loop(text)) == said


#: SmolLM2's reply to "run echo hi there" (repro/loop_inner.py, tools.jsonl call 1, cut
#: off at its token limit): a paragraph whose two sentences end alike, looped 5 times.
PARAGRAPH_LOOP_SEEN_LIVE = (
    "The runtime environment is designed to be flexible and can be customized to suit"
    " your needs. In this case, the runtime environment is set to run the command"
    ' "echo hi there" on the console.\n\n'
    "The runtime environment is a programming language that allows you to run"
    " applications and services on the internet. It is a programming language that is"
    " used to create applications and services.\n\n"
    "The runtime environment is a programming language that is used to create"
    " applications and services. It is a programming language that is used to create"
    " web applications.\n\n"
    + "\n\n".join(["The runtime environment is a programming language that is used to"
                   " create web applications. It is a programming language that is used"
                   " to create web applications."] * 5)
)


def test_a_looped_paragraph_whose_sentences_end_alike_is_said_once() -> None:
    """The live reply was delivered whole (1,365 characters, stripped as the dispatcher
    strips it): the end of its last sentence also ends the sentence before it, which is
    not where the loop repeats."""
    said = extractor.without_loop(PARAGRAPH_LOOP_SEEN_LIVE)
    # The loop begins with the third paragraph's last sentence; each of its two
    # sentences is said once, after the three paragraphs that came before it.
    first_three = "\n\n".join(PARAGRAPH_LOOP_SEEN_LIVE.split("\n\n")[:3])
    assert said == first_three + (
        "\n\nThe runtime environment is a programming language that is used to create"
        " web applications.")
    assert said.count("is used to create web applications.") == 2
    paragraph = ("The runtime environment is a programming language that is used to create web"
                 " applications. It is a programming language that is used to create web"
                 " applications.")
    assert extractor.without_loop("Sure. " + "\n\n".join([paragraph] * 6)) == "Sure. " + paragraph


def test_a_looped_paragraph_of_sentences_ending_alike_is_cut_wherever_the_limit_fell() -> None:
    # each sentence ends in the same 50 characters, longer than the end compared
    paragraph = ("The cat sat on the old mat by the door in the warm afternoon sun."
                 " The dog sat on the old mat by the door in the warm afternoon sun."
                 " Then all sat on the old mat by the door in the warm afternoon sun.")
    for cut in range(len(paragraph) + 2):
        text = "Sure. " + ("\n\n".join([paragraph] * 6) + "\n\n")[:-cut or None]
        assert (cut, extractor.without_loop(text)) == (cut, "Sure. " + paragraph)


def test_a_huge_looped_paragraph_of_sentences_ending_alike_takes_linear_time() -> None:
    paragraph = "".join(f"Part {n} is a language that is used to create web applications. "
                        for n in range(7))
    text = "Sure. " + paragraph * (100_000 // len(paragraph))  # 100 kB
    assert within(10, lambda: extractor.without_loop(text)) == "Sure. " + paragraph.rstrip()


#: Replies whose lines end alike without being a loop: they come back as they are.
NOT_LOOPS = {
    "numbered-list": "".join(f"{n}. Restart the service so that the new settings take effect.\n"
                             for n in range(1, 13)),
    "table-rows": "| host | state |\n|---|---|\n" + "".join(
        f"| web-{n:02} | running, healthy, restarted two days ago |\n" for n in range(12)),
    "code": "".join(f"if status == {n}:\n    print('the value is not what we expected here')\n"
                    for n in range(12)),
    "sentences-ending-alike": " ".join(f"Step {word} is a language that is used to create apps."
                                       for word in ("one", "two", "three", "four", "five",
                                                    "six", "seven", "eight", "nine", "ten")),
}


@pytest.mark.parametrize("text", NOT_LOOPS.values(), ids=NOT_LOOPS.keys())
def test_lines_that_end_alike_without_looping_come_back_whole(text: str) -> None:
    assert extractor.without_loop(text) == text
    assert extractor.without_loop(text.rstrip()) == text.rstrip()
