"""Supervisors: strategies, restart types, intensity and escalation, backoff, pools."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import wait_for
from pydantic import BaseModel

from autoresponse.actors.kernel import ManualClock, Runtime, TypedActor, handles
from autoresponse.actors.kernel.backoff import POLL_BACKOFF
from autoresponse.messages import Crash, Envelope
from autoresponse.supervisors import (
    Backoff,
    BackoffPolicy,
    ChildSpec,
    Restart,
    RestartIntensity,
    StartChild,
    Strategy,
    Supervisor,
    SupervisorSpec,
)

NO_DELAY = BackoffPolicy(min=0, max=0, jitter=0)


class Quit(BaseModel):
    """Ask a worker to stop itself normally."""


class Note(BaseModel):
    text: str


class Journal:
    """What happened to the workers, in order, across threads."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: str) -> list[str]:
        with self._lock:
            return [e.split(":", 1)[1] for e in self.events if e.startswith(kind + ":")]


class Worker(TypedActor):
    def __init__(self, journal: Journal, *extra: str) -> None:
        super().__init__()
        self.journal = journal
        self.extra = extra

    def setup(self) -> None:
        self.journal.add(f"start:{self.name}")

    def teardown(self) -> None:
        self.journal.add(f"stop:{self.name}")

    @handles
    def on_quit(self, quit: Quit, env: Envelope) -> None:
        self.stop()

    @handles
    def on_note(self, note: Note, env: Envelope) -> None:
        self.journal.add(f"note:{self.name}={note.text}")




@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def supervise(journal: Journal) -> Iterator[Callable[..., Runtime]]:
    runtimes: list[Runtime] = []

    def start(strategy: Strategy, *children: ChildSpec | SupervisorSpec, clock: ManualClock | None = None,
              **spec: object) -> Runtime:
        rt = Runtime(clock=clock).start()
        runtimes.append(rt)
        spec.setdefault("backoff", NO_DELAY)
        rt.spawn("top", Supervisor, SupervisorSpec("top", strategy, children, **spec))  # type: ignore[arg-type]
        return rt

    yield start
    for rt in runtimes:
        rt.stop(drain=2)


def workers(journal: Journal, *names: str, restart: Restart = Restart.PERMANENT) -> list[ChildSpec]:
    return [ChildSpec(name, Worker, (journal,), restart=restart) for name in names]


def crash(rt: Runtime, name: str) -> None:
    before = rt.cell(name).restarts if rt.has(name) else 0
    rt.send(name, Crash(reason=f"crash {name}"))
    wait_for(lambda: rt.cell(name).restarts > before and rt.cell(name).alive)


@pytest.mark.parametrize(
    ("strategy", "stopped", "restarted"),
    [
        (Strategy.ONE_FOR_ONE, [], ["b"]),
        (Strategy.ONE_FOR_ALL, ["c", "a"], ["a", "b", "c"]),
        (Strategy.REST_FOR_ONE, ["c"], ["b", "c"]),
    ],
)
def test_strategies_restart_the_right_children_in_start_order(
    supervise: Callable[..., Runtime], journal: Journal, strategy: Strategy,
    stopped: list[str], restarted: list[str]
) -> None:
    rt = supervise(strategy, *workers(journal, "a", "b", "c"))
    wait_for(lambda: len(journal.of("start")) == 3)
    assert journal.of("start") == ["a", "b", "c"]
    crash(rt, "b")
    wait_for(lambda: len(journal.of("start")) == 3 + len(restarted))
    time.sleep(0.05)
    assert journal.of("start")[3:] == restarted
    # "b" tears down as it crashes; the others are stopped by the supervisor, last started first.
    assert [n for n in journal.of("stop") if n != "b"] == stopped
    assert all(rt.cell(n).alive for n in "abc")


def test_temporary_children_are_never_restarted(supervise: Callable[..., Runtime], journal: Journal) -> None:
    rt = supervise(Strategy.ONE_FOR_ONE, *workers(journal, "t", restart=Restart.TEMPORARY))
    wait_for(lambda: rt.has("t") and rt.cell("t").alive)
    rt.send("t", Crash())
    wait_for(lambda: rt.cell("t").mailbox.closed)
    assert rt.cell("t").restarts == 0 and not rt.cell("t").alive
    assert rt.send("t", Note(text="late")) is None
    assert rt.dead_letters.letters()[-1].reason == "actor stopped"


