"""The actor kernel: typed handlers, stable names, mailboxes, dead letters, I/O."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import ClassVar

import pykka
import pytest
from pydantic import BaseModel

from autoresponse.actors.kernel import ManualClock, OverflowPolicy, Runtime, TypedActor, handles
from autoresponse.actors.kernel.testkit import Recorder, running
from autoresponse.messages import Envelope


class Ping(BaseModel):
    n: int


class Pong(BaseModel):
    n: int


class Echo(TypedActor):
    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.send("sink", Pong(n=ping.n), cause=env)


class EitherWay(TypedActor):
    @handles
    def on_either(self, message: Ping | Pong, env: Envelope) -> None:
        self.send("sink", Pong(n=message.n * 10), cause=env)


class Gated(TypedActor):
    """Waits on a gate for each message, raises on n == 2, forwards the rest."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        assert self.gate.wait(10)
        if ping.n == 2:
            raise ValueError("two is bad")
        self.send("sink", Pong(n=ping.n), cause=env)


class Bouncer(TypedActor):
    def __init__(self, other: str) -> None:
        super().__init__()
        self.other = other

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.send(self.other, Ping(n=ping.n + 1), cause=env)


class Sleeper(TypedActor):
    """Hands work to the event loop and forwards what comes back."""

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.run_io(self._later(ping.n), cause=env)

    async def _later(self, n: int) -> Pong:
        await asyncio.sleep(0.01)
        if n < 0:
            raise ConnectionError("negative")
        return Pong(n=n)

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        self.send("sink", Pong(n=pong.n + 1000 * (threading.current_thread() is not threading.main_thread())),
                  cause=env)


class FailsToStart(TypedActor):
    def setup(self) -> None:
        raise OSError("no such device")


def test_handlers_are_chosen_by_message_class() -> None:
    with running(("echo", Echo), ("either", EitherWay), ("sink", Recorder)) as rt:
        with rt.probe("sink") as sink:
            rt.send("echo", Ping(n=1))
            rt.send("either", Ping(n=2))
            rt.send("either", Pong(n=3))
            assert rt.wait_idle(timeout=10)
            assert sorted(p.n for p in sink.bodies(Pong)) == [1, 20, 30]


def test_an_unknown_message_class_is_a_dead_letter_not_a_silent_no_op() -> None:
    with running(("echo", Echo), ("sink", Recorder)) as rt:
        env = rt.send("echo", "not a ping")
        assert rt.wait_idle(timeout=10)
        [letter] = rt.dead_letters.letters()
        assert letter.reason == "no handler"
        assert letter.actor == "echo"
        assert letter.envelope.message_id == env.message_id
        assert "str" in letter.detail


def test_a_crash_dead_letters_the_message_and_keeps_the_queue_in_order() -> None:
    gate = threading.Event()
    with running(("gated", Gated, gate), ("sink", Recorder)) as rt:
        cell = rt.cell("gated")
        with rt.probe("sink") as sink:
            for n in range(1, 6):
                rt.send("gated", Ping(n=n))
            gate.set()
            assert rt.wait_idle(timeout=10)
            # Everything behind the crash was handled, in order, by the new incarnation.
            assert [p.n for p in sink.bodies(Pong)] == [1, 3, 4, 5]
        [letter] = rt.dead_letters.letters()
        assert letter.reason == "crash"
        assert letter.error == "ValueError: two is bad"
        assert letter.envelope.body == Ping(n=2)
        assert cell.restarts == 1
        assert cell.last_failure is not None and cell.last_failure.type == "ValueError"
        # The name is stable: it still reaches the restarted actor.
        assert rt.cell("gated") is cell and cell.alive
        with rt.probe("sink") as sink:
            rt.send("gated", Ping(n=7))
            assert sink.expect(Pong, timeout=10).body.n == 7


def test_a_full_mailbox_holds_the_overflow_and_drops_nothing() -> None:
    gate = threading.Event()
    with running(("sink", Recorder)) as rt:
        rt.spawn("gated", Gated, gate, capacity=2)
        with rt.probe("sink") as sink:
            sent = [rt.send("gated", Ping(n=n)) for n in (1, 3, 4, 5, 6)]
            # One is being handled (blocked on the gate), two fit, the rest are held over capacity.
            time.sleep(0.2)
            gate.set()
            assert rt.wait_idle(timeout=10)
            assert all(s is not None for s in sent)
            assert [p.n for p in sink.bodies(Pong)] == [1, 3, 4, 5, 6]
        assert rt.dead_letters.letters() == []
        assert rt.cell("gated").mailbox.overflowed >= 2


