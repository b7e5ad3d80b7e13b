"""The supervisor: starts children, restarts them by strategy, escalates when it must.

>>> runtime.spawn("root", Supervisor, SupervisorSpec("root", Strategy.ONE_FOR_ONE, children=(
...     ChildSpec("worker", Worker),)))                                  # doctest: +SKIP

The generic machinery lives here; workers never know they are supervised. A
crashed child's message has already been put back at the head of its mailbox
by the kernel (or dead-lettered after its last attempt); the supervisor only
decides which children start again, and when.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.kernel import ActorGaveUp, TypedActor, handles
from autoresponse.actors.kernel.backoff import Backoff
from autoresponse.messages import Envelope, Exit
from autoresponse.supervisors.spec import ChildSpec, Restart, Spec, Strategy, SupervisorSpec


class Escalation(ActorGaveUp):
    """A supervisor exceeded its restart intensity and fails to its parent."""


class RestartDue(BaseModel):
    """The backoff delay of a restart has passed."""

    model_config = ConfigDict(frozen=True)

    names: tuple[str, ...]


class StartChild(BaseModel):
    """Start one more child (OTP's ``start_child``): for a simple_one_for_one pool, one
    more from its template (``args`` after the template's); for any other supervisor,
    the ``spec`` given, after the children it already has."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    args: tuple[Any, ...] = ()
    spec: ChildSpec | SupervisorSpec | None = None


class Supervisor(TypedActor):
    """``clock`` reads the time for the restart intensity and the backoff (default: the
    runtime's clock, ``runtime.clock.monotonic``); the backoff waits on the runtime's clock."""

    def __init__(self, spec: SupervisorSpec, *, clock: Callable[[], float] | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        super().__init__()
        self.spec = spec
        self._clock = clock if clock is not None else self.runtime.clock.monotonic
        self._rng = rng
        self._children: list[tuple[str, Spec]] = []  # in start order
        self._restarts: deque[tuple[float, str]] = deque()  # when, and whose
        self._backoffs: dict[str, Backoff] = {}
        self._handled_by_crash: dict[str, int] = {}  # messages a child had handled at its last crash
        self._pool_serial = 0

    # ---------------------------------------------------------------- lifetime

    def setup(self) -> None:
        if self.spec.strategy is Strategy.SIMPLE_ONE_FOR_ONE:
            for _ in range(self.spec.pool_size):
                self._add_to_pool(())
        else:
            for child in self.spec.children:
                self._children.append((child.id, child))
                self._start(child.id, child)

    def teardown(self) -> None:
        """Children stop in reverse start order, each within its shutdown time."""
        for name, spec in reversed(self._children):
            if self.runtime.has(name):
                self.runtime.cell(name).stop(spec.shutdown)

    def _start(self, name: str, spec: Spec) -> None:
        rt = self.runtime
        if rt.has(name):
            cell = rt.cell(name)
            if not cell.alive:
                cell.start()
        elif isinstance(spec, SupervisorSpec):
            rt.spawn(name, Supervisor, spec, clock=self._clock, rng=self._rng, supervisor=self.name)
        else:
            rt.spawn(name, spec.factory, *spec.args, capacity=spec.capacity,
                     overflow=spec.overflow, supervisor=self.name, **spec.kwargs)

    def _add_to_pool(self, extra: tuple[Any, ...]) -> str:
        template = self.spec.children[0]
        assert isinstance(template, ChildSpec), "a pool's template must be a worker spec"
        spec = dataclasses.replace(template, args=template.args + extra) if extra else template
        name = f"{template.id}.{self._pool_serial}"
        self._pool_serial += 1
        self._children.append((name, spec))
        self._start(name, spec)
        return name

    # ---------------------------------------------------------------- signals

    @handles
    def on_exit(self, exit: Exit, env: Envelope) -> None:
        entry = next(((n, s) for n, s in self._children if n == exit.name), None)
        if entry is None or self.runtime.stopping:
            return
        name, spec = entry
        if spec.restart is Restart.TEMPORARY or (spec.restart is Restart.TRANSIENT and not exit.abnormal):
            self._children.remove(entry)
            self.runtime.close(self.runtime.cell(name))
            return
        # A supervisor below that gave up is a subtree in a restart loop, however much it handled.
        progressed = not isinstance(spec, SupervisorSpec) and self._progressed(name)
        if progressed or exit.set_aside:
            self._forgive(name)
        if not exit.set_aside:
            self._count_restart(name, exit)
        group = self._group(name)
        for other, other_spec in reversed(group):
            if other != name:
                self.runtime.cell(other).stop(other_spec.shutdown)
        names = tuple(n for n, _ in group)
        for n in names:
            self.runtime.cell(n).state = "restarting"
        backoff = self._backoffs.setdefault(name, Backoff(self.spec.backoff, clock=self._clock, rng=self._rng))
        if progressed or exit.set_aside:
            backoff.reset()
        # The message it failed on a dead letter, the next incarnation starts on other work: at once.
        delay = 0.0 if exit.set_aside else backoff.next_delay()
        if delay > 0:
            self.schedule(delay, RestartDue(names=names), cause=env)
        else:
            self._restart(names)

    @handles
    def on_restart_due(self, due: RestartDue, env: Envelope) -> None:
        self._restart(due.names)

    @handles
    def on_start_child(self, request: StartChild, env: Envelope) -> None:
        if self.spec.strategy is Strategy.SIMPLE_ONE_FOR_ONE:
            self._add_to_pool(request.args)
            return
        if request.spec is None:
            raise ValueError(f"{self.name} is not a simple_one_for_one pool: StartChild needs a spec")
        if any(name == request.spec.id for name, _ in self._children):
            raise ValueError(f"{self.name} already has a child named {request.spec.id!r}")
        self._children.append((request.spec.id, request.spec))
        self._start(request.spec.id, request.spec)

    @handles
    def on_work(self, message: object, env: Envelope) -> None:
        """A pool routes work to a child by its key (the correlation by default: one request,
        one child, in order)."""
        if self.spec.strategy is not Strategy.SIMPLE_ONE_FOR_ONE or not self._children:
            self.runtime.dead_letters.post(env, "no handler", actor=self.name,
                                           detail=f"a supervisor does not handle {type(message).__name__}")
            return
        route_key = self.spec.route_key
        key = env.correlation_id if route_key is None else route_key(message, env)
        name, _ = self._children[zlib.crc32(key.encode()) % len(self._children)]
        self.runtime.deliver(name, env.child(message))

    # ---------------------------------------------------------------- strategy

    def _count_restart(self, name: str, exit: Exit) -> None:
        """Restart intensity: one restart too many fails this supervisor to its parent."""
        intensity = self.spec.intensity
        now = self._clock()
        while self._restarts and now - self._restarts[0][0] > intensity.period:
            self._restarts.popleft()
        if len(self._restarts) >= intensity.max_restarts:
            why = f"{exit.failure.type}: {exit.failure.message}" if exit.failure else "normal exit"
            raise Escalation(
                f"{self.name}: more than {intensity.max_restarts} restarts in "
                f"{intensity.period:g}s; last: {name} ({why})"
            )
        self._restarts.append((now, name))

    def _forgive(self, name: str) -> None:
        """``name``'s restarts so far count no more toward the intensity."""
        self._restarts = deque(r for r in self._restarts if r[1] != name)

    def _progressed(self, name: str) -> bool:
        """Whether the worker ``name`` handled a message since its last crash: its last
        restart worked.

        Restart intensity and backoff are for a child that cannot get going (a setup that
        fails; a message it fails on, tried again at the head of its mailbox). A worker's
        restarts count no more, and its backoff starts over, once it went on working, or
        once the message it failed on is a dead letter (``Exit.set_aside``: the next
        incarnation starts on other work, at once). Counted across poison messages each set
        aside in turn, they held every chat queued behind them, for seconds a poison and
        longer each time, or, restarting at once, took a flood of them for a restart loop
        and stopped the tree."""
        handled = self.runtime.cell(name).processed
        progressed = self._handled_by_crash.get(name, handled) != handled
        self._handled_by_crash[name] = handled
        return progressed

    def _group(self, name: str) -> list[tuple[str, Spec]]:
        """The children to restart, in start order."""
        index = next(i for i, (n, _) in enumerate(self._children) if n == name)
        strategy = self.spec.strategy
        if strategy is Strategy.ONE_FOR_ALL:
            return list(self._children)
        if strategy is Strategy.REST_FOR_ONE:
            return self._children[index:]
        return [self._children[index]]

    def _restart(self, names: tuple[str, ...]) -> None:
        if self.runtime.stopping:
            return
        ours = {n for n, _ in self._children}
        for name in names:
            if name in ours:
                cell = self.runtime.cell(name)
                if not cell.alive:
                    cell.restart()
