"""Where a request came from; it travels unchanged to the final send.

Interface names are an open set: each platform registers its name and any
aliases (the seed's ``telegram_bot`` for ``telegram``), and a context always
holds the canonical name::

    >>> register_interface("console")
    >>> OriginalContext(chat_id=42, message_id=7, interface_name="console").chat_id
    42
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

ChatId = int | str

_lock = threading.Lock()
#: alias or canonical name → canonical name, for every registered interface.
_INTERFACES: dict[str, str] = {}


def register_interface(name: str, aliases: Iterable[str] = ()) -> None:
    """Make ``name`` (and its ``aliases``) a known interface name. Idempotent."""
    with _lock:
        for alias in (name, *aliases):
            known = _INTERFACES.get(alias)
            if known is not None and known != name:
                raise ValueError(f"interface name {alias!r} already belongs to {known!r}")
        for alias in (name, *aliases):
            _INTERFACES[alias] = name


def unregister_interface(name: str) -> None:
    with _lock:
        for alias in [a for a, n in _INTERFACES.items() if n == name]:
            del _INTERFACES[alias]


def canonical_interface(name: str) -> str:
    """The registered name ``name`` stands for (itself when it is not an alias)."""
    return _INTERFACES.get(name, name)


class OriginalContext(BaseModel):
    """The coordinates of the user's original message.

    Keys beyond the fields below (the seed's ``action_specific_data``, say) are
    kept and travel with the context into the delivery prompt.

    >>> ctx = OriginalContext(chat_id=42, message_id=7, interface_name="console",
    ...                       original_command="run df -h", action_specific_data={"k": 1})
    >>> ctx.chat_id, ctx.message_id, ctx.model_extra
    (42, 7, {'action_specific_data': {'k': 1}})
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    chat_id: ChatId
    message_id: ChatId | None = None
    interface_name: str
    original_command: str = ""
    thread_id: ChatId | None = None
    user_id: ChatId | None = None
    user_name: str | None = None
    chat_type: str | None = None
    #: A title or name of the chat, when the platform gives one (to find it by name).
    chat_title: str | None = None
    #: The bot was not asked directly (a mention on a public platform): it may stay silent,
    #: and may only use the actions configured for autonomous turns.
    autonomous: bool = False
    #: An actor to tell (with ``receipt_key``) once the final reply is confirmed sent,
    #: or has failed for good; e.g. the event scheduler, which marks a reminder
    #: delivered only then.
    receipt_to: str | None = None
    receipt_key: str | None = None

    @field_validator("interface_name")
    @classmethod
    def _canonical(cls, value: str) -> str:
        return canonical_interface(value)

    @property
    def is_group(self) -> bool:
        return self.chat_type in ("group", "supergroup")

    @property
    def chat_key(self) -> str:
        """Names the conversation: the interface, the chat and the thread (a forum topic)."""
        return f"{self.interface_name}:{self.chat_id}:{'' if self.thread_id is None else self.thread_id}"

    @property
    def extras(self) -> dict[str, Any]:
        """The keys a caller added beyond the known fields."""
        return dict(self.model_extra or {})
