"""Scheduled events: stored in SQLite, delivered through the LLM once confirmed sent.

The scheduler checks for due reminders on a timer of the runtime's clock: these tests give
the application a ManualClock and advance it one check at a time (``check``), so no test
waits for a timer in real time."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ask, console_text, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors.kernel import ManualClock
from autoresponse.interfaces.events.scheduler import EVENTS, Tick
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.interfaces.console import Console
from autoresponse.interfaces.events import EventPayload, EventStore, due_in, next_due
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import OriginalContext

CONSOLE = OriginalContext(chat_id="console", message_id=3, interface_name="console",
                          original_command="remind me to stretch")
FAST = {"enabled": True, "check_seconds": 0.1, "unconfirmed_seconds": 3600}


def check(app: Application, clock: ManualClock, times: int = 1) -> None:
    """Let the scheduler check for due reminders ``times`` more times: each time, advance
    the clock to its next tick, and wait until all that the check started has finished."""
    with app.runtime.probe(EVENTS) as seen:
        for n in range(times):
            assert clock.wait_for_sleepers(1), "the scheduler set no timer"
            clock.advance(app.settings.events.check_seconds)
            ticks = wait_for(lambda n=n: [e for e in seen.envelopes if isinstance(e.body, Tick)][n:])
            assert app.runtime.wait_idle(ticks[0].correlation_id, timeout=15), "a check did not finish"


def schedule(data_dir: Path, context: OriginalContext, seconds_from_now: float,
             description: str = "stretch your legs", repeat: str = "none") -> int:
    date, at = due_in(seconds_from_now)
    store = EventStore(data_dir / "events.sqlite3")
    try:
        return store.add(EventPayload(date=date, time=at, repeat=repeat, description=description), context).id
    finally:
        store.close()


def state_of(data_dir: Path, event_id: int) -> Any:
    store = EventStore(data_dir / "events.sqlite3")
    try:
        return store.get(event_id)
    finally:
        store.close()


def test_a_due_event_is_delivered_once_through_the_llm_to_its_chat(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    data = tmp_path / "data"
    event_id = schedule(data, CONSOLE, -5)
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data, clock=manual_clock)
    wait_for(lambda: "Reminder: stretch your legs" in console_text(app))  # the check at the start
    wait_for(lambda: state_of(data, event_id).state == "delivered")
    check(app, manual_clock, times=5)  # several more checks: nothing is sent again
    assert console_text(app).count("Reminder: stretch your legs") == 1
    [message] = system_messages(fake_llm, "event")
    assert message["event"]["description"] == "stretch your legs"
    assert message["original_context"]["chat_id"] == "console"
    assert "↳#3 │ ⏰ Reminder: stretch your legs" in console_text(app)


def test_asking_for_a_reminder_stores_it_and_confirms(make_app: Callable[..., Application], tmp_path: Path) -> None:
    app = make_app(events=FAST, data_dir=tmp_path / "data")
    ask(app, "remind me in 5 minutes to drink water")
    assert "reminder #1 scheduled for" in console_text(app)
    event = state_of(tmp_path / "data", 1)
    assert (event.description, event.state, event.repeat) == ("drink water", "pending", "none")
    assert 4 * 60 < event.due - time.time() <= 5 * 60


def test_an_unconfirmed_event_is_delivered_after_a_restart(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    data = tmp_path / "data"
    event_id = schedule(data, CONSOLE, -90)
    fake_llm.script(FakeResponse(hang=True))  # the LLM never answers before the stop

    def start() -> Application:
        settings = Settings.load(llm={"base_url": fake_llm.base_url, "read_timeout": 30},
                                 events=FAST, data_dir=data, admin={"enabled": False},
                                 runtime={"drain_seconds": 0.5})
        return Application(settings, console=Console(io.StringIO())).start()

    first = start()
    wait_for(lambda: fake_llm.requests)
    first.stop()
    assert state_of(data, event_id).state == "pending"

    second = start()
    try:
        wait_for(lambda: state_of(data, event_id).state == "delivered")
        assert second.console.out.getvalue().count("Reminder: stretch your legs") == 1
        late = system_messages(fake_llm, "event")[-1]["event"]["late_seconds"]
        assert late >= 90
        assert "(I was 1 min late, sorry.)" in second.console.out.getvalue()
    finally:
        second.stop()


def test_a_failed_send_never_marks_an_event_delivered(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    data = tmp_path / "data"
    chat = OriginalContext(chat_id=42, message_id=8, interface_name="telegram", chat_type="private")
    event_id = schedule(data, chat, -5)
    with FakeTelegramServer() as telegram:
        telegram.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user", chat_id=42)
        app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data, clock=manual_clock, telegram={
            "token": "1:TOKEN", "base_url": telegram.base_url, "allowed_users": [7], "poll_timeout": 1})
        # Its turn goes through a re-ask (the retry actor waits before it): the timers fire in turn.
        assert manual_clock.advance_until(lambda: state_of(data, event_id).failures == 1)
        check(app, manual_clock, times=3)  # within its retry backoff (30 s): not tried again
        event = state_of(data, event_id)
        assert (event.state, event.failures) == ("pending", 1)
        assert telegram.sent() == []
        app.stop()


@pytest.mark.parametrize(
    ("repeat", "start", "now", "expected"),
    [
        ("daily", "2026-01-30 09:00", "2026-02-02 10:00", "2026-02-03 09:00"),
        ("weekly", "2026-01-30 09:00", "2026-02-02 10:00", "2026-02-06 09:00"),
        ("monthly", "2026-01-31 09:00", "2026-02-01 10:00", "2026-02-28 09:00"),
        ("none", "2026-01-31 09:00", "2026-02-01 10:00", None),
    ],
)
def test_repeating_events_move_to_their_next_occurrence(repeat: str, start: str, now: str,
                                                        expected: str | None) -> None:
    def ts(text: str) -> float:
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").astimezone().timestamp()

    following = next_due(ts(start), repeat, ts(now))
    assert following == (None if expected is None else ts(expected))


def test_a_reminder_that_keeps_failing_is_retried_a_bounded_number_of_times_then_given_up_once(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    data = tmp_path / "data"
    event_id = schedule(data, CONSOLE, -5)
    fake_llm.script(*[FakeResponse(status=500) for _ in range(50)])  # the LLM is down for good
    app = make_app(base_url=fake_llm.base_url, data_dir=data, llm={"max_attempts": 1}, clock=manual_clock,
                   events={**FAST, "check_seconds": 1, "max_attempts": 3, "retry_min": 5, "retry_max": 10})
    wait_for(lambda: state_of(data, event_id).failures == 1)  # the check at the start
    for _ in range(30):  # tried again once each backoff (5 s, then 10 s) has passed
        check(app, manual_clock)
        if state_of(data, event_id).state == "failed":
            break
    assert state_of(data, event_id).state == "failed"
    check(app, manual_clock, times=20)  # many more checks: nothing more is tried
    event = state_of(data, event_id)
    assert event.failures == 3
    assert len(fake_llm.requests) == 3  # one per try, then no more
    notices = [line for line in console_text(app).splitlines() if "could not deliver your reminder" in line]
    assert len(notices) == 1 and "stretch your legs" in notices[0]
    assert "could not reach the language model" not in console_text(app)  # no notice per failed try
    [letter] = [d for d in app.runtime.dead_letters.letters() if d.reason == "reminder undeliverable"]
    assert "failed 3 times" in letter.detail


def test_a_reminder_for_a_date_this_machine_cannot_represent_is_refused_through_the_llm(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """Year 1 (in any zone) is past what the machine's clock can say: the LLM hears why the
    reminder was refused, and tells its user; nothing crashes, nothing is stored."""
    fake_llm.script(
        FakeResponse(content=json.dumps({"actions": [{"type": "event", "payload": {
            "date": "0001-01-01", "time": "09:00", "description": "stretch"}}]})),
        FakeResponse(content=json.dumps({"actions": [{"type": "message_console", "payload": {
            "text": "I cannot remind you that long ago."}}]})))
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=tmp_path / "data")
    ask(app, "remind me on the first day of year one to stretch")
    [output] = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert output["ok"] is False and "date out of range" in output["output"]
    assert "I cannot remind you that long ago." in console_text(app)
    assert app.runtime.dead_letters.letters() == []
    assert state_of(tmp_path / "data", 1) is None
