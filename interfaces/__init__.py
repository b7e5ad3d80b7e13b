"""Platforms: one folder each (its actions, settings, inbound actor, sender or
executor, fake server for tests), described by the ``PLATFORM`` its package exports.

Registering a platform is one line in ``BUILTIN_PLATFORMS``; configuration, the
application tree, log redaction and the action schema follow from it.
Nothing here leaks into the kernel.
"""

from __future__ import annotations

import importlib

from autoresponse.supervisors.platform import register_platform

#: The platforms that ship with autoresponse, in the order their actors start.
BUILTIN_PLATFORMS = (
    "console",
    "terminal",
    "events",
    "telegram",
    "reddit",
    "x",
    "telethon",
)


def load_builtin_platforms() -> None:
    """Register every built-in platform (idempotent)."""
    for name in BUILTIN_PLATFORMS:
        register_platform(importlib.import_module(f"{__name__}.{name}").PLATFORM)


load_builtin_platforms()
