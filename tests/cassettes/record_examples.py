"""Records the example cassettes: real daemon sessions against the fake LLM and fake Telegram.

    .venv/bin/python tests/cassettes/record_examples.py console-commands

(console-commands, rejected-then-fixed or telegram-conversation); the cassette is
written beside this file. Your own: ``autoresponse record bug.jsonl``, then copy it here.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from conftest import Daemon, wait_for

from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import FakeTelegramServer

SETTINGS = {"AUTORESPONSE_TERMINAL__ENABLED": "true",
            "AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS": '["echo", "date", "uname"]',
            "AUTORESPONSE_EVENTS__ENABLED": "false", "AUTORESPONSE_CONSOLE__READ_STDIN": "false"}


def sends(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["kind"] == "send"]


def record(which: str) -> Path:
    out = HERE / f"{which}.jsonl"
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        env = {**SETTINGS, "AUTORESPONSE_LLM__BASE_URL": llm.base_url}
        if which == "telegram-conversation":
            env.update(AUTORESPONSE_TELEGRAM__TOKEN="123456:TEST-TOKEN",
                       AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
                       AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1")
        with Daemon(Path(tempfile.mkdtemp(prefix="cassette-")), command=("record", str(out)), **env) as daemon:
            if which == "console-commands":
                for n, text in enumerate(("run echo hello cassette", "run uname -s")):
                    daemon.cli("inject", "interface.console", json.dumps({"text": text}))
                    wait_for(lambda n=n: len(sends(out)) > n, 30)
            elif which == "rejected-then-fixed":
                # The LLM first names an action that does not exist: it is told so, and re-asked.
                llm.script(FakeResponse(content='{"actions": [{"type": "launch_rocket", "payload": {}}]}'),
                           FakeResponse(content='{"actions": [{"type": "terminal", "payload": '
                                                '{"command": "echo third time lucky"}}]}'))
                daemon.cli("inject", "interface.console", json.dumps({"text": "run echo third time lucky"}))
                wait_for(lambda: sends(out), 30)
            elif which == "telegram-conversation":
                telegram.push_text("run echo from telegram", chat_id=42, user_id=7)
                wait_for(lambda: len(sends(out)) >= 1, 30)
                telegram.push_text("hello?", chat_id=42, user_id=7)
                wait_for(lambda: len(sends(out)) >= 2, 30)
                telegram.push_text("run date", chat_id=99, user_id=1234)  # a stranger: refused
                wait_for(lambda: len(sends(out)) >= 3, 30)
            else:
                raise SystemExit(f"no example called {which!r}")
            time.sleep(1)
    return out


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(record(name))
