"""The application: the actor tree the daemon and the demo run.

>>> with Application(Settings.load()) as app:          # doctest: +SKIP
...     app.runtime.send("interface.console", ConsoleInput(text="run date"))

It owns what it starts: the runtime (actors and event loop thread) and the LLM
engine; ``stop`` drains in-flight work, then stops all of it.
"""

from __future__ import annotations

import logging

from autoresponse.actors import Runtime
from autoresponse.actors.builder import AutoResponseBuilder
from autoresponse.actors.dispatcher import ActionDispatcher
from autoresponse.actors.llm import HttpEngine, LLMClient, LLMEngine, OfflineEngine
from autoresponse.actors.routes import BUILDER, DISPATCHER, LLM, executor, interface, sender
from autoresponse.interfaces.console import Console, ConsoleInterface, ConsoleSender
from autoresponse.interfaces.terminal import TerminalExecutor
from autoresponse.supervisors.config import LLMSettings, Settings

log = logging.getLogger("autoresponse.app")


def make_engine(settings: LLMSettings) -> LLMEngine:
    """An HTTP engine for a configured base URL, else the offline engine."""
    if not settings.base_url:
        return OfflineEngine()
    return HttpEngine(
        settings.base_url,
        model=settings.model,
        api_key=settings.api_key,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_attempts=settings.max_attempts,
        max_in_flight=settings.max_in_flight,
        temperature=settings.temperature,
    )


class Application:
    """Pipeline actors plus the configured interfaces, in one runtime."""

    def __init__(self, settings: Settings, *, console: Console | None = None,
                 engine: LLMEngine | None = None, read_stdin: bool | None = None) -> None:
        self.settings = settings
        self.console = console or Console()
        self.engine = engine or make_engine(settings.llm)
        self.read_stdin = settings.console.read_stdin if read_stdin is None else read_stdin
        self.runtime = Runtime(
            max_hops=settings.runtime.max_hops,
            mailbox_capacity=settings.runtime.mailbox_capacity,
        )
        self.inbound: list[str] = []

    def start(self) -> Application:
        rt = self.runtime.start()
        rt.io.add_closer(self.engine.aclose)
        # Downstream first, so nothing is sent to a name before it exists.
        if self.settings.console.enabled:
            rt.spawn(sender("console"), ConsoleSender, self.console)
        if self.settings.terminal.enabled:
            rt.spawn(executor("terminal"), TerminalExecutor, self.settings.terminal)
        rt.spawn(DISPATCHER, ActionDispatcher)
        rt.spawn(LLM, LLMClient, self.engine)
        rt.spawn(BUILDER, AutoResponseBuilder)
        if self.settings.console.enabled:
            rt.spawn(interface("console"), ConsoleInterface, self.console, read_stdin=self.read_stdin)
            self.inbound.append(interface("console"))
        log.info("started: llm=%r, terminal=%s, actors=%s", self.engine,
                 "on" if self.settings.terminal.enabled else "off",
                 ", ".join(c.name for c in rt.cells))
        return self

    def stop(self) -> bool:
        """Stop inbound interfaces, drain in-flight work, stop everything. True if drained."""
        drained = self.runtime.stop(self.settings.runtime.drain_seconds, first=tuple(self.inbound))
        if not drained:
            log.warning("stopped before all in-flight work finished; the rest is dead-lettered")
        return drained

    def __enter__(self) -> Application:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
