"""The actions an LLM may answer with: their base models and the registry of their types.

Action types are an open set: each platform defines its actions (a message
action for its sender, commands for its executors) and registers them. The
union the extractor validates against, and the JSON schema the LLM is shown,
are both derived from the registered models and nothing else::

    >>> class Shout(CommandAction):
    ...     type: Literal["shout"]
    ...     payload: MessagePayload
    >>> register_action(Shout, aliases=("yell",))
    >>> parse_action({"type": "yell", "payload": {"text": "hi"}}).type
    'shout'
    >>> unregister_action(Shout)
"""

from __future__ import annotations

import functools
import hashlib
import threading
import unicodedata
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator
from pydantic_core import PydanticCustomError

from autoresponse.messages.context import ChatId

#: Longest text a message action may carry. Senders split it further to fit
#: their platform; anything longer is an invalid payload the LLM is asked to fix.
MAX_MESSAGE_CHARS = 32_000

#: Characters that show nothing: controls and formats (zero-width space and joiners, the
#: BOM, soft hyphen, bidi marks, tags), spaces and separators of every kind ...
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})
#: ... and the letters and marks that are drawn as nothing: the Hangul fillers, the blank
#: braille pattern, the combining grapheme joiner, Khmer's inherent vowels, Mongolian's
#: free variation selectors, and the variation selectors.
_INVISIBLE = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\uffa0"
                       + "".join(map(chr, range(0xFE00, 0xFE10)))
                       + "".join(map(chr, range(0xE0100, 0xE01F0))))


def _visible(char: str) -> bool:
    return not (char in _INVISIBLE or char.isspace()
                or unicodedata.category(char) in _INVISIBLE_CATEGORIES)


def is_blank(text: str) -> bool:
    """Whether ``text`` would show nothing: it holds only spaces (of any kind, line breaks
    too) and characters drawn as nothing (zero-width ones, the BOM, Hangul fillers, ...).

    >>> is_blank(" \\n\\u00a0\\u200b\\u3000"), is_blank(" ok ")
    (True, False)
    """
    first = text[:1]
    if first.isalnum() and first not in _INVISIBLE:  # nearly every message: decided at once
        return False
    return not any(map(_visible, text))


class BaseAction(BaseModel):
    """Common ground of every action: a ``type`` tag and a ``payload``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: "message" actions only talk to users; "command" actions make things happen.
    kind: ClassVar[Literal["message", "command"]] = "command"
    #: For message actions: the interface whose sender delivers them.
    interface: ClassVar[str | None] = None

    type: str
    payload: Any

    @classmethod
    def action_type(cls) -> str:
        """The canonical type name (the first of the ``type`` literal's values)."""
        return _action_type(cls)

    def check(self, context: Any) -> str:
        """Override: what is wrong with this action in the chat of ``context`` (an
        ``OriginalContext``), as an error for the LLM; "" when nothing is."""
        return ""

    def fitted(self, context: Any) -> BaseAction:
        """Override: this action as it applies in the chat of ``context``, without a field
        that cannot mean anything there (a small model fills in every field it sees)."""
        return self


class CommandAction(BaseAction):
    """An action an executor carries out; its output comes back through the LLM."""


class MessagePayload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS,
                      description="The message itself: visible text, never only spaces or "
                                  "invisible characters.")
    target: ChatId | None = Field(
        default=None,
        description="Chat to send to (its id, or its title or @username); omit to answer "
                    "the original chat.",
    )

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        # A blank message would post nothing: the LLM is asked again, told why.
        if is_blank(text):
            raise PydanticCustomError(
                "blank_text", "the text is blank (only spaces or invisible characters); "
                              "write the message itself")
        return text


class MessageAction(BaseAction):
    """A reply to a user, delivered by the sender of ``interface``."""

    kind: ClassVar[Literal["message", "command"]] = "message"
    payload: MessagePayload


# ---------------------------------------------------------------- the registry


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.models: dict[str, type[BaseAction]] = {}
        self.aliases: dict[str, str] = {}
        self.generation = 0
        self._adapter: tuple[int, TypeAdapter[BaseAction] | None] = (-1, None)

    def adapter(self) -> TypeAdapter[BaseAction]:
        generation, adapter = self._adapter
        if generation != self.generation or adapter is None:
            with self.lock:
                models = tuple(self.models.values())
                if not models:
                    raise LookupError("no action types are registered")
                union: Any = models[0] if len(models) == 1 else Annotated[
                    Union[models], Field(discriminator="type")]  # noqa: UP007
                adapter = TypeAdapter(union)
                self._adapter = (self.generation, adapter)
        return adapter


_registry = _Registry()


@functools.cache
def _action_type(model: type[BaseAction]) -> str:
    # Asked on every turn and every action routed; pydantic's ``model_fields`` is Python code.
    return model.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]


def register_action(model: type[BaseAction], aliases: Iterable[str] = ()) -> None:
    """Make ``model`` an action the LLM may use; ``aliases`` are other names it accepts
    for the same type (the seed's ``bash`` for ``terminal``). Idempotent."""
    name = model.action_type()
    if model.kind == "message" and model.interface is None:
        raise TypeError(f"message action {name!r} must name its interface")
    with _registry.lock:
        known = _registry.models.get(name)
        if known is model:
            return
        if known is not None:
            raise ValueError(f"action type {name!r} is already registered by {known.__qualname__}")
        _registry.models[name] = model
        for alias in aliases:
            _registry.aliases[alias] = name
        _registry.generation += 1


def unregister_action(model: type[BaseAction]) -> None:
    name = model.action_type()
    with _registry.lock:
        if _registry.models.get(name) is model:
            del _registry.models[name]
            for alias in [a for a, n in _registry.aliases.items() if n == name]:
                del _registry.aliases[alias]
            _registry.generation += 1


def registry_generation() -> int:
    """Changes whenever an action type is registered or removed (for caches of the set)."""
    return _registry.generation


def action_models() -> tuple[type[BaseAction], ...]:
    """Every registered action model, in registration order."""
    with _registry.lock:
        return tuple(_registry.models.values())


# The two readers below run for every action of every reply and take no lock: a single read
# of a dict is atomic, and the writers above never leave a name half registered.


def action_model(name: str) -> type[BaseAction] | None:
    """The model of type ``name`` or of one of its aliases."""
    return _registry.models.get(_registry.aliases.get(name, name))


def canonical_action_type(name: str) -> str:
    return _registry.aliases.get(name, name)


def message_action_for(interface_name: str) -> type[BaseAction] | None:
    """The message action whose sender serves ``interface_name``."""
    return next((m for m in action_models()
                 if m.kind == "message" and m.interface == interface_name), None)


def parse_action(raw: Any) -> BaseAction:
    """Validate one action object. Raises ``pydantic.ValidationError``."""
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        canonical = canonical_action_type(raw["type"])
        if canonical != raw["type"]:
            raw = {**raw, "type": canonical}
    return _registry.adapter().validate_python(raw)


def action_key(action: BaseAction) -> str:
    """A stable key of what an action does, to recognise it when an LLM repeats it: a
    hash of its type and its payload's fields (the same model builds them in the same
    order), with no serialisation on the way."""
    canonical = f"{action.type}\0{action.payload.__dict__!r}"
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()

