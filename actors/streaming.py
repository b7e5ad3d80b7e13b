"""Streamed replies: the text of a message while the LLM is still writing it.

An LLM answers with JSON actions, so a streamed reply is a growing JSON text.
While it reads as one message action to the original chat, its ``text`` so far
is shown to the user (a preview: an early message, then edits); nothing is
*done* before the whole reply is parsed: the final message, and every other
action, still go through the dispatcher::

    >>> preview_text('{"actions": [{"type": "message_console", "payload": {"text": "Disk us')
    ('message_console', 'Disk us')
    >>> preview_text('{"actions": [{"type": "terminal"') is None
    True
"""

from __future__ import annotations

import json
import re

from autoresponse.messages import OriginalContext, OutboundMessage

_START = re.compile(
    r'\A\s*(?:```(?:json)?\s*)?\{\s*"actions"\s*:\s*\[\s*\{\s*"type"\s*:\s*"(message_\w+)"\s*,'
    r'\s*"payload"\s*:\s*\{\s*"text"\s*:\s*"')
_END_OF_STRING = re.compile(r'(?<!\\)(?:\\\\)*"')
_LOOSE_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{0,3})?\Z')


def preview_text(partial: str) -> tuple[str, str] | None:
    """(the message action's type, its text so far) while ``partial`` is the start of a
    reply whose first action is a message; None otherwise."""
    start = _START.match(partial)
    if start is None:
        return None
    rest = partial[start.end():]
    end = _END_OF_STRING.search(rest)
    if end is not None:
        rest = rest[:end.end() - 1]  # the string is complete: up to its closing quote
    rest = _LOOSE_ESCAPE.sub("", rest)  # an escape cut in half waits for its end
    try:
        return start.group(1), json.loads(f'"{rest}"')
    except ValueError:
        return None


def withdrawal(context: OriginalContext, key: str) -> OutboundMessage:
    """Takes back the preview of ``key``: its reply was rejected, or never finished."""
    return OutboundMessage.reply(context, "", key=key, preview=True)
