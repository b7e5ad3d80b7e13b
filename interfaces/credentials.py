"""What the platforms' settings share about credentials: whether one is given, and the
error for a platform set up in part (some of what says it is meant to run, not all it
needs to log in), which would otherwise stay off while the daemon looks healthy::

    >>> given(SecretStr("")), given(SecretStr("   ")), given([]), given("synth_bot")
    (False, False, False, True)
    >>> setting("reddit", "password")
    'AUTORESPONSE_REDDIT__PASSWORD ([reddit] password)'
    >>> listed(["a", "b", "c"])
    'a, b and c'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


def stripped(value: object) -> object:
    """A token or key as pasted (``$(cat token.txt)``, a line from a file): the spaces and
    line ends around it are no part of it, and would be sent with it (for a field
    validator, ``mode="before"``)."""
    return value.strip() if isinstance(value, str) else value


def given(value: object) -> bool:
    """Whether a setting holds something: an empty or blank string or secret, or an empty
    list, does not (``export ...=$UNSET`` sets nothing, and no token or name is only spaces)."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, str):
        value = value.strip()
    return value is not None and value != "" and value != []


def setting(platform: str, name: str) -> str:
    """How the operator sets ``name`` of ``platform``: its variable, and its key in the file."""
    return f"AUTORESPONSE_{platform.upper()}__{name.upper()} ([{platform}] {name})"


def listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(items[:-1]), items[-1])))


def refuse_in_part(settings: BaseModel, meant_by: Iterable[str], message: str, **context: Any) -> None:
    """For settings that are not enough to run: a ValidationError when one of ``meant_by``
    is given (the operator meant the platform to run), located at the first of them, as
    the settings check names a bad value, saying ``message`` (a template of ``context``);
    nothing when none is (a platform nobody set up stays off)."""
    meant = next((name for name in meant_by if given(getattr(settings, name))), None)
    if meant is None:
        return
    missing = PydanticCustomError("credentials_missing", message, context)
    raise ValidationError.from_exception_data(type(settings).__name__, [
        InitErrorDetails(type=missing, loc=(meant,), input=getattr(settings, meant))])