def test_a_blocking_mailbox_makes_the_sender_wait_for_room() -> None:
    gate = threading.Event()
    with running(("sink", Recorder)) as rt:
        rt.spawn("gated", Gated, gate, capacity=1, overflow=OverflowPolicy.BLOCK, block_seconds=10)
        with rt.probe("sink") as sink:
            done = threading.Event()

            def producer() -> None:
                for n in (1, 3, 4, 5):
                    rt.send("gated", Ping(n=n))
                done.set()

            thread = threading.Thread(target=producer)
            thread.start()
            assert not done.wait(0.3), "the sender should be held back by the full mailbox"
            gate.set()
            thread.join(10)
            assert rt.wait_idle(timeout=10)
            assert [p.n for p in sink.bodies(Pong)] == [1, 3, 4, 5]
        assert rt.dead_letters.letters() == []


def test_a_blocking_mailbox_stops_waiting_but_still_takes_the_letter() -> None:
    gate = threading.Event()
    with running(("sink", Recorder)) as rt:
        rt.spawn("gated", Gated, gate, capacity=1, overflow=OverflowPolicy.BLOCK, block_seconds=0.1)
        rt.send("gated", Ping(n=1))
        time.sleep(0.1)  # the first is being handled
        rt.send("gated", Ping(n=3))
        assert rt.send("gated", Ping(n=4)) is not None  # waited 0.1 s for room, then queued anyway
        gate.set()
        assert rt.wait_idle(timeout=10)
        assert rt.dead_letters.letters() == []


def test_a_blocking_mailbox_never_holds_up_the_event_loop() -> None:
    """Every actor's I/O completes on the loop's thread: a send from there to a full mailbox
    is queued at once, where any other thread would wait ``block_seconds`` for room."""
    gate = threading.Event()
    with running(("sink", Recorder)) as rt:
        rt.spawn("gated", Gated, gate, capacity=1, overflow=OverflowPolicy.BLOCK, block_seconds=30)
        rt.send("gated", Ping(n=1))
        time.sleep(0.1)  # the first is being handled
        rt.send("gated", Ping(n=3))  # the lane is full now

        async def from_the_loop() -> float:
            started = time.monotonic()
            rt.send("gated", Ping(n=4))
            return time.monotonic() - started

        waited = rt.io.run(from_the_loop(), timeout=60)
        gate.set()
        assert waited < 5, f"the loop's thread waited {waited:.1f} s for room"
        assert rt.wait_idle(timeout=10)
        assert rt.cell("gated").mailbox.overflowed >= 1
        assert rt.dead_letters.letters() == []


class Holder(TypedActor):
    """Waits on a gate for each message and keeps its number; sends nothing on."""

    def __init__(self, gate: threading.Event, handled: list[int]) -> None:
        super().__init__()
        self.gate, self.handled = gate, handled

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        assert self.gate.wait(10)
        self.handled.append(ping.n)


def test_a_stop_interrupts_what_is_still_queued_and_dead_letters_nothing() -> None:
    """The message in hand finishes; the two queued behind it are interrupted, not lost.

    (It once forwarded to a sink and counted on the sink handling that forward before
    its own stop signal: a race between two legal outcomes, since a stop jumps ahead of
    queued work. The holder now ends its work itself, so the count is exact.)"""
    gate, handled = threading.Event(), []
    rt = Runtime().start()
    rt.spawn("holder", Holder, gate, handled)
    accepted = [rt.accept("holder", Ping(n=n)).result(5) for n in (1, 3, 4)]
    wait_until(lambda: len(rt.cell("holder").mailbox) == 2)  # the first is in hand, two wait

    def open_the_gate_once_stopping() -> None:  # the one in hand finishes during the stop
        wait_until(lambda: rt.cell("holder").stop_requested)
        gate.set()

    opener = threading.Thread(target=open_the_gate_once_stopping)
    opener.start()
    assert rt.stop(drain=0.05) is False
    opener.join(10)
    assert handled == [1]
    # A stop is a pause, not a failure: nothing was dead-lettered ...
    assert rt.dead_letters.letters() == []
    assert rt.inflight.count() == 0
    # ... and the two still queued are left unfinished, to resume with a journal.
    assert rt.intake.unfinished_here() == 2
    assert len(accepted) == 3


def test_a_looping_chain_ends_at_the_hop_limit() -> None:
    with running(("ping", Bouncer, "pong"), ("pong", Bouncer, "ping"), runtime=Runtime(max_hops=12)) as rt:
        env = rt.send("ping", Ping(n=0))
        assert rt.wait_idle(env.correlation_id, timeout=10)
        [letter] = rt.dead_letters.letters()
        assert letter.reason == "hop limit"
        assert letter.envelope.hops == 13
        assert letter.correlation_id == env.correlation_id


def test_expired_work_is_skipped_and_dead_lettered() -> None:
    gate, clock = threading.Event(), ManualClock()
    with running(("gated", Gated, gate), ("sink", Recorder), clock=clock) as rt:
        with rt.probe("sink") as sink:
            rt.send("gated", Ping(n=1))
            rt.send("gated", Ping(n=3), timeout=0.05)
            clock.advance(0.2)  # its deadline passes while the first is in hand
            gate.set()
            assert rt.wait_idle(timeout=10)
            assert [p.n for p in sink.bodies(Pong)] == [1]
        assert [d.reason for d in rt.dead_letters.letters()] == ["deadline"]


