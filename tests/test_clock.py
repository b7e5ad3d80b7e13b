"""The runtime's one clock: a ManualClock moves only when a test advances it, and every
timer of the runtime (``schedule``, deadlines, timestamps) waits on it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from pydantic import BaseModel

from autoresponse.actors.kernel import Clock, IoTask, ManualClock, Runtime, TypedActor, handles
from autoresponse.actors.kernel.testkit import Recorder, running
from autoresponse.messages import Crash, Envelope


class Start(BaseModel):
    seconds: float
    with_cause: bool = True


class CallOff(BaseModel):
    pass


class Tick(BaseModel):
    pass


class Rang(BaseModel):
    pass


class Alarm(TypedActor):
    """On Start, sets a timer (part of the work, or a tick of its own); on CallOff, cancels
    it; when it rings, tells the sink."""

    def __init__(self) -> None:
        super().__init__()
        self.timer: IoTask | None = None

    @handles
    def on_set(self, start: Start, env: Envelope) -> None:
        self.timer = self.schedule(start.seconds, Tick(), cause=env if start.with_cause else None)

    @handles
    def on_call_off(self, call_off: CallOff, env: Envelope) -> None:
        self.cancel(self.timer)

    @handles
    def on_tick(self, tick: Tick, env: Envelope) -> None:
        self.send("sink", Rang(), cause=env)


class Ticker(TypedActor):
    """Ticks itself every 10 s of its runtime's clock, from setup on."""

    def setup(self) -> None:
        self.schedule(10, Tick())

    @handles
    def on_tick(self, tick: Tick, env: Envelope) -> None:
        self.schedule(10, Tick())


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll a condition (something happening in another thread), not a timer."""
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, "condition not met in time"
        time.sleep(0.005)


async def test_a_manual_clock_wakes_its_sleepers_in_due_order_only_when_advanced() -> None:
    clock = ManualClock(start=50.0, wall=1_000.0)
    woke: list[str] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(f"{name}@{clock.monotonic():g}")

    tasks = [asyncio.create_task(nap(name, seconds))
             for name, seconds in (("c", 3), ("a", 1), ("b1", 2), ("b2", 2))]
    while clock.sleepers < 4:
        await asyncio.sleep(0)
    assert clock.next_due() == 51.0 and clock.pending() == [1.0, 2.0, 2.0, 3.0]
    for _ in range(5):
        await asyncio.sleep(0)
    assert woke == []  # real time passes; the clock does not
    assert clock.advance(0.5) == 0
    assert clock.advance(1.5) == 3  # now 52: a, then the two due at 52 in the order they slept
    await asyncio.gather(*tasks[1:])
    assert woke == ["a@52", "b1@52", "b2@52"]
    assert not tasks[0].done() and clock.sleepers == 1
    assert (clock.monotonic(), clock.time()) == (52.0, 1_002.0)
    # Advanced from another thread, as a test advances a runtime's clock.
    threading.Thread(target=clock.advance, args=(10,)).start()
    await tasks[0]
    assert woke[-1] == "c@62" and clock.sleepers == 0
    with pytest.raises(ValueError):
        clock.advance(-1)


async def test_a_cancelled_sleep_leaves_the_clock_and_a_zero_sleep_waits_for_nothing() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(5))
    while clock.sleepers == 0:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.sleepers == 0 and clock.next_due() is None
    await asyncio.wait_for(clock.sleep(0), timeout=5)  # no advance needed
    assert clock.monotonic() == 0.0


def test_advance_until_fires_a_chain_of_timers_in_turn() -> None:
    """A flow whose timers the test does not count one by one: each sets the next."""
    clock = ManualClock()
    with running(("ticker", Ticker), clock=clock) as rt:
        with rt.probe("ticker") as ticks:
            assert clock.advance_until(lambda: len(ticks.bodies(Tick)) >= 3)
            assert clock.monotonic() == 30.0  # three ticks, 10 s apart, and no further
            assert not clock.advance_until(lambda: False, timeout=0.05)


@pytest.mark.parametrize("with_cause", [True, False], ids=["part of the work", "a tick of its own"])
def test_a_scheduled_message_arrives_only_after_the_clock_is_advanced(with_cause: bool) -> None:
    clock = ManualClock()
    with running(("alarm", Alarm), ("sink", Recorder), clock=clock) as rt:
        assert rt.clock is clock
        with rt.probe("sink") as sink:
            env = rt.send("alarm", Start(seconds=30, with_cause=with_cause))
            assert env is not None
            assert clock.wait_for_sleepers(1)
            clock.advance(29.9)
            assert clock.sleepers == 1 and sink.envelopes == []
            # A timer that is part of the work keeps it in flight while it waits.
            wait_until(lambda: rt.inflight.count(env.correlation_id) == (1 if with_cause else 0))
            clock.advance(0.1)
            rang = sink.expect(Rang, timeout=10)
            assert (rang.correlation_id == env.correlation_id) is with_cause
            assert rt.wait_idle(timeout=10)


@pytest.mark.parametrize("with_cause", [True, False], ids=["part of the work", "a tick of its own"])
def test_a_cancelled_timer_never_fires(with_cause: bool) -> None:
    clock = ManualClock()
    with running(("alarm", Alarm), ("sink", Recorder), clock=clock) as rt:
        with rt.probe("sink") as sink:
            rt.send("alarm", Start(seconds=30, with_cause=with_cause))
            assert clock.wait_for_sleepers(1)
            rt.send("alarm", CallOff())
            wait_until(lambda: clock.sleepers == 0)  # its sleep was cancelled
            assert rt.wait_idle(timeout=10)  # the work stopped waiting for it
            clock.advance(3600)
            rt.send("alarm", Tick())  # handled after anything the advance could have caused
            assert sink.expect(Rang, timeout=10) is not None
            assert rt.wait_idle(timeout=10)
            assert len(sink.bodies(Rang)) == 1  # only the one sent by hand
        assert rt.dead_letters.letters() == []


def test_a_restarted_incarnations_timers_die_with_it_on_a_manual_clock() -> None:
    clock = ManualClock()
    with running(("ticker", Ticker), clock=clock) as rt:
        assert clock.wait_for_sleepers(1)
        for n in range(3):
            rt.send("ticker", Crash(reason=f"drill {n}"))
            wait_until(lambda n=n: rt.cell("ticker").restarts == n + 1)
        # Each incarnation set a timer as it started; only the last one's is left.
        wait_until(lambda: rt.cell("ticker").alive and clock.sleepers == 1)
        with rt.probe("ticker") as ticks:
            clock.advance(10)
            ticks.expect(Tick, timeout=10)
            wait_until(lambda: clock.sleepers == 1)  # the tick set the next timer
            assert len(ticks.bodies(Tick)) == 1  # one chain of ticks, not four
            clock.advance(10)
            wait_until(lambda: len(ticks.bodies(Tick)) == 2 and clock.sleepers == 1)


def test_deadlines_dead_letters_and_traces_read_the_runtimes_clock() -> None:
    gate = threading.Event()
    clock = ManualClock(wall=1_000_000.0)

    class Gated(TypedActor):
        @handles
        def on_set(self, start: Start, env: Envelope) -> None:
            assert gate.wait(10)

    with running(("gated", Gated), clock=clock) as rt:
        rt.send("gated", Start(seconds=0))  # holds the actor while the next waits
        late = rt.send("gated", Start(seconds=0), timeout=5)
        assert late is not None and late.deadline == 1_000_005.0
        clock.advance(6)  # past its deadline before it is handled: no real time passed
        gate.set()
        assert rt.wait_idle(timeout=10)
        [letter] = rt.dead_letters.letters()
        assert (letter.reason, letter.time) == ("deadline", 1_000_006.0)
        hops = rt.trace(late.correlation_id)
        assert hops and hops[0]["queued"] == 1_000_000.0


def test_the_real_clock_moves() -> None:
    clock = Clock()
    first = clock.monotonic()
    until = time.monotonic() + 5
    while clock.monotonic() == first:
        assert time.monotonic() < until, "the monotonic clock did not move"
    assert clock.monotonic() > first
    assert abs(clock.time() - time.time()) < 5
    asyncio.run(asyncio.wait_for(clock.sleep(0.001), timeout=5))
    assert Runtime().clock.__class__ is Clock  # the default: real time
