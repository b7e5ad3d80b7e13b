"""Platforms: each one describes itself once, and everything else reads the registry.

A platform (console, terminal, telegram, events, ...) is one folder under
``interfaces/`` that exports a ``Platform``: its settings model (the
``AUTORESPONSE_<NAME>__...`` section), its actions, the interface name it
serves and that name's aliases, and a ``mount`` function that opens what it
needs and adds its actors to the tree. The configuration, the application
tree, log redaction and the action schema all read the registry, so adding a
platform is one folder and one registration line::

    >>> def mount(m: Mount) -> None:
    ...     m.pipeline(ChildSpec("sender.pager", PagerSender, (m.settings,)))
    >>> register_platform(Platform("pager", PagerSettings, mount, actions=(MessagePagerAction,),
    ...                            interface="pager"))                  # doctest: +SKIP

Secrets need no listing: every ``SecretStr`` in a platform's settings is
redacted from logs, status and errors. ``secrets`` names any others.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from autoresponse.messages import (
    BaseAction,
    OriginalContext,
    register_action,
    register_interface,
    unregister_action,
    unregister_interface,
)
from autoresponse.supervisors.spec import ChildSpec

if TYPE_CHECKING:
    from autoresponse.actors.kernel import Runtime
    from autoresponse.actors.journal import DeliveryJournal


class MountError(RuntimeError):
    """A platform could not open what it needs; the message says why, for the operator."""


class Mount:
    """What a platform's ``mount`` gets: its settings and the runtime's shared parts;
    what it gives back: its actors and the resources it opened (closed at stop, in
    reverse)."""

    def __init__(self, *, name: str, settings: BaseModel, runtime: Runtime,
                 journal: DeliveryJournal | None, data_dir: Path,
                 provided: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.settings: Any = settings
        self.runtime = runtime
        self.journal = journal
        self.data_dir = data_dir
        #: Objects the embedding program hands to platforms by name (the console's stream).
        self.provided: Mapping[str, Any] = provided or {}
        self.pipeline_specs: list[ChildSpec] = []
        self.inbound_specs: list[ChildSpec] = []
        self.resource: Any = None
        self.closers: list[Callable[[], None]] = []
        #: interface name → how the LLM hop downloads the files its requests name.
        self.downloaders: dict[str, Callable[[str, int], Awaitable[bytes]]] = {}
        #: action type → what its executor would refuse in an action ("" when nothing).
        self.preflights: dict[str, Callable[[BaseAction], str]] = {}
        #: input type → who an input of it came from (the chat to tell if it dies unread).
        self.origins: dict[type, Callable[[Any], OriginalContext | None]] = {}

    def pipeline(self, *specs: ChildSpec) -> None:
        """Add senders and executors: they start before the core pipeline and stop after it."""
        self.pipeline_specs.extend(specs)

    def inbound(self, *specs: ChildSpec) -> None:
        """Add inbound actors: they start last and stop first, before the drain."""
        self.inbound_specs.extend(specs)

    def expose(self, resource: Any) -> None:
        """Make ``resource`` the platform's handle (``Application.resource(name)``)."""
        self.resource = resource

    def downloader(self, interface: str, download: Callable[[str, int], Awaitable[bytes]]) -> None:
        """Let the LLM hop fetch what ``interface``'s requests carry by file id (a photo, a
        voice note, a document): ``await download(file_id, max_bytes)`` gives the bytes, and
        raises ``actors.llm.media.TooLarge`` past ``max_bytes``."""
        self.downloaders[interface] = download

    def preflight(self, action_type: str, refusal: Callable[[BaseAction], str]) -> None:
        """Let the dispatcher ask, before an action of ``action_type`` goes out, what its
        executor would refuse in it: ``refusal(action)`` says why, or "" when nothing.
        The LLM hears it in the turn that chose the action and answers again; the
        executor still checks for itself."""
        self.preflights[action_type] = refusal

    def origin(self, input_type: type, origin: Callable[[Any], OriginalContext | None]) -> None:
        """Say who sent an input of ``input_type`` (what the platform's inbound actor journals
        and handles): ``origin(input)`` gives the context its request would have been
        answered in, or None when nobody would have been (a stranger refused or ignored) or
        the input cannot be read; it never raises. When the actor crashes on the input every
        time, its sender is told ``actors.failures.FAILURE_NOTICE`` there, as for a request
        that died further on."""
        self.origins[input_type] = origin

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run ``closer()`` when the application stops, after every actor has stopped."""
        self.closers.append(closer)

    def on_loop_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Await ``closer()`` on the runtime's event loop, before the loop ends."""
        self.runtime.io.add_closer(closer)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run ``coro`` on the runtime's event loop and wait for its result."""
        return self.runtime.io.run(coro, timeout)


def _enabled(settings: BaseModel) -> bool:
    return bool(getattr(settings, "enabled", True))


def _no_secrets(settings: BaseModel) -> Iterable[str]:
    return ()


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Platform:
    """One platform's description of itself."""

    #: The settings section (``AUTORESPONSE_<NAME>__...``, ``[name]`` in TOML).
    name: str
    settings: type[BaseModel]
    mount: Callable[[Mount], None]
    #: The actions it carries out (a message action for its sender, commands).
    actions: tuple[type[BaseAction], ...] = ()
    #: Other names the LLM may use for its action types: alias → canonical type.
    action_aliases: Mapping[str, str] = field(default_factory=dict)
    #: The interface name its requests carry and its sender serves, if it talks to users.
    interface: str | None = None
    #: Other names for that interface (the seed's ``telegram_bot``).
    interface_aliases: tuple[str, ...] = ()
    #: Whether its section turns it on (default: the section's ``enabled``, else on).
    enabled: Callable[[Any], bool] = _enabled
    #: Secrets its settings hold outside ``SecretStr`` fields.
    secrets: Callable[[Any], Iterable[str]] = _no_secrets


_lock = threading.Lock()
_platforms: dict[str, Platform] = {}


def register_platform(platform: Platform) -> None:
    """Add ``platform`` to the registry (idempotent for the same description)."""
    with _lock:
        known = _platforms.get(platform.name)
        if known is platform:
            return
        if known is not None:
            raise ValueError(f"a platform named {platform.name!r} is already registered")
        if platform.interface is not None:
            register_interface(platform.interface, platform.interface_aliases)
        for model in platform.actions:
            aliases = [a for a, target in platform.action_aliases.items() if target == model.action_type()]
            register_action(model, aliases)
        _platforms[platform.name] = platform


def unregister_platform(name: str) -> None:
    with _lock:
        platform = _platforms.pop(name, None)
        if platform is None:
            return
        for model in platform.actions:
            unregister_action(model)
        if platform.interface is not None:
            unregister_interface(platform.interface)


def platforms() -> tuple[Platform, ...]:
    """Every registered platform, in registration order."""
    with _lock:
        return tuple(_platforms.values())


@contextlib.contextmanager
def registered(platform: Platform) -> Iterator[Platform]:
    """``platform`` is registered inside the block only (for tests and plugins' checks).

    A platform that already was registered (a built-in) stays registered after the block.
    """
    if platform in platforms():
        yield platform
        return
    register_platform(platform)
    try:
        yield platform
    finally:
        unregister_platform(platform.name)