def test_io_results_come_back_as_messages_in_the_actor_thread() -> None:
    with running(("sleeper", Sleeper), ("sink", Recorder)) as rt:
        with rt.probe("sink") as sink:
            env = rt.send("sleeper", Ping(n=5))
            pong = sink.expect(Pong, timeout=10)
            # 1005: handled off the main thread, in the sleeper's own thread.
            assert pong.body.n == 1005
            assert pong.correlation_id == env.correlation_id
            assert rt.wait_idle(timeout=10)


def test_an_io_error_crashes_the_actor_with_its_message() -> None:
    with running(("sleeper", Sleeper), ("sink", Recorder)) as rt:
        env = rt.send("sleeper", Ping(n=-1))
        assert rt.wait_idle(timeout=10)
        [letter] = rt.dead_letters.letters()
        assert (letter.reason, letter.error) == ("crash", "ConnectionError: negative")
        assert letter.envelope.message_id == env.message_id


def test_an_actor_that_fails_to_start_is_stopped_and_refuses_work() -> None:
    with running(("broken", FailsToStart)) as rt:
        cell = rt.cell("broken")
        deadline = time.monotonic() + 10
        while cell.state != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cell.state == "stopped"
        assert cell.last_failure is not None and cell.last_failure.message == "no such device"
        assert rt.send("broken", Ping(n=1)) is None
        assert [d.reason for d in rt.dead_letters.letters()] == ["actor stopped"]


def test_actors_only_start_inside_a_runtime() -> None:
    with pytest.raises(RuntimeError, match="Runtime.spawn"):
        Echo.start()
    assert pykka.ActorRegistry.get_all() == []


def test_names_are_unique() -> None:
    with running(("sink", Recorder)) as rt:
        with pytest.raises(ValueError, match="already exists"):
            rt.spawn("sink", Recorder)


def test_an_actor_may_not_shadow_pykkas_machinery() -> None:
    with pytest.raises(TypeError, match=r"must not define \['_stop'\]"):

        class Shadowing(TypedActor):
            async def _stop(self) -> None:
                pass


def test_io_still_running_at_shutdown_ends_as_cancelled() -> None:
    from autoresponse.actors.kernel._loop import EventLoopThread, IoTask

    loop = EventLoopThread()
    loop.start()
    ended: dict[str, threading.Event] = {"never": threading.Event(), "done": threading.Event()}
    never = loop.submit(asyncio.sleep(3600), lambda task: ended["never"].set())
    done = loop.submit(asyncio.sleep(0, result="ok"), lambda task: ended["done"].set())
    assert ended["done"].wait(5) and done.outcome() == "ok"
    loop.stop()
    assert ended["never"].is_set()  # its owner heard of it: nothing ends in silence
    with pytest.raises(asyncio.CancelledError):
        never.outcome()
    assert isinstance(never, IoTask)


class Tick(BaseModel):
    pass


class Ticker(TypedActor):
    """Ticks itself every 20 ms from setup, as the reminder scheduler does."""

    def setup(self) -> None:
        self.schedule(0.02, Tick())

    @handles
    def on_tick(self, tick: Tick, env: Envelope) -> None:
        self.schedule(0.02, Tick())


def ticks_in(rt: Runtime, clock: ManualClock, name: str, steps: int) -> int:
    """The ticks ``name`` gets while its clock moves on 20 ms at a time, ``steps`` times."""
    with rt.probe(name) as probe:
        for step in range(steps):
            wait_until(lambda: clock.sleepers >= 1)  # the next tick is set
            clock.advance(0.02)
            wait_until(lambda step=step: len(probe.bodies(Tick)) > step)
        wait_until(lambda: clock.sleepers >= 1)
        return len(probe.bodies(Tick))


def test_a_timer_dies_with_the_incarnation_that_started_it() -> None:
    """Restarting a self-ticking actor three times leaves its tick rate unchanged
    (the old incarnations' timer chains are cancelled, not left running)."""
    from autoresponse.messages import Crash

    clock = ManualClock()
    with running(("ticker", Ticker), clock=clock) as rt:
        before = ticks_in(rt, clock, "ticker", 10)
        for n in range(3):
            rt.send("ticker", Crash(reason=f"drill {n}"))
            wait_until(lambda n=n: rt.cell("ticker").restarts == n + 1)
        wait_until(lambda: rt.cell("ticker").alive and clock.sleepers == 1)  # one chain is left
        after = ticks_in(rt, clock, "ticker", 10)
        assert clock.sleepers == 1
    assert before == after == 10, f"{before} ticks in 10 steps before the restarts, {after} after"


