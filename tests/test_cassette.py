"""Recorded conversations: a live session recorded as JSONL, replayed offline, compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Daemon, environment, wait_for

from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.cassette import Cassette, CassetteError, replay

CASSETTES = sorted((Path(__file__).parent / "cassettes").glob("*.jsonl"))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def replay_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autoresponse", "replay", str(path)], check=False,
                          capture_output=True, text=True, timeout=120, env=environment())


@pytest.mark.parametrize("cassette", CASSETTES, ids=[c.stem for c in CASSETTES])
def test_every_recorded_session_in_tests_cassettes_still_replays_the_same(cassette: Path) -> None:
    recorded = Cassette.load(cassette)
    result = replay(recorded)
    assert result.matches, "\n".join(result.diff) or f"unfinished: {result.unfinished}"
    assert result.got and len(result.got) == len(recorded.replayable_sends)


def test_there_are_cassettes_to_replay() -> None:
    assert {c.stem for c in CASSETTES} >= {"console-commands", "rejected-then-fixed", "telegram-conversation"}


def test_a_recorded_daemon_session_replays_offline_and_a_changed_reply_shows_the_difference(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    cassette = tmp_path / "session.jsonl"
    with Daemon(tmp_path, command=("record", str(cassette)), AUTORESPONSE_LLM__BASE_URL=fake_llm.base_url,
                AUTORESPONSE_TERMINAL__ENABLED="true", AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["echo", "date"]',
                AUTORESPONSE_CONSOLE__READ_STDIN="false") as daemon:
        for n, text in enumerate(("run echo recorded words", "run date")):
            assert daemon.cli("inject", "interface.console", json.dumps({"text": text})).returncode == 0
            wait_for(lambda n=n: len([x for x in lines(cassette) if x["kind"] == "send"]) > n, 30)
    recorded = lines(cassette)
    kinds = [line["kind"] for line in recorded]
    assert kinds[0] == "header" and kinds.count("inbound") == 2 and kinds.count("llm") == 4
    assert kinds.count("send") == 2

    done = replay_cli(cassette)  # offline: the fake LLM has stopped answering anything new
    requests_before = len(fake_llm.requests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 requests replayed; all 2 sends match" in done.stdout
    assert len(fake_llm.requests) == requests_before

    # A recorded reply changed: the replay sends something else, and says what.
    for line in recorded:
        if line["kind"] == "llm" and "recorded words" in line.get("reply", "") and "message_console" in line["reply"]:
            line["reply"] = line["reply"].replace("recorded words", "other words")
        for call in line.get("tool_calls", ()):  # the reply came as a native tool call
            if call["name"] == "message_console" and "recorded words" in call["arguments"]:
                call["arguments"] = call["arguments"].replace("recorded words", "other words")
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(line) + "\n" for line in recorded))
    done = replay_cli(changed)
    assert done.returncode == 1
    assert "the sends differ from the recording" in done.stdout
    minus = [row for row in done.stdout.splitlines() if row.startswith("-  ")]
    plus = [row for row in done.stdout.splitlines() if row.startswith("+  ")]
    assert len(minus) == len(plus) == 1
    assert "recorded words" in minus[0] and "other words" in plus[0]


def test_a_file_that_is_not_a_cassette_is_one_clear_line(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b'{"kind": "header", "version": 1}\n\xff\xfe not json\n')
    done = replay_cli(garbage)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("autoresponse: cannot read the cassette:")
    no_header = tmp_path / "no-header.jsonl"
    no_header.write_text('{"kind": "send", "to": "sender.console", "chat_id": "c", "text": "hi"}\n')
    with pytest.raises(CassetteError, match="one header line"):
        Cassette.load(no_header)
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text('{"kind": "header", "version": 1}\n'
                       '{"kind": "inbound", "to": "llm", "correlation": "c", "type": "NoSuchMessage", "body": {}}\n')
    done = replay_cli(unknown)
    assert done.returncode == 2 and "unknown message type 'NoSuchMessage'" in done.stderr


@pytest.mark.parametrize("line", [
    '{"kind": "send", "to": "sender.console", "text": "no chat"}',
    '{"kind": "llm", "correlation": "c", "messages": []}',
    '{"kind": "inbound", "to": "llm", "type": "UserRequest", "body": {}}',
    '["a", "list"]',
])
def test_a_cassette_line_without_what_it_needs_is_named(tmp_path: Path, line: str) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"kind": "header", "version": 1}\n' + line + "\n")
    with pytest.raises(CassetteError, match=r"broken.jsonl:2"):
        Cassette.load(path)


@pytest.mark.parametrize("line", ["[" * 100_000, "[" * 10_000 + "]" * 10_000], ids=["unclosed", "closed"])
def test_a_line_nested_past_the_parser_is_one_clear_line(tmp_path: Path, line: str) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"kind": "header", "version": 1}\n' + line + "\n")
    done = replay_cli(deep)  # once a RecursionError's traceback
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"autoresponse: cannot read the cassette: {deep}:2: not a cassette line "
                                        "(it nests lists or objects too deeply to be read as JSON)"]
