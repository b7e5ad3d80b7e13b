"""How the userbot formats a reply: Markdown for bold, code and links, and nothing that
takes apart the words of a reply about code.

Telethon's own Markdown also reads ``__`` as italic and ``~~`` as strike-through, so a
reply naming ``__init__.py`` or ``__pycache__`` arrived as "*init*.py". ``REPLY_MARKDOWN``
(the ``"md"`` parse mode of the userbot's settings) reads only ``**bold**``, `` `code` ``,
fenced blocks and ``[links](url)``, which is what a model's answer uses; Telethon's whole
Markdown stays one setting away (``parse_mode = "markdown"``)::

    >>> REPLY_MARKDOWN.parse("Removed **all** of `__pycache__` and __init__.py")[0]
    'Removed all of __pycache__ and __init__.py'
"""

from __future__ import annotations

from typing import Any

from telethon.extensions import markdown
from telethon.tl import types

#: What a reply's Markdown may format: Telethon's delimiters without ``__`` and ``~~``.
_DELIMITERS = {"**": types.MessageEntityBold, "`": types.MessageEntityCode, "```": types.MessageEntityPre}


class ReplyMarkdown:
    """A Telethon parse mode (an object with ``parse`` and ``unparse``)."""

    @staticmethod
    def parse(text: str) -> tuple[str, list[Any]]:
        return markdown.parse(text, delimiters=_DELIMITERS)  # type: ignore[no-any-return]

    @staticmethod
    def unparse(text: str, entities: list[Any]) -> str:
        return markdown.unparse(text, entities, delimiters=_DELIMITERS)  # type: ignore[no-any-return]


REPLY_MARKDOWN = ReplyMarkdown()


def parse_mode_of(setting: str | None) -> Any:
    """What Telethon is handed for the setting: ours for ``"md"``, Telethon's own otherwise
    (``"markdown"``, ``"html"``; None is plain text)."""
    return REPLY_MARKDOWN if setting == "md" else setting