class Slow(TypedActor):
    """Starts a long call per Ping; crashes on Pong."""

    started: ClassVar[list[int]] = []
    cancelled: ClassVar[list[int]] = []

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.run_io(self._call(ping.n), cause=env)

    async def _call(self, n: int) -> None:
        Slow.started.append(n)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            Slow.cancelled.append(n)
            raise

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        raise ValueError("pong crashes me")


def test_io_dies_with_its_incarnation_and_its_work_is_taken_up_again() -> None:
    Slow.started.clear()
    Slow.cancelled.clear()
    with running(("slow", Slow)) as rt:
        rt.send("slow", Ping(n=1))
        wait_until(lambda: Slow.started == [1])
        rt.send("slow", Pong(n=0))
        # The crash cancelled the call, and the next incarnation started it again.
        wait_until(lambda: Slow.started == [1, 1] and Slow.cancelled == [1])
        assert rt.inflight.count() == 1  # the ping is still work in flight; the pong is a dead letter
        assert [d.reason for d in rt.dead_letters.letters()] == ["crash"]
    assert Slow.cancelled == [1, 1]  # and the stop cancelled the second one: nothing outlives it


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, "condition not met in time"
        time.sleep(0.01)


class HoldsAndWaits(TypedActor):
    """Holds each Ping and also starts a long call for it (as the builder holds an output
    and times its batch); crashes on Pong."""

    handled: ClassVar[list[int]] = []

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        HoldsAndWaits.handled.append(ping.n)
        self.hold(env)
        self.run_io(asyncio.sleep(3600), cause=env)
        self.run_io(asyncio.sleep(3600), cause=env)

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        raise ValueError("pong crashes me")


def test_work_held_and_waited_on_twice_is_taken_up_once_after_a_crash() -> None:
    HoldsAndWaits.handled.clear()
    with running(("holder", HoldsAndWaits)) as rt:
        ping = rt.send("holder", Ping(n=1))
        assert ping is not None
        wait_until(lambda: HoldsAndWaits.handled == [1])
        rt.send("holder", Pong(n=0))
        wait_until(lambda: HoldsAndWaits.handled == [1, 1])
        time.sleep(0.2)
        assert HoldsAndWaits.handled == [1, 1]  # once more, not once per task and hold
        # Three claims on it (a hold, two calls) are still one message in flight.
        assert rt.inflight.count(ping.correlation_id) == 3


def test_a_serving_daemon_sets_its_garbage_collector() -> None:
    """A daemon, once started (``autoresponse run``), freezes its startup heap, so a full
    collection walks only what was made since (collected garbage first: nothing is frozen
    for ever that was garbage already), and collects its young garbage less often."""
    import gc
    import weakref

    from autoresponse.actors.kernel import tune_heap_for_serving
    from autoresponse.actors.kernel.heap import YOUNG_COLLECTION_THRESHOLD

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    garbage = weakref.ref(Cycle())
    before = gc.get_threshold()
    try:
        frozen = tune_heap_for_serving()
        assert frozen == gc.get_freeze_count() > 0
        assert garbage() is None
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class AsksItsStatusOnRestart(TypedActor):
    """Its setup after a crash asks the event loop for the status, as /healthz reads it
    there (a Telegram poller's setup needs the loop for its first call)."""

    seen: ClassVar[list[bool]] = []

    def setup(self) -> None:
        if self.cell.restarts:
            from autoresponse.supervisors.status import snapshot

            async def status() -> bool:
                return snapshot(self.runtime, details=False).find(self.name) is not None

            AsksItsStatusOnRestart.seen.append(self.runtime.io.run(status(), timeout=20))


def test_the_status_answers_while_a_restarted_actor_sets_up_on_the_event_loop() -> None:
    """A restart waits for the new incarnation's setup without holding the cell: the
    status read on the event loop (``/healthz``) while that setup needs the loop does not
    wait for it, and the setup does not wait for the status (they hung each other 30s)."""
    from autoresponse.messages import Crash

    AsksItsStatusOnRestart.seen = []
    with running(("asker", AsksItsStatusOnRestart)) as rt:
        rt.send("asker", Crash(reason="drill"))
        wait_until(lambda: AsksItsStatusOnRestart.seen == [True], timeout=20)  # hung 30s before
        wait_until(lambda: rt.cell("asker").alive)


class Counts(TypedActor):
    """Counts its pings in its cell's book, and crashes on a negative one."""

    class Tally:
        def __init__(self) -> None:
            self.pings: list[int] = []

    def __init__(self) -> None:
        super().__init__()
        self.tally = self.cell.book(Counts.Tally)

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        if ping.n < 0:
            raise ValueError("negative")
        self.tally.pings.append(ping.n)


def test_what_an_actor_keeps_in_its_cells_book_outlives_its_crashes() -> None:
    """The book is the cell's, not the incarnation's: the one after a crash reads what the
    ones before wrote (a conversation's turns, the builder's batches)."""
    with running(("counter", Counts)) as rt:
        for n in (1, -1, 2, -2, 3):
            rt.send("counter", Ping(n=n))
        wait_until(lambda: rt.cell("counter").book(Counts.Tally).pings == [1, 2, 3])
        assert rt.cell("counter").restarts >= 2


