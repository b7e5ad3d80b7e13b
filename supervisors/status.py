"""A snapshot of the whole supervision tree, for people and for machines.

>>> snapshot(runtime).model_dump_json(indent=2)                   # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from autoresponse.actors.kernel import Runtime, pinned_core
from autoresponse.messages import Failure


#: The name the journal is failing under (``Status.failing``): no actor has it.
JOURNAL = "journal"
#: The name the conversation memory is failing under (``Runtime.stores``): no actor has it either.
MEMORY = "memory"


class FailingStatus(BaseModel):
    """Why an actor reports that the world outside it fails it, and since when."""

    reason: str
    since: float

    def line(self, name: str, now: float) -> str:
        """``interface.telegram failing for 25s (since 12:00:03): <reason>``."""
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{name} failing for {max(0.0, now - self.since):.0f}s (since {when}): {self.reason}"


class ActorStatus(BaseModel):
    name: str
    kind: Literal["supervisor", "worker"]
    state: Literal["running", "restarting", "stopped"]
    #: Its incarnation's thread is alive (a "running" actor whose thread died is not).
    alive: bool = True
    restarts: int
    last_failure: Failure | None
    mailbox: int = Field(description="letters waiting")
    processed: int
    #: Set while the actor reports that its outside world fails it (its platform refuses
    #: its token, it cannot renew its lease): the reason, and since when.
    failing: FailingStatus | None = None
    children: list[ActorStatus] = Field(default_factory=list)

    def walk(self) -> list[ActorStatus]:
        """This node and every node below it, depth first."""
        return [self, *(node for child in self.children for node in child.walk())]


class Status(BaseModel):
    time: float
    tree: list[ActorStatus]
    in_flight: int
    #: Work accepted from outside and not finished, and how much may be.
    open_items: int = 0
    intake_capacity: int = 0
    #: Actors that are not running (crashed and restarting, stopped, or dead threads).
    down: list[str] = Field(default_factory=list)
    #: Actors that report their outside world failing them (a platform refusing them, a
    #: lease they cannot renew), with why and since when; running or not (``down``). Also
    #: ``journal`` while its database fails its writes: no new work is taken then; and
    #: ``memory`` while the conversation memory's do: replies go out, not remembered.
    failing: dict[str, FailingStatus] = Field(default_factory=dict)
    dead_letters: dict[str, int] = Field(description="counts by reason")
    dead_letters_total: int
    #: Several daemons on NATS JetStream: this node, who holds which lease, and the work
    #: stream (pending, in progress, redelivered); None on one daemon.
    cluster: dict[str, Any] | None = None
    #: The one CPU core the process's threads run on (``runtime.cpu_core``); None: every core.
    cpu_core: int | None = None
    #: Whether every hop of every request is recorded (``runtime.trace``).
    traced: bool = True
    #: Sections the application reports: ``llm`` (each engine's protocol and circuit,
    #: tokens used by turn kind).
    reports: dict[str, Any] = Field(default_factory=dict)

    def find(self, name: str) -> ActorStatus | None:
        return next((n for root in self.tree for n in root.walk() if n.name == name), None)

    @property
    def healthy(self) -> bool:
        """Every actor runs and none reports failing: nothing is down, no inbound loop is
        dead, no platform refuses us."""
        return not self.down and not self.failing

    def problem(self) -> str | None:
        """What is wrong, in one line (None when healthy): what is down, then what fails."""
        parts = [f"down: {', '.join(self.down)}"] if self.down else []
        parts += [f.line(name, self.time) for name, f in self.failing.items()]
        return "; ".join(parts) or None


def snapshot(runtime: Runtime, *, details: bool = True) -> Status:
    """The status now. Without ``details`` it leaves out the cluster and the reports: a
    health check never waits for a NATS server that is away."""
    from autoresponse.supervisors.supervisor import Supervisor  # the kernel knows no supervisors

    cells = runtime.cells
    children: dict[str, list[str]] = {}
    for cell in cells:
        if cell.supervisor is not None:
            children.setdefault(cell.supervisor, []).append(cell.name)

    failing = {c.name: FailingStatus(reason=f.reason, since=f.since)
               for c in cells if (f := c.failing) is not None}
    for concern, store in {JOURNAL: runtime.journal, **runtime.stores}.items():
        if store is not None and (marked := store.failing) is not None:  # its disk full, say
            failing[concern] = FailingStatus(reason=marked[0], since=marked[1])

    def node(name: str) -> ActorStatus:
        cell = runtime.cell(name)
        return ActorStatus(
            name=name,
            kind="supervisor" if issubclass(cell.actor_class, Supervisor) else "worker",
            state=cell.state,
            alive=cell.alive,
            restarts=cell.restarts,
            last_failure=cell.last_failure,
            mailbox=len(cell.mailbox),
            processed=cell.processed,
            failing=failing.get(name),
            children=[node(child) for child in children.get(name, [])],
        )

    counts = runtime.dead_letters.counts()
    return Status(
        time=runtime.clock.time(),
        tree=[node(c.name) for c in cells if c.supervisor is None or not runtime.has(c.supervisor)],
        in_flight=runtime.inflight.count(),
        open_items=runtime.intake.open_count,
        intake_capacity=runtime.intake.capacity,
        down=[c.name for c in cells if c.state != "running" or not c.alive],
        failing=failing,
        dead_letters=counts,
        dead_letters_total=sum(counts.values()),
        cluster=_cluster(runtime) if details else None,
        cpu_core=pinned_core(),
        traced=runtime.tracer is not None,
        reports=_reports(runtime) if details else {},
    )


def _reports(runtime: Runtime) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, report in list(runtime.reports.items()):
        try:
            found[name] = report()
        except Exception as exc:  # one report failing never hides the rest of the status
            found[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def _cluster(runtime: Runtime) -> dict[str, Any] | None:
    journal = runtime.journal
    if not getattr(journal, "distributed", False):
        return None
    try:
        return journal.status(timeout=2.0)  # type: ignore[union-attr]
    except Exception as exc:  # the server is away: say so, the rest of the status stands
        return {"error": f"NATS: {exc or type(exc).__name__}"}
