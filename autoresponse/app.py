"""The application: the supervision tree the daemon and the demo run.

>>> with Application(Settings.load()) as app:                        # doctest: +SKIP
...     app.runtime.send("interface.console", ConsoleInput(text="run date"))

::

    root (one_for_one)
    ├── pipeline (one_for_one): each platform's senders and executors, then
    │                           dispatcher, llm, builder
    ├── retry (simple_one_for_one pool): retry.0 … retry.N-1
    ├── conversations (simple_one_for_one pool, by chat): conversations.0 … .3
    └── interfaces (one_for_one): each platform's inbound actors (they take nothing
                                   until the journal's unfinished work is resumed)

The tree is assembled from the platform registry: each enabled platform is
mounted (it opens what it needs and names its actors). The application owns
what it starts: the runtime (actors, event loop thread), the journal, the LLM
engine, each platform's resources and the admin endpoint; ``stop`` stops the
interfaces, drains in-flight work, then stops all of it, in reverse.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from autoresponse.actors.kernel import Cell, Clock, Runtime, TypedActor
from autoresponse.actors.approvals import APPROVALS, ApprovalDesk
from autoresponse.actors.builder import AutoResponseBuilder
from autoresponse.actors.conversation import ConversationActor, chat_of
from autoresponse.actors.dispatcher import ActionDispatcher
from autoresponse.actors.failures import FailureNotices
from autoresponse.actors.journal import DeliveryJournal, JournalInUse, SqliteJournal
from autoresponse.actors.limits import CONVERSATION_POOL_SIZE, DEAD_LETTER_RETENTION_SECONDS
from autoresponse.actors.llm import EngineChain, HttpEngine, LLMClient, LLMEngine, NoticeEngine, OfflineEngine, UsageMeter
from autoresponse.actors.llm.media import MediaReader
from autoresponse.actors.memory import ConversationStore
from autoresponse.actors.retry import RetryActor
from autoresponse.actors.routes import BUILDER, CONVERSATIONS, DISPATCHER, LLM
from autoresponse import otel
from autoresponse.admin import AdminServer
from autoresponse.config import LLMSettings, Settings
from autoresponse.messages import Envelope
from autoresponse.redaction import Redactor
from autoresponse.supervisors import (
    ChildSpec,
    Mount,
    MountError,
    Spec,
    Strategy,
    Supervisor,
    SupervisorSpec,
    platforms,
)
from autoresponse.supervisors.status import MEMORY

if TYPE_CHECKING:
    from autoresponse.actors.journal.shared_memory import SharedConversationStore
    from autoresponse.otel import Telemetry

log = logging.getLogger("autoresponse.app")

ROOT = "root"
PIPELINE = "pipeline"
RETRY = "retry"
INTERFACES = "interfaces"
#: The interfaces whose users can answer an approval (Telegram's buttons, ``/approve`` at the console).
APPROVAL_ANSWERS = frozenset({"telegram", "console"})


def make_engine(settings: LLMSettings, clock: Clock | None = None) -> LLMEngine:
    """An HTTP engine for a configured base URL, else the offline engine; with fallbacks,
    a chain of them, each behind a circuit breaker."""
    main: LLMEngine = OfflineEngine() if not settings.base_url else _http_engine(
        settings, settings.base_url, settings.model, settings.api_key)
    if not settings.fallbacks:
        return main
    engines: list[tuple[str, LLMEngine]] = [("main", main)]
    for n, fallback in enumerate(settings.fallbacks, 1):
        name = fallback.name or ("offline" if fallback.base_url == "offline" else f"fallback{n}")
        engine = (NoticeEngine() if fallback.base_url == "offline"
                  else _http_engine(settings, fallback.base_url, fallback.model, fallback.api_key))
        engines.append((name, engine))
    return EngineChain(engines, failures=settings.breaker_failures, cooldown=settings.breaker_cooldown,
                       clock=(clock or Clock()).monotonic)


def _http_engine(settings: LLMSettings, base_url: str, model: str, api_key: Any) -> HttpEngine:
    return HttpEngine(
        base_url,
        model=model,
        api_key=api_key,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_attempts=settings.max_attempts,
        max_in_flight=settings.max_in_flight,
        temperature=settings.temperature,
        request_timeout=settings.request_timeout,
        deadline=settings.deadline,
        max_response_bytes=settings.max_response_bytes,
        stream=settings.stream,
        protocol=settings.protocol,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
        context_tokens=settings.context_tokens,
    )


def engine_status(engine: LLMEngine) -> dict[str, Any]:
    """What the LLM engines are doing: the protocol each speaks now, and their circuits."""
    if isinstance(engine, EngineChain):
        return {"engines": engine.status()}
    return {"engines": [{"name": "main", "engine": repr(engine), "circuit": "closed", **engine_facts(engine)}]}


def engine_facts(engine: LLMEngine) -> dict[str, Any]:
    """The protocol an engine speaks now, its context window and the budget in use."""
    budget = getattr(engine, "budget", None)
    return {"protocol": getattr(engine, "mode", "text"),
            "configured_protocol": getattr(engine, "protocol", "text"),
            "context_tokens": getattr(engine, "context_tokens", None),
            "max_tokens": getattr(engine, "max_tokens", None),
            "request_budget_tokens": budget.room if budget is not None else None,
            "last_request_tokens": getattr(engine, "last_request_tokens", None),
            "server": getattr(engine, "server_facts", {}).get("server"),
            "problem": getattr(engine, "problem", None)}


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
    """Pipeline actors, retry pool and every enabled platform, supervised in one runtime.

    ``console`` is the console the console platform writes to (a captured one in
    tests); ``provided`` hands other objects to platforms by name; ``mount`` names
    the platforms that may mount (default: every enabled one). ``clock`` is the one clock
    of the runtime, which every timer of the tree waits on (real time by default; a
    ``ManualClock`` in tests).
    """

    def __init__(self, settings: Settings, *, console: Any = None, engine: LLMEngine | None = None,
                 provided: dict[str, Any] | None = None, mount: Collection[str] | None = None,
                 clock: Clock | None = None) -> None:
        self.settings = settings
        self.mount_only = None if mount is None else frozenset(mount)
        #: Actors run in the pipeline besides the platforms' (a replay's stand-in
        #: senders): name → (class, arguments). Set before ``start``.
        self.extra_actors: dict[str, tuple[type[TypedActor], tuple[Any, ...]]] = {}
        self.provided = dict(provided or {})
        if console is not None:
            self.provided["console"] = console
        self.runtime = Runtime(
            max_hops=settings.runtime.max_hops,
            mailbox_capacity=settings.runtime.mailbox_capacity,
            message_attempts=settings.supervision.message_attempts,
            max_open=settings.runtime.max_open,
            clock=clock if clock is not None else Clock(),
            event_loop=settings.runtime.event_loop,
            trace=settings.runtime.trace,
        )
        # A request that dies as a dead letter (a crash on every attempt, ...) tells its user;
        # so does a platform's input that never became one (each mount's ``origin``s).
        self.notices = FailureNotices(self.runtime)
        self.runtime.dead_letters.observers.append(self.notices)
        self.engine = engine or make_engine(settings.llm, self.runtime.clock)
        #: Tokens used, per model, turn kind and chat (and each chat's daily budget).
        self.usage = UsageMeter(settings.llm.daily_tokens_per_chat)
        self.admin: AdminServer | None = None
        self.journal: DeliveryJournal | None = None
        #: Each chat's memory (None when memory is off).
        self.memory: ConversationStore | SharedConversationStore | None = None
        self.mounts: dict[str, Mount] = {}
        #: OpenTelemetry's spans, when asked for (``autoresponse.otel``); None otherwise.
        self.telemetry: Telemetry | None = None
        self._closers: list[Callable[[], None]] = []
        #: Set when the root supervisor gave up; ``failure`` says why.
        self.failed = threading.Event()
        self.failure: str | None = None

    def resource(self, platform: str) -> Any:
        """What a mounted platform exposed (the console, the Telegram delivery, the event store)."""
        mount = self.mounts.get(platform)
        return None if mount is None else mount.resource

    @property
    def console(self) -> Any:
        return self.resource("console")

    def _supervisor(self, name: str, strategy: Strategy, children: list[Spec], **kw: Any) -> SupervisorSpec:
        supervision = self.settings.supervision
        return SupervisorSpec(name, strategy, tuple(children), intensity=supervision.intensity(),
                              backoff=supervision.backoff(), **kw)

    def tree(self) -> SupervisorSpec:
        """The supervision tree of the mounted platforms and the core pipeline."""
        s = self.settings
        pipeline: list[Spec] = [spec for m in self.mounts.values() for spec in m.pipeline_specs]
        pipeline += [ChildSpec(name, cls, args) for name, (cls, args) in self.extra_actors.items()]
        autonomous = tuple(s.runtime.autonomous_actions)
        preflight = {t: f for m in self.mounts.values() for t, f in m.preflights.items()}
        pipeline += [
            ChildSpec(DISPATCHER, ActionDispatcher, (s.runtime.max_actions, self.memory, s.llm.prose),
                      {"approval": self.gated_actions(), "preflight": preflight}),
            ChildSpec(LLM, LLMClient, (self.engine, s.llm.max_in_flight, autonomous, self.usage),
                      {"media": MediaReader.from_settings(s.llm, {i: d for m in self.mounts.values()
                                                                  for i, d in m.downloaders.items()})}),
            ChildSpec(BUILDER, AutoResponseBuilder, (self.memory,),
                      {"batch_wait": s.runtime.batch_wait, "autonomous": autonomous}),
        ]
        # The approvals desk: gated actions wait for a decision there. With approvals turned
        # off, it still starts while the journal keeps some waiting: it declines them (users told).
        if self.gated_actions() or self.approvals_waiting():
            pipeline.append(ChildSpec(APPROVALS, ApprovalDesk, (self.journal,),
                                      {"approvers": s.approvers, "timeout": s.approval_timeout,
                                       "requesters": self.requesters(), "preflight": preflight,
                                       "gated": self.gated_actions()}))
        retry = self._supervisor(RETRY, Strategy.SIMPLE_ONE_FOR_ONE, [ChildSpec(RETRY, RetryActor, (s.retry,))],
                                 pool_size=s.retry.pool_size)
        conversations = self._supervisor(
            CONVERSATIONS, Strategy.SIMPLE_ONE_FOR_ONE,
            [ChildSpec(CONVERSATIONS, ConversationActor, (self.memory,))],
            pool_size=CONVERSATION_POOL_SIZE, route_key=chat_of)
        inbound: list[Spec] = [spec for m in self.mounts.values() for spec in m.inbound_specs]
        return self._supervisor(ROOT, Strategy.ONE_FOR_ONE, [
            self._supervisor(PIPELINE, Strategy.ONE_FOR_ONE, pipeline),
            retry,
            conversations,
            self._supervisor(INTERFACES, Strategy.ONE_FOR_ONE, inbound),
        ])

    def start(self) -> Application:
        """Start the tree and the admin endpoint; if any of it fails, stop what started."""
        rt = self.runtime.start()
        redact = Redactor(self.settings.secrets())
        rt.dead_letters.redact = redact
        try:
            self.telemetry = otel.setup(rt, self.settings.otel, redact=redact)
            if self.telemetry is not None:  # closed last, after the runtime: every span is sent
                self._closers.append(self.telemetry.shutdown)
            rt.io.add_closer(self.engine.aclose)
            rt.reports["llm"] = lambda: {**engine_status(self.engine), "usage": self.usage.status()}
            self._open_journal()
            self._open_memory()
            self._mount_platforms()
            self._check_approval()
            rt.crash_policy = self._root_failed
            rt.error_route = RETRY
            # The interfaces start with the intake closed: nothing new is taken until the
            # journal's unfinished work is resumed, so an old item runs once, and before
            # anything newer from the same chat.
            rt.intake.pause()
            tree = self.tree()
            rt.spawn(ROOT, Supervisor, tree)
            self._check_up(names_in(tree))
            resumed = rt.resume()
            if resumed:
                log.info("resumed %d unfinished work items from the journal", resumed)
            rt.intake.open()
            if self.settings.admin.enabled:
                self.admin = AdminServer(rt, self.settings.admin, self.usage)
                try:
                    log.info("admin endpoint at %s", self.admin.start())
                except OSError as exc:
                    raise StartError(f"the admin endpoint cannot listen on "
                                     f"{self.settings.admin.host}:{self.settings.admin.port}: "
                                     f"{exc.strerror or exc}") from None
        except BaseException:
            self._stop_runtime(0)
            raise
        log.info("started: llm=%r, platforms=%s, %d actors", self.engine,
                 ",".join(self.mounts) or "none", len(rt.cells))
        return self

    def _open_journal(self) -> None:
        s = self.settings
        if s.journal.enabled and s.journal.backend == "nats":
            from autoresponse.actors.journal.jetstream import (
                JetStreamJournal,
                JournalUnavailable,
                default_node,
            )

            try:
                self.journal = JetStreamJournal(
                    s.nats.url, node=s.nats.node or default_node(), retention_seconds=s.journal.retention_seconds,
                    ack_wait=s.nats.ack_wait_seconds, lease_seconds=s.nats.lease_seconds,
                    max_held=2 * s.llm.max_in_flight)
            except JournalUnavailable as exc:
                raise StartError(str(exc)) from None
            self._closers.append(self.journal.close)
            self.runtime.journal = self.journal
        elif s.journal.enabled:
            try:
                self.journal = SqliteJournal(s.journal_path, retention_seconds=s.journal.retention_seconds)
            except JournalInUse as exc:
                raise StartError(str(exc)) from None
            self._closers.append(self.journal.close)
            self.runtime.journal = self.journal
            now = self.runtime.clock.time()
            forgotten = self.journal.compact(now - s.journal.retention_seconds,
                                             dead_letters_older_than=now - DEAD_LETTER_RETENTION_SECONDS)
            log.debug("journal: compacted %d finished items", forgotten)

    def _open_memory(self) -> None:
        s = self.settings.memory
        if s.enabled and getattr(self.journal, "distributed", False):  # shared by the cluster
            from autoresponse.actors.journal.shared_memory import SharedConversationStore

            self.memory = SharedConversationStore(self.journal, max_tokens=s.max_tokens,  # type: ignore[arg-type]
                                                  retention_seconds=s.retention_seconds)
        elif s.enabled:
            self.memory = ConversationStore(self.settings.data_path / "memory.sqlite3",
                                            max_tokens=s.max_tokens, retention_seconds=s.retention_seconds)
            self._closers.append(self.memory.close)
            self.memory.compact()
            self.runtime.stores[MEMORY] = self.memory  # its disk may fail its writes: in the status

    def _mount_platforms(self) -> None:
        """Each enabled platform opens what it needs and names its actors, in registry order."""
        for platform in platforms():
            section = self.settings.section(platform.name)
            if not platform.enabled(section) or (self.mount_only is not None
                                                 and platform.name not in self.mount_only):
                continue
            mount = Mount(name=platform.name, settings=section, runtime=self.runtime,
                          journal=self.journal, data_dir=self.settings.data_path, provided=self.provided)
            self.mounts[platform.name] = mount
            try:
                platform.mount(mount)
            except MountError as exc:
                raise StartError(str(exc)) from None
            finally:
                self._closers.extend(mount.closers)
            for input_type, origin in mount.origins.items():
                self.notices.origin(input_type, origin)

    def requesters(self) -> dict[str, list[str]]:
        """By interface, who may cause actions there (its platform's ``allowed_users``, as
        text): the one who asked for an approval decides it only while among them."""
        return {platform.interface: [str(user) for user in getattr(mount.settings, "allowed_users", ())]
                for platform in platforms() if (mount := self.mounts.get(platform.name)) is not None}

    def approvals_waiting(self) -> bool:
        """Whether the journal keeps approvals still waiting (the NATS journal keeps none)."""
        pending = getattr(self.journal, "approvals", None)
        return pending is not None and bool(pending("pending"))

    def gated_actions(self) -> tuple[str, ...]:
        """The command actions that run only once approved: those of each mounted platform
        whose settings say ``approval = "ask"`` (``AUTORESPONSE_TERMINAL__APPROVAL=ask``)."""
        gated: list[str] = []
        for platform in platforms():
            mount = self.mounts.get(platform.name)
            if mount is not None and getattr(mount.settings, "approval", "never") == "ask":
                gated += [a.action_type() for a in platform.actions if a.kind == "command"]
        return tuple(gated)

    def _check_approval(self) -> None:
        """Approvals are journaled (the wait and the decision survive a restart): they need a
        journal that keeps them, which the NATS journal does not (yet). And they are offered
        in the requester's chat, on its platform: only Telegram's buttons and the console
        take an answer, so another platform that talks to users (X, the userbot, Reddit)
        refuses to start with them. A typed ``/approve`` there would be no fix: on X the offer
        to an approver's "private chat" is a public post, and answers would be public too."""
        gated = self.gated_actions()
        mute = [p.name for p in platforms() if p.name in self.mounts and p.interface is not None
                and p.interface not in APPROVAL_ANSWERS]
        if gated and mute:
            raise StartError(f"{', '.join(gated)} approval = \"ask\" cannot be answered on "
                             f"{', '.join(mute)} (only Telegram's buttons and the console take an answer): "
                             f"disable {', '.join(mute)}, or set approval = \"never\"")
        if gated and not hasattr(self.journal, "record_approval"):
            where = ("the NATS journal does not keep approvals" if getattr(self.journal, "distributed", False)
                     else "the journal is off")
            raise StartError(f"{', '.join(self.gated_actions())} approval = \"ask\" needs the SQLite journal, "
                             f"and {where}: set journal.backend = \"sqlite\" and journal.enabled = true, "
                             f"or approval = \"never\"")

    def _stop_runtime(self, drain: float) -> bool:
        drained = self.runtime.stop(drain, first=(INTERFACES,))
        for close in reversed(self._closers):
            try:
                close()
            except Exception:
                log.exception("closing %r failed", close)
        self._closers.clear()
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
        """Stop taking work (interfaces, injects), drain what is under way, stop everything.
        True if drained; what was not stays open in the journal and resumes on the next start."""
        if self.admin is not None:
            self.admin.accepting = False
        drained = self._stop_runtime(self.settings.runtime.drain_seconds)
        if not drained:
            log.warning("stopped before all in-flight work finished; it resumes on the next start")
        return drained

    def __enter__(self) -> Application:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