class SendsThenWaits(TypedActor):
    """Asks to hear when its work finishes, sends two Pongs, then waits on a gate."""

    def __init__(self, entered: threading.Event, gate: threading.Event) -> None:
        super().__init__()
        self.entered, self.gate = entered, gate

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.runtime.when_finished(env.correlation_id, "finished", Pong(n=ping.n))
        self.send("sink", Pong(n=1), cause=env)
        self.send("sink", Pong(n=2), cause=env)
        self.entered.set()
        assert self.gate.wait(10)
        if ping.n < 0:
            raise ValueError("negative")


@pytest.mark.parametrize("n", [7, -7], ids=["returns", "crashes"])
def test_a_handlers_sends_go_out_when_it_returns_and_its_work_finishes_once_after(n: int) -> None:
    """What a handler sends leaves, in order, when it returns (or fails: nothing it sent
    is lost); the work is not finished while the handler runs, even where what it sent
    would be handled at once, and it finishes exactly once."""
    entered, gate = threading.Event(), threading.Event()
    with running(("sender", SendsThenWaits, entered, gate), ("sink", Recorder), ("finished", Recorder)) as rt:
        with rt.probe("sink") as sink, rt.probe("finished") as finished:
            env = rt.send("sender", Ping(n=n))
            assert env is not None and entered.wait(10)
            assert not rt.wait_idle(env.correlation_id, timeout=0.2)  # its handler still runs
            assert sink.bodies(Pong) == [] and finished.bodies(Pong) == []
            gate.set()
            assert rt.wait_idle(env.correlation_id, timeout=10)
            assert [p.n for p in sink.bodies(Pong)] == [1, 2]
            wait_until(lambda: finished.bodies(Pong) != [])
            assert rt.wait_idle(timeout=10)
            assert [p.n for p in finished.bodies(Pong)] == [n]
        assert [d.reason for d in rt.dead_letters.letters()] == ([] if n > 0 else ["crash"])


class CallsOffItsCall(TypedActor):
    """Starts a long call for a Ping, calls it off in the same handler, sends a Pong."""

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.runtime.when_finished(env.correlation_id, "finished", Pong(n=ping.n))
        task = self.run_io(asyncio.sleep(3600), cause=env)
        self.cancel(task)
        self.send("sink", Pong(n=ping.n), cause=env)


class GatedSink(TypedActor):
    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        assert self.gate.wait(10)


def test_a_call_called_off_in_its_handler_leaves_the_work_in_flight_until_what_it_sent_is_handled() -> None:
    gate = threading.Event()
    with running(("caller", CallsOffItsCall), ("sink", GatedSink, gate), ("finished", Recorder)) as rt:
        with rt.probe("sink") as sink, rt.probe("finished") as finished:
            env = rt.send("caller", Ping(n=3))
            assert env is not None
            wait_until(lambda: sink.bodies(Pong) != [])
            assert rt.inflight.count(env.correlation_id) == 1  # the Pong, held up by the gate
            assert finished.bodies(Pong) == []  # (it would be here already, had the call-off ended the work)
            gate.set()
            assert rt.wait_idle(env.correlation_id, timeout=10)
            wait_until(lambda: finished.bodies(Pong) != [])
            assert rt.wait_idle(timeout=10) and rt.dead_letters.letters() == []


def test_the_runtime_runs_its_io_on_uvloop_unless_told_asyncio() -> None:
    """uvloop's loop where installed (a dependency everywhere but Windows): the loop thread
    carries every delivery's I/O; ``event_loop="asyncio"`` (the setting
    ``AUTORESPONSE_RUNTIME__EVENT_LOOP``) asks for asyncio's."""
    from autoresponse.config import Settings

    uvloop = pytest.importorskip("uvloop")
    assert Settings().runtime.event_loop == "uvloop"
    with running(("sleeper", Sleeper), ("sink", Recorder)) as rt:
        assert isinstance(rt.io.loop, uvloop.Loop)
        with rt.probe("sink") as sink:
            rt.send("sleeper", Ping(n=4))
            assert sink.expect(Pong).body.n == 1004  # its I/O ran there and came back
    with running(("sleeper", Sleeper), ("sink", Recorder), runtime=Runtime(event_loop="asyncio")) as rt:
        assert isinstance(rt.io.loop, asyncio.SelectorEventLoop) and not isinstance(rt.io.loop, uvloop.Loop)
        with rt.probe("sink") as sink:
            rt.send("sleeper", Ping(n=5))
            assert sink.expect(Pong).body.n == 1005


class SendsToNobodyThenOn(TypedActor):
    """Sends to an actor that does not exist, then to the sink."""

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.runtime.when_finished(env.correlation_id, "finished", Pong(n=ping.n))
        self.send("nobody", Pong(n=0), cause=env)
        self.send("sink", Pong(n=ping.n), cause=env)


