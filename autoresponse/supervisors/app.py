"""The application: the supervision tree the daemon and the demo run.

>>> with Application(Settings.load()) as app:                        # doctest: +SKIP
...     app.runtime.send("interface.console", ConsoleInput(text="run date"))

::

    root (one_for_one)
    ├── pipeline (one_for_one): sender.*, executor.*, dispatcher, llm, builder
    ├── retry (simple_one_for_one pool): retry.0 … retry.N-1
    └── interfaces (one_for_one): interface.*, events (the reminder scheduler)

It owns what it starts: the runtime (actors, event loop thread), the LLM
engine and the admin endpoint; ``stop`` stops the interfaces, drains in-flight
work, then stops all of it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from autoresponse.actors import Cell, Runtime
from autoresponse.actors.builder import AutoResponseBuilder
from autoresponse.actors.dispatcher import ActionDispatcher
from autoresponse.actors.llm import HttpEngine, LLMClient, LLMEngine, OfflineEngine
from autoresponse.actors.retry import RetryActor
from autoresponse.actors.routes import BUILDER, DISPATCHER, LLM, executor, interface, sender
from autoresponse.interfaces.console import Console, ConsoleInterface, ConsoleSender
from autoresponse.interfaces.events import EventExecutor, EventScheduler, EventStore
from autoresponse.interfaces.telegram import TelegramDelivery, TelegramInterface, TelegramSender
from autoresponse.interfaces.terminal import TerminalExecutor
from autoresponse.journal import SqliteJournal
from autoresponse.messages import Envelope
from autoresponse.supervisors.admin import AdminServer
from autoresponse.supervisors.config import LLMSettings, Settings
from autoresponse.supervisors.spec import ChildSpec, Spec, Strategy, SupervisorSpec
from autoresponse.supervisors.supervisor import Supervisor

log = logging.getLogger("autoresponse.app")

ROOT = "root"
PIPELINE = "pipeline"
RETRY = "retry"
INTERFACES = "interfaces"
EVENTS = "events"


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


def names_in(spec: Spec) -> list[str]:
    """Every actor name a spec starts (pool children included)."""
    if not isinstance(spec, SupervisorSpec):
        return [spec.id]
    if spec.strategy is Strategy.SIMPLE_ONE_FOR_ONE:
        return [spec.id, *(f"{spec.children[0].id}.{n}" for n in range(spec.pool_size))]
    return [spec.id, *(name for child in spec.children for name in names_in(child))]


class StartError(RuntimeError):
    """The application could not start; the message says why, for the operator."""


class Application:
    """Pipeline actors, retry pool and interfaces, supervised in one runtime."""

    def __init__(self, settings: Settings, *, console: Console | None = None,
                 engine: LLMEngine | None = None, read_stdin: bool | None = None) -> None:
        self.settings = settings
        self.console = console or Console()
        self.engine = engine or make_engine(settings.llm)
        self.read_stdin = settings.console.read_stdin if read_stdin is None else read_stdin
        self.runtime = Runtime(
            max_hops=settings.runtime.max_hops,
            mailbox_capacity=settings.runtime.mailbox_capacity,
            message_attempts=settings.supervision.message_attempts,
        )
        self.admin: AdminServer | None = None
        self.events: EventStore | None = None
        self.journal: SqliteJournal | None = None
        self.telegram: TelegramDelivery | None = None
        #: Set when the root supervisor gave up; ``failure`` says why.
        self.failed = threading.Event()
        self.failure: str | None = None

    def tree(self) -> SupervisorSpec:
        s = self.settings

        def supervisor(name: str, strategy: Strategy, children: list[Spec], **kw: Any) -> SupervisorSpec:
            return SupervisorSpec(name, strategy, tuple(children), intensity=s.supervision.intensity(),
                                  backoff=s.supervision.backoff(), **kw)

        pipeline: list[Spec] = []
        inbound: list[Spec] = []
        if s.console.enabled:
            pipeline.append(ChildSpec(sender("console"), ConsoleSender, (self.console, self.journal)))
            inbound.append(ChildSpec(interface("console"), ConsoleInterface, (self.console,),
                                     {"read_stdin": self.read_stdin}))
        if self.telegram is not None:
            pipeline.append(ChildSpec(sender("telegram"), TelegramSender, (self.telegram,)))
            inbound.append(ChildSpec(interface("telegram"), TelegramInterface, (s.telegram,)))
        if s.terminal.enabled:
            pipeline.append(ChildSpec(executor("terminal"), TerminalExecutor, (s.terminal,)))
        if self.events is not None:
            pipeline.append(ChildSpec(executor("event"), EventExecutor, (self.events,)))
            inbound.append(ChildSpec(EVENTS, EventScheduler, (self.events, s.events)))
        pipeline += [
            ChildSpec(DISPATCHER, ActionDispatcher),
            ChildSpec(LLM, LLMClient, (self.engine,)),
            ChildSpec(BUILDER, AutoResponseBuilder),
        ]
        retry = supervisor(RETRY, Strategy.SIMPLE_ONE_FOR_ONE, [ChildSpec(RETRY, RetryActor, (s.retry,))],
                           pool_size=s.retry.pool_size)
        return supervisor(ROOT, Strategy.ONE_FOR_ONE, [
            supervisor(PIPELINE, Strategy.ONE_FOR_ONE, pipeline),
            retry,
            supervisor(INTERFACES, Strategy.ONE_FOR_ONE, inbound),
        ])

    def start(self) -> Application:
        """Start the tree and the admin endpoint; if any of it fails, stop what started."""
        rt = self.runtime.start()
        try:
            rt.io.add_closer(self.engine.aclose)
            self._open_resources()
            rt.crash_policy = self._root_failed
            rt.error_route = RETRY
            tree = self.tree()
            rt.spawn(ROOT, Supervisor, tree)
            self._check_up(names_in(tree))
            resumed = rt.resume()
            if resumed:
                log.info("resumed %d unfinished work items from the journal", resumed)
            if self.settings.admin.enabled:
                self.admin = AdminServer(rt, self.settings.admin)
                try:
                    log.info("admin endpoint at %s", self.admin.start())
                except OSError as exc:
                    raise StartError(f"the admin endpoint cannot listen on "
                                     f"{self.settings.admin.host}:{self.settings.admin.port}: "
                                     f"{exc.strerror or exc}") from None
        except BaseException:
            self._stop_runtime(0)
            raise
        log.info("started: llm=%r, terminal=%s, %d actors", self.engine,
                 "on" if self.settings.terminal.enabled else "off", len(rt.cells))
        return self

    def _open_resources(self) -> None:
        """What the actors share and outlives their restarts: the event store, the bot."""
        s = self.settings
        if s.journal.enabled:
            self.journal = SqliteJournal(s.journal.path or s.data_dir.expanduser() / "journal.sqlite3")
            self.runtime.journal = self.journal
            forgotten = self.journal.compact(time.time() - s.journal.retention_seconds)
            log.debug("journal: compacted %d finished items", forgotten)
        if s.events.enabled:
            self.events = EventStore(s.data_dir.expanduser() / "events.sqlite3")
        if s.telegram.enabled:
            from telegram import Bot

            assert s.telegram.token is not None
            bot = Bot(s.telegram.token.get_secret_value(), base_url=s.telegram.base_url)
            self.telegram = TelegramDelivery(bot, parse_mode=s.telegram.parse_mode, journal=self.journal)
            try:
                self.runtime.io.run(self.telegram.start(), timeout=60)
            except Exception as exc:  # InvalidToken, NetworkError: say so, without the token
                raise StartError(f"cannot reach the Telegram Bot API: {type(exc).__name__}: {exc}") from None
            self.runtime.io.add_closer(self.telegram.aclose)

    def _stop_runtime(self, drain: float) -> bool:
        drained = self.runtime.stop(drain, first=(INTERFACES,))
        if self.events is not None:
            self.events.close()
        if self.journal is not None:
            self.journal.close()
        return drained

    def _check_up(self, names: list[str]) -> None:
        """Supervisors start children one by one, each after the last one's setup, so when
        the root's spawn returns the whole tree is up, unless some part failed."""
        down = [n for n in names if not (self.runtime.has(n) and self.runtime.cell(n).alive)]
        if down or self.failed.is_set():
            why = self.failure or "; ".join(
                f"{n}: {f.type}: {f.message}" if (f := self.runtime.cell(n).last_failure) else f"{n}: not running"
                for n in down if self.runtime.has(n)) or f"not started: {', '.join(down)}"
            raise StartError(f"the supervision tree did not start: {why}")

    def _root_failed(self, cell: Cell, envelope: Envelope | None, error: BaseException) -> None:
        """The root gave up (its restart intensity was exceeded): the daemon must stop."""
        if envelope is not None:
            self.runtime.inflight.done(envelope.correlation_id)
        self.failure = f"{type(error).__name__}: {error}"
        log.error("the root supervisor gave up, stopping: %s", self.failure)
        self.failed.set()

    def stop(self) -> bool:
        """Stop inbound interfaces, drain in-flight work, stop everything. True if drained."""
        drained = self._stop_runtime(self.settings.runtime.drain_seconds)
        if not drained:
            log.warning("stopped before all in-flight work finished; the rest is dead-lettered")
        return drained

    def __enter__(self) -> Application:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
