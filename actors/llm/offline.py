"""The embedded offline engine: no network, no key, same action protocol as a real LLM.

It reads the very messages a real LLM would get and answers with JSON actions,
so the whole loop (extraction, dispatch, delivery turns) runs for real::

    >>> import asyncio
    >>> import autoresponse.interfaces  # the built-in platforms register their actions
    >>> from autoresponse.messages import OriginalContext
    >>> from autoresponse.actors.prompts import build_chat_request, render_openai_messages
    >>> ctx = OriginalContext(chat_id=1, interface_name="console", original_command="run df -h")
    >>> prompt = build_chat_request("run df -h", ctx, allowed_actions=["terminal", "message_console"])
    >>> asyncio.run(OfflineEngine().complete(render_openai_messages(prompt)))
    '{"actions": [{"type": "terminal", "payload": {"command": "df -h"}}]}'
    >>> asyncio.run(OfflineEngine().answer(prompt)).text
    '{"actions": [{"type": "terminal", "payload": {"command": "df -h"}}]}'
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any

from autoresponse.actors.llm.engine import Completion
from autoresponse.messages import PromptRequest

_ALLOWED = re.compile(r"Allowed action types in this turn: ([a-z_, ]+)\.")
_RUN = re.compile(r"^(?:\w+\s*[,:]\s*)?(?:please\s+)?(?:run|exec|execute)\s+(.+?)\s*$", re.I | re.S)
_REMIND = re.compile(
    r"^(?:\w+\s*[,:]\s*)?remind me(?: in (\d+) (minutes?|hours?))?(?: at (\d{1,2}:\d{2}))?"
    r"(?: (daily|every day|weekly|every week|monthly|every month))?(?: to)? (.+?)\s*$", re.I | re.S)
_REPEATS = {"daily": "daily", "every day": "daily", "weekly": "weekly", "every week": "weekly",
            "monthly": "monthly", "every month": "monthly"}
_GREETING = re.compile(r"^\s*(hi|hello|hey|good (morning|evening|afternoon))\b", re.I)
_PERCENT = re.compile(r"(\d{1,3})%")
_LOAD = re.compile(r"load averages?:\s*([\d.,\s]+)$", re.I)


def _allowed(text: str) -> list[str]:
    match = _ALLOWED.search(text)
    return [t.strip() for t in match.group(1).split(",")] if match else []


def _message(allowed: list[str], text: str) -> dict[str, Any]:
    kind = next((t for t in allowed if t.startswith("message_")), "message_console")
    return {"type": kind, "payload": {"text": text}}


def _block(output: str) -> str:
    body = output.strip().replace("```", "'''") or "(no output)"
    return f"```\n{body}\n```"


def _comment(command: str, output: str) -> str:
    program = command.split()[0] if command.split() else ""
    if program == "df":
        rows = [line for line in output.splitlines()[1:] if _PERCENT.search(line)]
        if rows:
            fullest = max(rows, key=lambda line: int(_PERCENT.search(line).group(1)))  # type: ignore[union-attr]
            use = _PERCENT.search(fullest).group(1)  # type: ignore[union-attr]
            mount = fullest.split()[-1]
            return f"The fullest filesystem is {mount} at {use}% used."
    if program == "uptime":
        match = _LOAD.search(output.strip())
        if match:
            return f"Load averages (1, 5, 15 min): {match.group(1).strip()}."
    lines = len(output.strip().splitlines())
    return f"{lines} line{'s' if lines != 1 else ''} of output."


def _reminder(amount: str | None, unit: str | None, at: str | None, repeat: str | None,
              what: str) -> dict[str, Any]:
    now = dt.datetime.now().astimezone()
    if amount:
        when = now + dt.timedelta(**{"hours" if unit.startswith("hour") else "minutes": int(amount)})  # type: ignore[union-attr]
    elif at:
        hour, minute = map(int, at.split(":"))
        when = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if when <= now:
            when += dt.timedelta(days=1)
    else:
        when = now + dt.timedelta(minutes=1)
    return {"date": when.date().isoformat(), "time": when.strftime("%H:%M:%S"),
            "repeat": _REPEATS.get((repeat or "").lower(), "none"), "description": what}


class OfflineEngine:
    """A rule-based stand-in for an LLM: `run <command>` in chat, formatting in delivery."""

    name = "offline"

    def __repr__(self) -> str:
        return "OfflineEngine()"

    async def answer(self, prompt: PromptRequest, on_text: Callable[[str], None] | None = None) -> Completion:
        """The answer to ``prompt``, read from the prompt itself (no rendering needed)."""
        if prompt.system_message is not None:
            actions = self._deliver(prompt.system_message.model_dump(mode="json"), list(prompt.allowed_actions))
        else:
            actions = self._chat(prompt.current_text, list(prompt.allowed_actions))
        return Completion(text=json.dumps({"actions": actions}, ensure_ascii=False), engine=self.name)

    async def complete(self, messages: list[dict[str, Any]], allowed: list[str] | None = None) -> str:
        """The answer to rendered ``messages`` (the fake LLM server's way in); ``allowed``
        names the action types when the messages do not (a tools or json_schema turn)."""
        system = messages[0]["content"] if messages else ""
        last = messages[-1]["content"] if messages else ""
        if isinstance(last, list):  # a message with pictures (image_url parts): its text
            last = "\n".join(p.get("text", "") for p in last if isinstance(p, dict))
        last = last or ""
        data = None
        # A delivery or re-ask turn (in tools, a re-ask's system message ends its tool turn);
        # a chat turn is never parsed.
        start = 0 if last.startswith('{"system_message"') else last.find('\n\n{"system_message"') + 2
        if start >= 0 and last[start:].startswith('{"system_message"'):
            try:
                data = json.loads(last[start:])
            except ValueError:
                data = None
        if isinstance(data, dict) and isinstance(data.get("system_message"), dict):
            actions = self._deliver(data["system_message"], allowed)
        else:
            actions = self._chat(last, allowed or _allowed(system))
        return json.dumps({"actions": actions}, ensure_ascii=False)

    async def aclose(self) -> None:
        return None

    def _chat(self, text: str, allowed: list[str]) -> list[dict[str, Any]]:
        run = _RUN.match(text.strip())
        if run:
            if "terminal" in allowed:
                return [{"type": "terminal", "payload": {"command": run.group(1)}}]
            return [_message(allowed, "I can't run commands here: the terminal executor is off.")]
        remind = _REMIND.match(text.strip())
        if remind:
            if "event" not in allowed:
                return [_message(allowed, "I can't schedule reminders here: events are off.")]
            return [{"type": "event", "payload": _reminder(*remind.groups())}]
        if _GREETING.match(text):
            if "terminal" not in allowed:  # offer nothing it would then refuse
                return [_message(allowed, "Hello! I'm synth, on the built-in offline engine. The terminal "
                                          "executor is off here, so there is no command to run.")]
            return [_message(allowed, "Hello! I'm synth, on the built-in offline engine. "
                                      "Ask me to `run df -h`, `run uptime` or `run date`.")]
        return [_message(allowed, "I'm the offline engine, so I only understand `run <command>`. "
                                  "Point AUTORESPONSE_LLM__BASE_URL at a real LLM for more.")]

    def _deliver(self, message: dict[str, Any], allowed: list[str] | None = None) -> list[dict[str, Any]]:
        allowed = allowed or _allowed(message.get("full_json_instructions", ""))
        kind = message.get("type")
        if kind == "output":
            parts = []
            for out in message.get("outputs", []):
                command = out.get("command") or out.get("action_type", "action")
                output = out.get("output", "")
                if output.startswith("refused: "):
                    parts.append(f"I did not run `{command}`: {output.removeprefix('refused: ')}.")
                    continue
                if out.get("ok", True):
                    head = f"`{command}` finished. {_comment(command, output)}"
                else:
                    code = out.get("exit_code")
                    head = f"`{command}` failed" + (f" (exit {code})." if code is not None else ".")
                if out.get("truncated"):
                    head += " The output was long, so it was cut."
                parts.append(f"{head}\n{_block(output)}")
            return [_message(allowed, "\n\n".join(parts) or "Nothing to report.")]
        if kind == "event":
            event = message.get("event", {})
            late = event.get("late_seconds", 0)
            note = f" (I was {int(late // 60)} min late, sorry.)" if late >= 60 else ""
            return [_message(allowed, f"⏰ Reminder: {event.get('description', '')}{note}")]
        positions = message.get("positions", [])
        refused = [f"I did not run `{p.get('excerpt', '')}`: {p.get('error', '').removeprefix(p['type'] + ': ')}."
                   for p in positions if not p.get("done") and p.get("type") == "terminal"]
        if kind == "error" and refused:
            return [_message(allowed, "\n\n".join(refused))]
        if kind == "error" and any(p.get("done") for p in positions):
            return []  # the rest was carried out: nothing more to say
        return [_message(allowed, "Sorry, I could not do that.")]