def test_a_dead_lettered_send_does_not_end_the_work_that_goes_on() -> None:
    """The first of two messages a handler sent cannot be delivered (a dead letter): the
    work goes on with the second, and finishes once, when the second has been handled."""
    gate = threading.Event()
    with running(("sender", SendsToNobodyThenOn), ("sink", GatedSink, gate), ("finished", Recorder)) as rt:
        with rt.probe("sink") as sink, rt.probe("finished") as finished:
            env = rt.send("sender", Ping(n=8))
            assert env is not None
            wait_until(lambda: sink.bodies(Pong) != [])
            assert rt.inflight.count(env.correlation_id) == 1 and finished.bodies(Pong) == []
            gate.set()
            assert rt.wait_idle(timeout=10)
            assert [p.n for p in finished.bodies(Pong)] == [8]
        assert [d.reason for d in rt.dead_letters.letters()] == ["no such actor"]


class SendsFromItsCoroutine(TypedActor):
    """Its handler starts a coroutine that sends for the same work, and waits until the
    sink has that message before it returns."""

    def __init__(self, arrived: threading.Event) -> None:
        super().__init__()
        self.arrived = arrived

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.run_io(self._send_soon(env), cause=env)
        assert self.arrived.wait(10), "a send from the loop waited for the handler"

    async def _send_soon(self, env: Envelope) -> None:
        self.send("sink", Pong(n=1), cause=env)


def test_a_coroutine_sends_at_once_even_while_its_handler_runs() -> None:
    """Only the handler's own thread holds its sends back: a coroutine of the same work
    sends from the loop at once, with a count of its own."""
    arrived = threading.Event()
    with running(("sender", SendsFromItsCoroutine, arrived), ("sink", Recorder)) as rt:
        stop = rt.watch("sink", lambda env: arrived.set())
        try:
            env = rt.send("sender", Ping(n=1))
            assert env is not None and rt.wait_idle(env.correlation_id, timeout=15)
            assert arrived.is_set() and rt.dead_letters.letters() == [] and rt.inflight.count() == 0
        finally:
            stop()


class Forwarder(TypedActor):
    @handles
    def on_anything(self, message: Pong, env: Envelope) -> None:
        self.send("sink", Pong(n=message.n), cause=env)


class SendsThenReports(TypedActor):
    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.send("sink", Pong(n=1), cause=env)
        self.report_error(Pong(n=2), cause=env)
        time.sleep(0.2)  # room for an error sent at once to overtake the reply


def test_an_error_a_handler_reports_goes_out_after_what_it_sent_before() -> None:
    with running(("sender", SendsThenReports), ("router", Forwarder), ("sink", Recorder)) as rt:
        rt.error_route = "router"
        with rt.probe("sink") as sink:
            rt.send("sender", Ping(n=1))
            assert rt.wait_idle(timeout=10)
            assert [p.n for p in sink.bodies(Pong)] == [1, 2]


