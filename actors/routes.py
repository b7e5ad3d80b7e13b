"""Actor names, and which actions a turn may use given the actors that run.

Senders address actors by these names; a restart changes what a name points
to, never the name. Platform code registers under ``interface.<name>`` and
``sender.<name>``; executors under ``executor.<action type>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from autoresponse.messages import (
    BaseAction,
    action_model,
    action_models,
    message_action_for,
    registry_generation,
)

if TYPE_CHECKING:
    from autoresponse.actors.kernel.runtime import Runtime

LLM = "llm"
DISPATCHER = "dispatcher"
BUILDER = "builder"
#: The pool of conversation actors; inbound interfaces send user requests here.
CONVERSATIONS = "conversations"


SENDER_PREFIX = "sender."


def interface(name: str) -> str:
    return f"interface.{name}"


def sender(interface_name: str) -> str:
    return f"{SENDER_PREFIX}{interface_name}"


def executor(action_type: str) -> str:
    return f"executor.{action_type}"


def route_of(action: type[BaseAction] | BaseAction) -> str:
    """The actor that carries out ``action``: its interface's sender or its executor."""
    if action.kind == "message":
        assert action.interface is not None
        return sender(action.interface)
    return executor(action.action_type())


def delivery_actions(runtime: Runtime, interface_name: str) -> tuple[str, ...]:
    """A delivery turn may only answer the original chat's interface (fail-closed)."""
    model = message_action_for(interface_name)
    if model is None or not runtime.has(route_of(model)):
        return ()
    return (model.action_type(),)


def autonomous_actions(runtime: Runtime, interface_name: str, commands: Iterable[str]) -> tuple[str, ...]:
    """A turn the bot starts on its own (a reminder, a public mention) may reply, and use
    the command actions configured for such turns whose executors run (none by default)."""
    running = tuple(c for c in commands if (m := action_model(c)) is not None and runtime.has(route_of(m)))
    return delivery_actions(runtime, interface_name) + running


def chat_actions(runtime: Runtime, interface_name: str) -> tuple[str, ...]:
    """A chat turn may use every command whose executor runs, plus the reply action.

    Asked on every turn, answered from a cache that a new action type or a new actor
    invalidates (actors are added, never removed, while a runtime runs).
    """
    key = (id(runtime), interface_name, registry_generation(), runtime.actor_count)
    found = _chat_actions.get(key)
    if found is None:
        commands = tuple(
            m.action_type() for m in action_models() if m.kind == "command" and runtime.has(route_of(m))
        )
        found = delivery_actions(runtime, interface_name) + commands
        if len(_chat_actions) > 64:
            _chat_actions.clear()
        _chat_actions[key] = found
    return found


_chat_actions: dict[tuple[int, str, int, int], tuple[str, ...]] = {}