@pytest.mark.parametrize(("restart", "after_quit"), [(Restart.TRANSIENT, 0), (Restart.PERMANENT, 1)])
def test_transient_children_are_restarted_only_after_a_crash(
    supervise: Callable[..., Runtime], journal: Journal, restart: Restart, after_quit: int
) -> None:
    rt = supervise(Strategy.ONE_FOR_ONE, *workers(journal, "w", restart=restart))
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    crash(rt, "w")
    assert rt.cell("w").restarts == 1
    rt.send("w", Quit())
    wait_for(lambda: journal.of("stop").count("w") == 2)
    time.sleep(0.1)
    assert rt.cell("w").restarts == 1 + after_quit
    assert rt.cell("w").alive is bool(after_quit)


def test_too_many_restarts_escalate_to_the_parent(supervise: Callable[..., Runtime], journal: Journal) -> None:
    inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, tuple(workers(journal, "w")),
                           intensity=RestartIntensity(max_restarts=2, period=60), backoff=NO_DELAY)
    rt = supervise(Strategy.ONE_FOR_ONE, inner, intensity=RestartIntensity(max_restarts=5, period=60))
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    crash(rt, "w")
    crash(rt, "w")
    assert rt.cell("inner").restarts == 0
    rt.send("w", Crash(reason="the third"))
    wait_for(lambda: rt.cell("inner").restarts == 1 and rt.cell("w").alive)
    failure = rt.cell("inner").last_failure
    assert failure is not None and failure.type == "Escalation"
    assert "inner: more than 2 restarts in 60s; last: w (CrashRequested: the third)" == failure.message
    # The restarted supervisor started its child afresh, with a clean restart count.
    crash(rt, "w")
    assert rt.cell("inner").restarts == 1


def test_a_crash_that_quotes_a_secret_is_kept_redacted(supervise: Callable[..., Runtime],
                                                       journal: Journal) -> None:
    """The last failure shows in /status, the status page and `autoresponse status`: a
    configured secret in a crash's text never does, in the actor's or its supervisor's."""
    from autoresponse.redaction import Redactor

    secret = "sk-live-SECRET-0123456789"
    inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, tuple(workers(journal, "w")),
                           intensity=RestartIntensity(max_restarts=0, period=60), backoff=NO_DELAY)
    rt = supervise(Strategy.ONE_FOR_ONE, inner)
    rt.dead_letters.redact = Redactor([secret])
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    rt.send("w", Crash(reason=f"upstream said: bad key {secret}"))
    wait_for(lambda: rt.cell("inner").restarts == 1 and rt.cell("w").alive)
    worker, supervisor = rt.cell("w").last_failure, rt.cell("inner").last_failure
    assert worker is not None and worker.message == "upstream said: bad key [secret]"
    assert supervisor is not None and supervisor.message.endswith("(CrashRequested: upstream said: bad key [secret])")


def test_the_root_failing_reaches_the_runtime(journal: Journal) -> None:
    gave_up: list[str] = []
    rt = Runtime().start()
    rt.crash_policy = lambda cell, env, error: gave_up.append(f"{cell.name}: {error}")
    try:
        rt.spawn("root", Supervisor, SupervisorSpec("root", Strategy.ONE_FOR_ONE, tuple(workers(journal, "w")),
                                                    intensity=RestartIntensity(0, 60), backoff=NO_DELAY))
        wait_for(lambda: rt.has("w") and rt.cell("w").alive)
        rt.send("w", Crash(reason="fatal"))
        wait_for(lambda: bool(gave_up))
        assert gave_up == ["root: root: more than 0 restarts in 60s; last: w (CrashRequested: fatal)"]
        assert not rt.cell("w").alive  # the root stopped its children as it gave up
    finally:
        rt.stop(drain=2)