class Lingers(TypedActor):
    """Handles each Ping for ``seconds``, unstoppable meanwhile."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        time.sleep(self.seconds)


def test_an_actor_busy_past_the_stop_ends_once_it_is_done() -> None:
    """The runtime stops waiting for an actor still in a handler, and closes its mailbox (its
    stop letter goes with what was queued): back for its next message, it ends, rather than
    sleep for ever on a mailbox nobody will put to again, holding the process open."""
    rt = Runtime().start()
    rt.spawn("lingers", Lingers, 1.0)
    rt.spawn("idle", Recorder)
    wait_until(lambda: rt.cell("idle").alive)
    rt.close(rt.cell("idle"))  # asleep on its empty mailbox as it closes: it ends too
    wait_until(lambda: not any(t.name.startswith("Recorder") for t in threading.enumerate()), timeout=5)
    rt.send("lingers", Ping(n=1))
    wait_until(lambda: rt.cell("lingers").mailbox.empty())  # in its handler now
    rt.stop(drain=0.1)
    wait_until(lambda: not any(t.name.startswith("Lingers") for t in threading.enumerate()), timeout=5)


def test_an_envelope_asked_through_pykka_waits_its_turn() -> None:
    """pykka's ``ask`` with an envelope is work like any other: handled after what was queued
    before it, counted in flight, and answered."""
    gate = threading.Event()
    with running(("gated", Gated, gate), ("sink", Recorder)) as rt, rt.probe("sink") as sink:
        first = rt.send("gated", Ping(n=1))
        assert first is not None
        rt.send("gated", Ping(n=3), correlation_id=first.correlation_id)
        ref = rt.cell("gated")._ref
        assert ref is not None
        answer = ref.ask(first.child(Ping(n=5)), block=False)
        gate.set()
        assert answer.get(timeout=10) is None
        wait_until(lambda: len(sink.bodies(Pong)) == 3)
        assert [pong.n for pong in sink.bodies(Pong)] == [1, 3, 5]
        assert rt.wait_idle(timeout=5) and rt.inflight.count() == 0  # counted in flight, as any work


class FailsOnAskThenItsTaskEnds(TypedActor):
    """Raises on each Ping; on a Pong starts a task that ends at once (which crashes it)."""

    handled: ClassVar[list[int]] = []

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        FailsOnAskThenItsTaskEnds.handled.append(ping.n)
        raise ValueError("no")

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        self.start_task(asyncio.sleep(0), "brief")


def test_an_error_handed_back_to_an_asker_is_not_the_next_crash_of_the_actor() -> None:
    """An envelope asked through pykka whose handler raises: the asker gets the error and the
    actor lives on. A later crash of the actor (here its task ending) is not charged to that
    envelope, which would then be dead-lettered, or retried and handled again."""
    FailsOnAskThenItsTaskEnds.handled.clear()
    with running(("asked", FailsOnAskThenItsTaskEnds)) as rt:
        ref = rt.cell("asked")._ref
        assert ref is not None
        asked = Envelope.new(Ping(n=7))
        with pytest.raises(ValueError):
            ref.ask(asked, timeout=10)
        rt.send("asked", Pong(n=0))
        wait_until(lambda: rt.cell("asked").last_failure is not None)
        assert "brief" in rt.cell("asked").last_failure.message  # type: ignore[union-attr]
        assert [d for d in rt.dead_letters.letters() if d.correlation_id == asked.correlation_id] == []
        assert FailsOnAskThenItsTaskEnds.handled == [7]
        assert rt.wait_idle(timeout=5)  # and it is no longer work in flight


class IoSeen:
    """What ``OutlivesItsStop`` saw: which incarnation handled each ``Ping``, and the most
    of its I/Os that ran at once."""

    def __init__(self) -> None:
        self.by: list[tuple[int, int]] = []
        self.running = self.most = 0


class OutlivesItsStop(TypedActor):
    """One I/O at a time. ``Ping(n=0)``: starts a short I/O, then waits for ``gate`` past any
    stop; any other ``Ping``: a longer I/O only. Each I/O's ``Pong`` goes to the sink."""

    io_limit = 1

    def __init__(self, gate: threading.Event, seen: IoSeen) -> None:
        super().__init__()
        self.gate, self.seen = gate, seen

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.seen.by.append((id(self), ping.n))
        self.run_io(self._work(ping.n), cause=env)
        if ping.n == 0:
            assert self.gate.wait(10)

    async def _work(self, n: int) -> Pong:
        seen = self.seen
        seen.running += 1
        seen.most = max(seen.most, seen.running)
        await asyncio.sleep(0.01 if n == 0 else 0.2)
        seen.running -= 1
        return Pong(n=n)

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        self.send("sink", pong, cause=env)


def test_a_stop_that_gives_up_on_a_busy_actor_leaves_the_mailbox_to_its_successor() -> None:
    """A handler runs on past its stop's timeout and the cell starts again, as a supervisor
    restarts one: the stop meant for the old incarnation does not stop the new one; the old
    one, back from its handler, takes nothing more from the mailbox and ends; the result of
    an I/O it started, queued as the stop gave up, is handled by the new one, which still
    runs one I/O at a time."""
    gate, seen = threading.Event(), IoSeen()
    with running(("slow", OutlivesItsStop, gate, seen), ("sink", Recorder)) as rt, rt.probe("sink") as sink:
        cell = rt.cell("slow")
        old = cell.incarnation() if cell.incarnation is not None else None
        rt.send("slow", Ping(n=0))
        wait_until(lambda: seen.by == [(id(old), 0)] and len(cell.mailbox) == 1)  # its I/O ended meanwhile
        assert not cell.stop(timeout=0.1)  # still in its handler
        cell.start()
        new = cell.incarnation()
        assert new is not None and new is not old
        wait_until(lambda: [pong.n for pong in sink.bodies(Pong)] == [0])  # the old one's I/O, handled
        gate.set()
        wait_until(lambda: old is not None and old.actor_stopped.is_set())
        for n in range(1, 7):
            rt.send("slow", Ping(n=n))
        assert rt.wait_idle(timeout=10)
        assert cell.alive and not new.actor_stopped.is_set()
        assert seen.by[1:] == [(id(new), n) for n in range(1, 7)]
        assert sorted(pong.n for pong in sink.bodies(Pong)) == list(range(7))
        assert seen.most == 1


class StopsItself(TypedActor):
    """``Ping(n=0)``: waits for ``gate``, then stops itself (pykka's ``Actor.stop``). The
    incarnations counted in ``seen["slow_setups"]`` (1 the first) wait in their ``setup``
    for ``setup_gate``. ``seen`` records each one's start and teardown, and who handled what."""

    def __init__(self, gate: threading.Event, setup_gate: threading.Event, seen: dict[str, list[int]]) -> None:
        super().__init__()
        self.gate, self.setup_gate, self.seen = gate, setup_gate, seen

    def setup(self) -> None:
        self.seen["started"].append(id(self))
        if len(self.seen["started"]) in self.seen["slow_setups"]:
            assert self.setup_gate.wait(10)

    def teardown(self) -> None:
        self.seen["teardowns"].append(id(self))

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.seen["handled"].append(id(self))
        if ping.n == 0:
            assert self.gate.wait(10)
            self.stop()


def test_a_let_go_incarnation_answers_its_stops_as_it_ends_and_its_own_stop_touches_nothing_else() -> None:
    """Let go by a stop that timed out, an incarnation stops itself once back from its
    handler: whoever waits on its stop is answered, nothing of it is left in the mailbox,
    its teardown runs once, and the next incarnation runs on."""
    gate, setup_gate = threading.Event(), threading.Event()
    setup_gate.set()
    seen: dict[str, list[int]] = {"started": [], "teardowns": [], "handled": [], "slow_setups": []}
    with running(("quits", StopsItself, gate, setup_gate, seen)) as rt:
        cell = rt.cell("quits")
        old, ref = cell.incarnation(), cell._ref
        assert old is not None and ref is not None
        rt.send("quits", Ping(n=0))
        wait_until(lambda: seen["handled"] == [id(old)])
        answers: list[object] = []
        waiter = threading.Thread(target=lambda: answers.append(ref.stop(block=True, timeout=10)))
        waiter.start()
        assert not cell.stop(timeout=0.1)
        gate.set()
        waiter.join(10)
        assert answers == [True] and old.actor_stopped.is_set()
        assert len(cell.mailbox) == 0 and seen["teardowns"] == [id(old)]
        cell.start()
        new = cell.incarnation()
        rt.send("quits", Ping(n=1))
        wait_until(lambda: seen["handled"][-1:] == [id(new)])
        assert cell.alive and new is not None and not new.actor_stopped.is_set()


def test_an_incarnation_let_go_in_its_setup_never_reads_the_mailbox() -> None:
    """A stop that timed out while the incarnation was still in its ``setup``, and the cell
    started again meanwhile: once set up, the old one ends at once, so its successor is the
    mailbox's only reader, and a stop of the successor stops it."""
    gate, setup_gate = threading.Event(), threading.Event()
    gate.set()
    seen: dict[str, list[int]] = {"started": [], "teardowns": [], "handled": [], "slow_setups": [2]}
    rt = Runtime().start()
    try:
        cell = rt.spawn("quits", StopsItself, gate, setup_gate, seen)
        assert cell.stop(timeout=5)
        cell.start(wait=0.1)  # still in its setup
        wait_until(lambda: len(seen["started"]) == 2)
        old = cell.incarnation()
        assert old is not None and not cell.stop(timeout=0.1)
        cell.start()  # its successor, which finds the old one's stop first
        new = cell.incarnation()
        assert new is not None and new is not old
        setup_gate.set()
        wait_until(old.actor_stopped.is_set)  # set up, and gone before it took anything
        for n in range(1, 6):
            rt.send("quits", Ping(n=n))
        assert rt.wait_idle(timeout=10)
        assert seen["handled"] == [id(new)] * 5
        assert cell.stop(timeout=5) and new.actor_stopped.is_set()
    finally:
        rt.stop(drain=0.5)


class StartsIoLate(TypedActor):
    """``Ping``: its first handling waits for ``gate``, then starts its I/O; the I/O's
    ``Pong`` goes to the sink. ``handled`` records each handling's incarnation."""

    def __init__(self, gate: threading.Event, handled: list[int]) -> None:
        super().__init__()
        self.gate, self.handled = gate, handled

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.handled.append(id(self))
        if len(self.handled) == 1:
            assert self.gate.wait(10)
        self.run_io(self._work(ping.n), cause=env)

    async def _work(self, n: int) -> Pong:
        return Pong(n=n)

    @handles
    def on_pong(self, pong: Pong, env: Envelope) -> None:
        self.send("sink", pong, cause=env)


def test_io_a_let_go_handler_starts_goes_to_its_successor_not_nowhere() -> None:
    """A handler let go by a stop starts its I/O once back: a let-go incarnation runs
    nothing more, so its message goes back to the mailbox and its successor handles it,
    rather than the I/O being dropped with nothing to say so."""
    gate, handled = threading.Event(), []
    with running(("late", StartsIoLate, gate, handled), ("sink", Recorder)) as rt, rt.probe("sink") as sink:
        cell = rt.cell("late")
        rt.send("late", Ping(n=7))
        wait_until(lambda: len(handled) == 1)
        assert not cell.stop(timeout=0.1)
        cell.start()
        new = cell.incarnation()
        gate.set()
        wait_until(lambda: [pong.n for pong in sink.bodies(Pong)] == [7])
        assert rt.wait_idle(timeout=10)
        assert new is not None and handled == [handled[0], id(new)]
        assert rt.inflight.count() == 0 and not rt.dead_letters.letters()