def test_backoff_follows_min_max_and_jitter_and_resets_when_quiet() -> None:
    now = [0.0]
    spread = iter([0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    backoff = Backoff(BackoffPolicy(min=1.0, max=8.0, jitter=0.5, reset_after=30.0),
                      clock=lambda: now[0], rng=lambda: next(spread))
    delays = []
    for _ in range(5):
        delays.append(backoff.next_delay())
        now[0] += 10.0  # restarts 10 s apart: never quiet long enough to reset
    # 1 * (1 - 0.5), 2 * (1 + 0.5), then 4 and 8 without jitter, then capped at max.
    assert delays == [0.5, 3.0, 4.0, 8.0, 8.0]
    now[0] += 30.0
    assert backoff.next_delay() == 1.0


def test_a_backoff_whose_waits_outlast_its_quiet_spell_still_reaches_its_max() -> None:
    """A poll failing every time it is tried again waits 1, 2, 4 … up to 5 minutes: a wait
    longer than reset_after is no quiet spell (it used to start over after 32 s, for ever)."""
    now = [0.0]
    backoff = Backoff(POLL_BACKOFF, clock=lambda: now[0], rng=lambda: 0.5)
    delays = []
    for _ in range(12):
        delays.append(backoff.next_delay())
        now[0] += delays[-1] + 0.5  # tried again as soon as the wait ran out, and failed
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0, 300.0]
    now[0] += POLL_BACKOFF.reset_after  # then quiet, past the last wait
    assert backoff.next_delay() == 1.0


def test_a_thousand_failures_in_a_row_still_wait_the_max() -> None:
    policy = BackoffPolicy(min=0.5, max=30.0, jitter=0.0)
    assert [policy.delay(n) for n in (1, 1_025, 10**6)] == [0.5, 30.0, 30.0]  # once an OverflowError


def test_a_restart_waits_for_its_backoff(supervise: Callable[..., Runtime], journal: Journal) -> None:
    clock = ManualClock()
    rt = supervise(Strategy.ONE_FOR_ONE, *workers(journal, "w"),
                   backoff=BackoffPolicy(min=30, max=30, jitter=0), clock=clock)
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    rt.send("w", Note(text="queued before"))
    rt.send("w", Crash())
    rt.send("w", Note(text="queued after"))
    wait_for(lambda: rt.cell("w").last_failure is not None)
    assert clock.wait_for_sleepers(1)  # the supervisor's backoff timer, on the runtime's clock
    assert clock.pending() == [30.0]
    clock.advance(29.9)
    assert rt.cell("w").state == "restarting" and not rt.cell("w").alive
    assert journal.of("note") == ["w=queued before"]
    clock.advance(0.1)
    wait_for(lambda: rt.cell("w").alive and "w=queued after" in journal.of("note"))
    assert journal.of("note") == ["w=queued before", "w=queued after"]


class Poisoned(Worker):
    """Crashes on every note that says "poison"."""

    @handles
    def on_note(self, note: Note, env: Envelope) -> None:
        if note.text == "poison":
            raise RuntimeError("poisoned")
        super().on_note(note, env)


def test_a_poison_set_aside_never_grows_the_backoff_for_the_next(
        supervise: Callable[..., Runtime], journal: Journal) -> None:
    """Two messages that crash their actor on every attempt (three), one that does not, then
    a third crashing one: each poison's own retries back off (1 s, then 2 s); once it is a
    dead letter the actor restarts at once, and the next poison's retries start from 1 s
    again. Grown on (4, 8, 16 s and on), the backoff held every message queued behind them,
    for seconds a poison, and longer each time one user asked again."""
    clock = ManualClock()
    rt = supervise(Strategy.ONE_FOR_ONE, ChildSpec("w", Poisoned, (journal,)),
                   backoff=BackoffPolicy(min=1, max=60, jitter=0), clock=clock,
                   intensity=RestartIntensity(max_restarts=100, period=10))
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    for text in ("poison", "poison", "fine", "poison", "after"):
        rt.send("w", Note(text=text))
    waits: list[float] = []
    for _ in range(20):  # bounded: each turn is one restart's wait
        if journal.of("note") == ["w=fine", "w=after"]:
            break
        if clock.wait_for_sleepers(1, timeout=2):
            [wait] = clock.pending()
            waits.append(wait)
            clock.advance(wait)
    assert journal.of("note") == ["w=fine", "w=after"]
    assert waits == [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    assert [letter.reason for letter in rt.dead_letters.letters()] == ["crash"] * 3


@pytest.mark.parametrize("between", [False, True], ids=["one after another", "with work between"])
def test_a_flood_of_poison_messages_is_never_taken_for_a_restart_loop(
        supervise: Callable[..., Runtime], journal: Journal, between: bool) -> None:
    """Each poison crashes its actor three times, one after another or with a message handled
    between them. A poison's restarts count no more against the intensity (3 in a minute here)
    once it is a dead letter, or the actor worked since: ten poisons (30 restarts) stop
    nothing; each is a dead letter, and every other message is handled. Counted, the second
    poison stopped the tree (a flood of 200 stopped the daemon)."""
    rt = supervise(Strategy.ONE_FOR_ONE, ChildSpec("w", Poisoned, (journal,)),
                   intensity=RestartIntensity(max_restarts=3, period=60))
    wait_for(lambda: rt.has("w") and rt.cell("w").alive)
    for n in range(10):
        rt.send("w", Note(text="poison"))
        if between:
            rt.send("w", Note(text=f"fine {n}"))
    rt.send("w", Note(text="after"))
    wait_for(lambda: "w=after" in journal.of("note"))
    assert journal.of("note") == [f"w=fine {n}" for n in range(10) if between] + ["w=after"]
    assert [letter.reason for letter in rt.dead_letters.letters()] == ["crash"] * 10
    assert rt.cell("top").restarts == 0  # it never gave up


def test_a_pool_grows_routes_by_correlation_and_restarts_one_child(
    supervise: Callable[..., Runtime], journal: Journal
) -> None:
    rt = supervise(Strategy.SIMPLE_ONE_FOR_ONE, ChildSpec("p", Worker, (journal,)), pool_size=2)
    wait_for(lambda: rt.has("p.1") and rt.cell("p.1").alive)
    rt.send("top", StartChild(args=("extra",)))
    wait_for(lambda: rt.has("p.2") and rt.cell("p.2").alive)
    for n in range(30):
        rt.send("top", Note(text=str(n)), correlation_id=f"chat-{n % 3}")
    assert rt.wait_idle(timeout=10)
    by_child: dict[str, set[str]] = {}
    for note in journal.of("note"):
        child, text = note.split("=")
        by_child.setdefault(child, set()).add(f"chat-{int(text) % 3}")
    # Each correlation was handled by exactly one child.
    assert sum(len(chats) for chats in by_child.values()) == 3
    crash(rt, "p.1")
    assert [rt.cell(n).restarts for n in ("p.0", "p.1", "p.2")] == [0, 1, 0]


class SlowToStart(Worker):
    def setup(self) -> None:
        time.sleep(0.2)
        super().setup()


class Checker(Worker):
    """Records, as it starts, whether the siblings started before it are already up."""

    def setup(self) -> None:
        up = all(self.runtime.has(n) and self.runtime.cell(n).ready.is_set() for n in ("slow", "a"))
        self.journal.add(f"start:{self.name}={'after its elders' if up else 'too early'}")


def test_children_start_one_after_the_other(supervise: Callable[..., Runtime], journal: Journal) -> None:
    inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, (ChildSpec("slow", SlowToStart, (journal,)),))
    rt = supervise(Strategy.ONE_FOR_ONE, inner, *workers(journal, "a"), ChildSpec("check", Checker, (journal,)))
    wait_for(lambda: len(journal.of("start")) == 3)
    assert journal.of("start") == ["slow", "a", "check=after its elders"]
    assert rt.cell("check").alive


def test_children_stop_in_reverse_order_with_the_runtime(journal: Journal) -> None:
    rt = Runtime().start()
    rt.spawn("top", Supervisor, SupervisorSpec("top", Strategy.ONE_FOR_ONE,
                                               tuple(workers(journal, "a", "b", "c"))))
    wait_for(lambda: len(journal.of("start")) == 3)
    rt.stop(drain=2)
    assert journal.of("stop") == ["c", "b", "a"]


def test_a_supervisor_refuses_work_it_cannot_route(supervise: Callable[..., Runtime], journal: Journal) -> None:
    rt = supervise(Strategy.ONE_FOR_ONE, *workers(journal, "a"))
    rt.send("top", Note(text="misdirected"))
    assert rt.wait_idle(timeout=10)
    [letter] = rt.dead_letters.letters()
    assert letter.reason == "no handler" and letter.actor == "top"


