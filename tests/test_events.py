"""Scheduled events: stored in SQLite, delivered through the LLM once confirmed sent.

The scheduler checks for due reminders on a timer of the runtime's clock: these tests give
the application a ManualClock and advance it one check at a time (``check``), so no test
waits for a timer in real time."""

from __future__ import annotations

import datetime as dt
import io
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import NatsServer, ask, console_text, system_message, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors import routes
from autoresponse.actors.journal.jetstream import JetStreamJournal
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.kernel.testkit import FaultInjector
from autoresponse.interfaces.events.scheduler import EVENTS, Tick
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.interfaces.events import EventPayload, EventStore, due_in, next_due
from autoresponse.interfaces.events.shared_store import EVENTS_BUCKET, SharedEventStore
from autoresponse.interfaces.events.store import StoredEvent, UnreadableEvent
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import OriginalContext, SendReceipt
from autoresponse.actors.retry import DONE_NOTICE

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


def answers(fake_llm: FakeLLMServer, event: dict[str, Any], then: str) -> None:
    """The LLM answers with this event action, then, given its outcome, says ``then``."""
    fake_llm.script(
        FakeResponse(content=json.dumps({"actions": [{"type": "event", "payload": event}]})),
        FakeResponse(content=json.dumps({"actions": [{"type": "message_console", "payload": {"text": then}}]})))


def state_of(data_dir: Path, event_id: int) -> Any:
    store = EventStore(data_dir / "events.sqlite3")
    try:
        return store.get(event_id)
    finally:
        store.close()


def handed_to_a_slow_llm(make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path,
                         clock: ManualClock) -> tuple[Application, Path, int]:
    """The reminder "take the pill", due, handed out by the check at the start to an LLM
    that takes 4 s to answer its turn: twice ``unconfirmed_seconds``."""
    data = tmp_path / "data"
    event_id = schedule(data, CONSOLE, -5, description="take the pill")
    fake_llm.script(FakeResponse(delay=4.0))
    app = make_app(base_url=fake_llm.base_url, data_dir=data, clock=clock,
                   events={**FAST, "check_seconds": 1, "unconfirmed_seconds": 2, "retry_min": 1, "retry_max": 1})
    wait_for(lambda: fake_llm.requests)
    return app, data, event_id


def delivered_once(app: Application, fake_llm: FakeLLMServer, clock: ManualClock, data: Path,
                   event_id: int) -> None:
    """The reminder "take the pill" is delivered, and stays delivered once: handed to the
    LLM once, shown once, with no failed try, and every turn started has ended."""
    wait_for(lambda: state_of(data, event_id).state == "delivered")
    check(app, clock, times=3)
    assert app.runtime.wait_idle(timeout=15), "a turn did not end"
    assert console_text(app).count("Reminder: take the pill") == 1
    assert len(system_messages(fake_llm, "event")) == 1
    assert state_of(data, event_id).failures == 0


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
    assert "come again" not in notices[0]  # a one-off: it does not
    assert "could not reach the language model" not in console_text(app)  # no notice per failed try
    [letter] = [d for d in app.runtime.dead_letters.letters() if d.reason == "reminder undeliverable"]
    assert "failed 3 times" in letter.detail


def test_a_reminder_for_a_date_this_machine_cannot_represent_is_refused_through_the_llm(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """Year 1 (in any zone) is past what the machine's clock can say: the LLM hears why the
    reminder was refused, and tells its user; nothing crashes, nothing is stored."""
    answers(fake_llm, {"date": "0001-01-01", "time": "09:00", "description": "stretch"},
            "I cannot remind you that long ago.")
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=tmp_path / "data")
    ask(app, "remind me on the first day of year one to stretch")
    [output] = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert output["ok"] is False and "date out of range" in output["output"]
    assert "I cannot remind you that long ago." in console_text(app)
    assert app.runtime.dead_letters.letters() == []
    assert state_of(tmp_path / "data", 1) is None


def test_a_reminder_that_cannot_be_read_is_one_dead_letter_and_the_others_are_delivered(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    data = tmp_path / "data"
    bad = schedule(data, CONSOLE, -10, description="bad one")
    good = schedule(data, CONSOLE, -5, description="drink water")
    db = sqlite3.connect(data / "events.sqlite3")
    try:  # its context damaged (a cut write, a hand edit): it no longer parses
        db.execute("UPDATE events SET context = ? WHERE id = ?", ('{"chat_id": "console"', bad))
        db.commit()
    finally:
        db.close()
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data, clock=manual_clock)
    wait_for(lambda: state_of(data, good).state == "delivered")  # the check at the start
    check(app, manual_clock, times=5)  # more checks: the bad one is not read (nor reported) again
    assert console_text(app).count("Reminder: drink water") == 1
    assert "bad one" not in console_text(app)
    [letter] = [d for d in app.runtime.dead_letters.letters() if d.reason == "unreadable reminder"]
    assert f"reminder #{bad} cannot be read" in letter.detail and "Invalid JSON" in letter.detail
    store = EventStore(data / "events.sqlite3")
    try:
        assert store.get(bad) is None and store.due(time.time()) == []
    finally:
        store.close()


def test_a_shared_reminder_that_cannot_be_read_is_reported_once_and_the_others_still_come_due(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    journal = JetStreamJournal(nats_server.url, node="solo")
    try:
        store = SharedEventStore(journal)
        date, at = due_in(-60)
        bad, good = (store.add(EventPayload(date=date, time=at, description=d), CONSOLE).id
                     for d in ("bad", "good"))
        journal.run(journal.bucket(EVENTS_BUCKET).put(f"event-{bad}", b'{"id": 1, "context": {'))
        first, second = store.due(time.time()), store.due(time.time())
        assert [e.id for e in first] == [bad, good] and isinstance(first[0], UnreadableEvent)
        assert "JSONDecodeError" in first[0].reason
        assert [e.id for e in second] == [good]  # given up: not read, nor reported, again
        assert not isinstance(second[0], UnreadableEvent)
        assert store.get(bad) is None
    finally:
        journal.close()


def test_a_reminder_is_not_handed_out_again_while_its_turn_is_still_under_way(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    """A slow LLM (or a backlog before it): the turn outlasts ``unconfirmed_seconds`` many
    times over, and the reminder still reaches its chat once."""
    app, data, event_id = handed_to_a_slow_llm(make_app, fake_llm, tmp_path, manual_clock)
    check(app, manual_clock, times=10)  # 10 s of checks, on the runtime's clock, while its turn runs
    delivered_once(app, fake_llm, manual_clock, data, event_id)


def test_a_reminder_whose_turn_ends_with_no_word_is_tried_again_then_given_up(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    """Its chat's interface is not running: the turn ends with nothing sent and no receipt;
    ``unconfirmed_seconds`` after that, it counts as a failed try."""
    data = tmp_path / "data"
    chat = OriginalContext(chat_id=42, message_id=8, interface_name="telegram", chat_type="private")
    event_id = schedule(data, chat, -5)
    app = make_app(base_url=fake_llm.base_url, data_dir=data, clock=manual_clock,
                   events={**FAST, "check_seconds": 1, "unconfirmed_seconds": 2, "max_attempts": 2,
                           "retry_min": 1, "retry_max": 1})
    for _ in range(30):
        check(app, manual_clock)
        if state_of(data, event_id).state == "failed":
            break
    event = state_of(data, event_id)
    assert (event.state, event.failures) == ("failed", 2)
    [letter] = [d for d in app.runtime.dead_letters.letters() if d.reason == "reminder undeliverable"]
    assert "no confirmation within 2s" in letter.detail


def test_a_reminder_whose_command_ran_is_not_tried_again_when_its_answer_is_given_up(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    """A reminder's turn runs a command; the LLM then answers nothing about its output,
    however often asked. The reminder was carried out: its user hears so, and it is not
    handed out again, which would run the command again."""
    data = tmp_path / "data"
    event_id = schedule(data, CONSOLE, -5, description="back up the notes")

    def responder(body: dict[str, Any]) -> FakeResponse | None:
        message = system_message(SimpleNamespace(messages=body["messages"]))
        if message is not None and message["type"] == "event":
            return FakeResponse(content=json.dumps({"actions": [
                {"type": "terminal", "payload": {"command": "echo backed-up"}}]}))
        return FakeResponse(content='{"actions": []}')  # the output's turn, and its re-asks

    fake_llm.responder = responder
    app = make_app(base_url=fake_llm.base_url, data_dir=data, clock=manual_clock,
                   runtime={"autonomous_actions": ["terminal"]}, retry={"backoff_min": 0.5, "backoff_max": 1},
                   events={**FAST, "check_seconds": 1, "max_attempts": 3, "retry_min": 1, "retry_max": 1})
    # Its re-asks wait on the clock too: it runs on, timer by timer, until the reminder is settled.
    assert manual_clock.advance_until(lambda: state_of(data, event_id).state != "pending", timeout=30)
    check(app, manual_clock, times=5)  # more checks: nothing is tried again
    assert state_of(data, event_id).state == "delivered"
    assert len(system_messages(fake_llm, "event")) == 1  # handed out once: the command ran once
    assert DONE_NOTICE in console_text(app)
    assert "could not deliver your reminder" not in console_text(app)


def _deliver_each(store: EventStore | SharedEventStore, event_id: int, times: int) -> list[str]:
    """Confirm each occurrence a minute after it is due: the next ones, as local wall times."""
    seen = []
    for _ in range(times):
        event = store.get(event_id)
        assert event is not None
        store.delivered(event_id, event.due, now=event.due + 60)
        following = store.get(event_id)
        assert following is not None
        seen.append(dt.datetime.fromtimestamp(following.due).strftime("%Y-%m-%d %H:%M"))
    return seen


def test_a_monthly_reminder_on_the_31st_comes_on_each_months_last_day_without_drifting(
    tmp_path: Path
) -> None:
    store = EventStore(tmp_path / "events.sqlite3")
    try:
        event = store.add(EventPayload(date=dt.date(2026, 1, 31), time=dt.time(9, 0), repeat="monthly",
                                       description="pay the rent"), CONSOLE)
        assert _deliver_each(store, event.id, 5) == ["2026-02-28 09:00", "2026-03-31 09:00",
                                                     "2026-04-30 09:00", "2026-05-31 09:00",
                                                     "2026-06-30 09:00"]
    finally:
        store.close()


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is Europe/Berlin (daylight saving: 2026-03-29, 2026-10-25)."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.usefixtures("berlin")
@pytest.mark.parametrize(("repeat", "start", "expected"), [
    ("daily", "2026-03-27", ["2026-03-28 09:00", "2026-03-29 09:00", "2026-03-30 09:00"]),
    ("weekly", "2026-10-16", ["2026-10-23 09:00", "2026-10-30 09:00", "2026-11-06 09:00"]),
    ("monthly", "2026-02-15", ["2026-03-15 09:00", "2026-04-15 09:00", "2026-05-15 09:00"]),
])
def test_a_repeating_reminder_keeps_its_local_time_across_a_daylight_saving_change(
    tmp_path: Path, repeat: str, start: str, expected: list[str]
) -> None:
    store = EventStore(tmp_path / "events.sqlite3")
    try:
        event = store.add(EventPayload(date=dt.date.fromisoformat(start), time=dt.time(9, 0), repeat=repeat,
                                       description="take the pill"), CONSOLE)
        assert _deliver_each(store, event.id, 3) == expected
    finally:
        store.close()


def test_a_reminder_for_a_moment_long_past_is_refused_through_the_llm(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """A model that thinks it is still 2023: the reminder would go out at once, years late."""
    answers(fake_llm, {"date": "2023-05-01", "time": "09:00", "description": "dentist"},
            "That day has passed; which date did you mean?")
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=tmp_path / "data")
    ask(app, "remind me on May 1st at 9 to go to the dentist")
    [output] = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert output["ok"] is False
    assert "2023-05-01T09:00" in output["output"] and "already past" in output["output"]
    assert "That day has passed; which date did you mean?" in console_text(app)
    assert "scheduled for" not in console_text(app)
    assert state_of(tmp_path / "data", 1) is None


def test_a_daily_reminder_whose_first_time_today_has_passed_starts_tomorrow(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """"Every day at this time two hours ago": not refused, nor sent at once; from tomorrow."""
    earlier = dt.datetime.now() - dt.timedelta(hours=2)
    answers(fake_llm, {"date": earlier.date().isoformat(), "time": earlier.strftime("%H:%M"),
                       "description": "vitamins", "repeat": "daily"}, "Done: every day.")
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=tmp_path / "data")
    ask(app, "remind me to take my vitamins every day at this time")
    [output] = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    tomorrow = (earlier + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert output["ok"] is True and f"scheduled for {tomorrow}" in output["output"], output


def test_a_monthly_reminder_kept_before_its_first_day_was_stored_stops_drifting(tmp_path: Path) -> None:
    """A row an older release wrote has no first occurrence: from its next delivery on, it
    counts from the day it is due then (the 31st here), not from each shortened month."""
    store = EventStore(tmp_path / "events.sqlite3")
    try:
        context = OriginalContext(chat_id="console", message_id=1, interface_name="console")
        event = store.add(EventPayload(date=dt.date(2026, 1, 31), time=dt.time(9, 0), repeat="monthly",
                                       description="rent"), context)
        store._db.execute("UPDATE events SET first_due = NULL, first_local = NULL")  # as an older release left it
        seen = []
        for _ in range(3):
            due = store.get(event.id).due  # type: ignore[union-attr]
            store.delivered(event.id, due, due + 60)
            seen.append(dt.datetime.fromtimestamp(store.get(event.id).due).strftime("%m-%d"))  # type: ignore[union-attr]
    finally:
        store.close()
    assert seen == ["02-28", "03-31", "04-30"]


# ---------------------------------------------------------------- a crash mid-turn, daylight saving, year 9999


def _local(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment).strftime("%Y-%m-%d %H:%M")


Store = EventStore | SharedEventStore


@pytest.fixture(params=["sqlite", "nats"])
def open_events(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens the reminder store, each time anew (as each run of a daemon does): in SQLite, or
    on NATS (daemons that share a bot)."""
    journal = (JetStreamJournal(request.getfixturevalue("nats_server").url, node="solo")
               if request.param == "nats" else None)
    opened: list[Store] = []

    def open_() -> Store:
        store = EventStore(tmp_path / "events.sqlite3") if journal is None else SharedEventStore(journal)
        opened.append(store)
        return store
    try:
        yield open_
    finally:
        for store in opened:
            store.close()
        if journal is not None:
            journal.close()


def test_a_scheduler_that_crashes_while_a_reminders_turn_runs_does_not_hand_it_out_again(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    """The scheduler crashes (its next check raises) while the LLM is slow to answer the
    reminder's turn; its supervisor restarts it, and the new incarnation, which never saw
    the hand-out, checks on while the turn runs: the reminder reaches its chat once."""
    app, data, event_id = handed_to_a_slow_llm(make_app, fake_llm, tmp_path, manual_clock)
    app.runtime.fault = FaultInjector(actors={EVENTS}, times=1)
    assert manual_clock.advance_until(lambda: app.runtime.cell(EVENTS).restarts == 1)
    check(app, manual_clock, times=5)  # the new incarnation's checks, while the turn runs
    delivered_once(app, fake_llm, manual_clock, data, event_id)


def test_a_scheduler_restarted_after_a_crash_in_a_check_still_checks_once_a_period(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock
) -> None:
    """The check it crashed in is tried again, and the new incarnation checks at its start:
    each sets the next check's timer, but only one stays (else each crash adds a timer)."""
    app = make_app(base_url=fake_llm.base_url, data_dir=tmp_path / "data", clock=manual_clock,
                   events={**FAST, "check_seconds": 1})
    check(app, manual_clock)
    app.runtime.fault = FaultInjector(actors={EVENTS}, times=1)
    assert manual_clock.advance_until(lambda: app.runtime.cell(EVENTS).restarts == 1)
    check(app, manual_clock, times=2)  # both first checks of the new incarnation are past
    assert app.runtime.wait_idle(timeout=15)
    with app.runtime.probe(EVENTS) as seen:
        check(app, manual_clock, times=3)
        assert app.runtime.wait_idle(timeout=15)
        assert len([e for e in seen.envelopes if isinstance(e.body, Tick)]) == 3


def test_a_store_made_by_an_older_release_gains_the_in_turn_mark(tmp_path: Path) -> None:
    """The previous release's table (no mark, no wall time of the first occurrence): opened,
    it is migrated; its reminder can be in turn, and repeats from its first occurrence."""
    path = tmp_path / "events.sqlite3"
    db = sqlite3.connect(path)
    try:
        db.executescript("""
            CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, context TEXT NOT NULL,
                description TEXT NOT NULL, repeat TEXT NOT NULL, due REAL NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending', failures INTEGER NOT NULL DEFAULT 0,
                last_error TEXT, created REAL NOT NULL, next_try REAL, first_due REAL);""")
        first = dt.datetime(2026, 1, 31, 9, 0).timestamp()
        due = dt.datetime(2026, 2, 28, 9, 0).timestamp()  # the rent of January was paid
        db.execute("INSERT INTO events (context, description, repeat, due, created, first_due) "
                   "VALUES (?, 'rent', 'monthly', ?, ?, ?)", (CONSOLE.model_dump_json(), due, first, first))
        db.commit()
    finally:
        db.close()
    store = EventStore(path)
    try:
        store.handed(1, due, "turn-1")
        [event] = store.due(due + 60)
        assert isinstance(event, StoredEvent)
        assert (event.turn, event.turn_by, event.turn_ended) == ("turn-1", store.opening, None)
        store.delivered(1, due, due + 60)
        event = store.get(1)
        assert event is not None and _local(event.due) == "2026-03-31 09:00" and event.turn is None
    finally:
        store.close()


def test_a_reminder_in_turn_is_held_by_the_opening_of_the_store_that_marked_it(
    open_events: Callable[[], Store]
) -> None:
    """Its turn's end is the turn's own; delivered, or counted failed, it is in turn no more;
    and another opening (a later run of the daemon) sees whose mark it is."""
    store = open_events()
    date, at = due_in(-60)
    event = store.add(EventPayload(date=date, time=at, description="stretch"), CONSOLE)
    store.handed(event.id, event.due, "turn-1")
    store.turn_ended(event.id, "turn-0", 100.0)  # an earlier turn's end: not this one's
    marked = store.get(event.id)
    assert marked is not None
    assert (marked.turn, marked.turn_by, marked.turn_ended) == ("turn-1", store.opening, None)
    store.turn_ended(event.id, "turn-1", 200.0)
    assert store.get(event.id).turn_ended == 200.0  # type: ignore[union-attr]
    later = open_events()
    assert later.opening != store.opening and later.get(event.id).turn_by == store.opening  # type: ignore[union-attr]
    store.failed(event.id, event.due, "no word", max_attempts=5, retry_in=0, now=time.time())
    failed = store.get(event.id)
    assert failed is not None and (failed.turn, failed.turn_by, failed.turn_ended) == (None, None, None)
    store.handed(event.id, event.due, "turn-2")
    store.delivered(event.id, event.due, time.time())
    delivered = store.get(event.id)
    assert delivered is not None and (delivered.state, delivered.turn) == ("delivered", None)


@pytest.mark.usefixtures("berlin")
@pytest.mark.parametrize(("repeat", "expected"), [
    ("daily", ["2026-03-30 02:30", "2026-03-31 02:30", "2026-04-01 02:30"]),
    ("weekly", ["2026-04-05 02:30", "2026-04-12 02:30", "2026-04-19 02:30"]),
    ("monthly", ["2026-04-29 02:30", "2026-05-29 02:30", "2026-06-29 02:30"]),
])
def test_a_reminder_first_set_at_a_time_the_clocks_skip_keeps_that_time_after(
    open_events: Callable[[], Store], repeat: str, expected: list[str]
) -> None:
    """02:30 on the day Berlin's clocks go from 02:00 to 03:00: that day at 03:30 (02:30 read
    with the offset before the change, as iCalendar reads it: never before the time asked),
    then 02:30, as asked."""
    store = open_events()
    event = store.add(EventPayload(date=dt.date(2026, 3, 29), time=dt.time(2, 30), repeat=repeat,
                                   description="take the pill"), CONSOLE)
    assert _local(event.due) == "2026-03-29 03:30"
    assert _deliver_each(store, event.id, 3) == expected


@pytest.mark.parametrize(("repeat", "date"), [("daily", "9999-12-31"), ("weekly", "9999-12-27"),
                                              ("monthly", "9999-12-15")])
def test_a_reminder_whose_next_time_is_past_year_9999_finishes_once_delivered(
    open_events: Callable[[], Store], repeat: str, date: str
) -> None:
    store = open_events()
    event = store.add(EventPayload(date=dt.date.fromisoformat(date), time=dt.time(9, 0), repeat=repeat,
                                   description="centennial"), CONSOLE)
    ended = store.delivered(event.id, event.due, event.due + 60)
    assert ended is not None and "date out of range" in ended
    assert store.get(event.id).state == "delivered"  # type: ignore[union-attr]


def test_a_monthly_reminder_past_year_9999_is_delivered_once_and_ends_with_a_log_line(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path,
    caplog: pytest.LogCaptureFixture
) -> None:
    """December 9999's comes due (the runtime's clock says so): it goes out, and the reminder
    ends there, named in the log; no crash, and it is not sent again and again."""
    data = tmp_path / "data"
    store = EventStore(data / "events.sqlite3")
    try:
        event = store.add(EventPayload(date=dt.date(9999, 12, 15), time=dt.time(9, 0), repeat="monthly",
                                       description="the last rent"), CONSOLE)
    finally:
        store.close()
    clock = ManualClock(wall=event.due + 60)
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data, clock=clock)
    wait_for(lambda: state_of(data, event.id).state == "delivered")
    check(app, clock, times=5)
    assert console_text(app).count("Reminder: the last rent") == 1
    assert [d for d in app.runtime.dead_letters.letters() if d.reason == "crash"] == []
    assert f"reminder #{event.id} (the last rent) repeats no more: date out of range" in caplog.text


# ---------------------------------------------------------------- given up once, a receipt not ours, a damaged row


@pytest.fixture(params=["sqlite", "nats"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``make_app``'s settings for where its reminders are kept: SQLite (one daemon), or NATS
    (daemons that share a bot: the scheduler hands out once it holds the reminders' lease).
    A test asks for it before ``make_app``, so that its NATS server stops after the apps."""
    if request.param == "sqlite":
        return {}
    return {"journal": {"backend": "nats"}, "nats": {"url": request.getfixturevalue("nats_server").url}}


def handing_out(app: Application) -> bool:
    """The app's scheduler hands reminders out (on NATS: it holds the reminders' lease), so
    that each check the clock is advanced for is one that can."""
    incarnation = app.runtime.cell(EVENTS).incarnation
    scheduler = incarnation() if incarnation is not None else None
    shared = getattr(scheduler, "_shared", None)
    return scheduler is not None and (shared is None or shared.holding)


def _reminder_out(app: Application, clock: ManualClock, text: str, checks: int = 80) -> None:
    """Check (one ``check_seconds`` at a time) until ``text`` is on the console."""
    for _ in range(checks):
        if text in console_text(app):
            return
        check(app, clock)
    raise AssertionError(f"{text!r} never came")


@pytest.mark.parametrize(("retry", "days"), [(60.0, 1), (13 * 3600.0, 2)],
                         ids=["next-day", "next-day-past-by-then"])
def test_a_repeating_reminder_given_up_once_comes_again_at_its_next_time(
    backend: dict[str, Any], make_app: Callable[..., Application], fake_llm: FakeLLMServer,
    manual_clock: ManualClock, retry: float, days: int
) -> None:
    """Every day: the LLM is down for its first occurrence's three tries (an hour apart; or,
    with a backoff of 13 hours, given up more than a day after, when the next day's time is
    past too). That occurrence is given up, once (a notice saying when it comes again, a
    dead letter); the reminder is not: it comes at its next time still to come, and goes out."""
    fake_llm.script(*[FakeResponse(status=500) for _ in range(3)])  # then the LLM is back
    app = make_app(base_url=fake_llm.base_url, llm={"max_attempts": 1}, clock=manual_clock, **backend,
                   events={**FAST, "check_seconds": 3600, "max_attempts": 3, "retry_min": retry,
                           "retry_max": retry})
    wait_for(lambda: handing_out(app))
    store = app.resource("events")
    date, at = due_in(-5)
    first = store.add(EventPayload(date=date, time=at, repeat="daily", description="take your pills"),
                      CONSOLE)
    _reminder_out(app, manual_clock, "could not deliver your reminder")
    check(app, manual_clock)  # one more: nothing more of it is tried
    assert len(system_messages(fake_llm, "event")) == 3
    later = store.get(first.id)
    wall = dt.datetime.fromtimestamp(first.due)
    assert (later.state, later.failures, later.turn) == ("pending", 0, None)
    assert _local(later.due) == (wall + dt.timedelta(days=days)).strftime("%Y-%m-%d %H:%M")
    [notice] = [line for line in console_text(app).splitlines() if "could not deliver your reminder" in line]
    assert f"(take your pills) due {first.due_text}" in notice
    assert f"It will come again at its next time, {later.due_text}." in notice
    [letter] = [d for d in app.runtime.dead_letters.letters() if d.reason == "reminder undeliverable"]
    assert "failed 3 times" in letter.detail
    assert letter.record["body"]["event"]["due"] == first.due_text  # the occurrence given up
    _reminder_out(app, manual_clock, "Reminder: take your pills")  # the LLM is back: it goes out
    wait_for(lambda: store.get(first.id).due != later.due)
    assert console_text(app).count("Reminder: take your pills") == 1
    after = store.get(first.id)
    assert (after.state, after.failures) == ("pending", 0)
    assert _local(after.due) == (wall + dt.timedelta(days=days + 1)).strftime("%Y-%m-%d %H:%M")


def test_an_occurrence_given_up_moves_a_repeating_reminder_on_and_ends_a_one_off(
    open_events: Callable[[], Store]
) -> None:
    """Its last try fails thirty hours after it was due: a daily one's next time (the day
    after) is past too, so it moves on to the one after that; a one-off has failed."""
    store = open_events()
    daily, once = (store.add(EventPayload(date=dt.date(2026, 1, 30), time=dt.time(9, 0), repeat=repeat,
                                          description=repeat), CONSOLE) for repeat in ("daily", "none"))
    for event in (daily, once):
        late = event.due + 30 * 3600
        store.handed(event.id, event.due, "turn-1")
        tried = store.failed(event.id, event.due, "the LLM is down", max_attempts=2, retry_in=60,
                             now=late - 60)
        assert tried is not None and not tried.given_up and tried.event.failures == 1
        store.handed(event.id, event.due, "turn-2")
        given_up = store.failed(event.id, event.due, "the LLM is down", max_attempts=2, retry_in=60, now=late)
        assert given_up is not None and given_up.given_up and given_up.ended is None
        again = store.failed(event.id, event.due, "a late word", max_attempts=2, retry_in=60, now=late)
        assert again is None  # that occurrence is done with: not counted again
    moved, failed = store.get(daily.id), store.get(once.id)
    assert moved is not None and failed is not None
    assert (_local(moved.due), moved.state, moved.failures, moved.next_try, moved.turn) == \
        ("2026-02-01 09:00", "pending", 0, None, None)
    assert (failed.state, failed.failures, failed.due, failed.turn) == ("failed", 2, once.due, None)


# Not as ``_key`` makes them: "1@1" (it says 1.0), "1@ 1.0"; an id past SQLite's, or none at all.
@pytest.mark.parametrize("key", ["not-ours", "", "@", "7", "x@1.0", "1@2@3", "1@1", "1@ 1.0",
                                 "99999999999999999999@1.0", "-1@1.0"])
def test_a_send_receipt_whose_key_is_not_a_reminders_is_logged_and_ignored(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock,
    caplog: pytest.LogCaptureFixture, key: str
) -> None:
    """A receipt meant for no reminder (another's, a damaged one): the scheduler does not
    crash on it (restarted, it would meet it again), and the reminders go out as before."""
    data = tmp_path / "data"
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data, clock=manual_clock)
    for ok in (True, False):
        envelope = app.runtime.send(EVENTS, SendReceipt(key=key, ok=ok, detail="sent"))
        assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, timeout=15)
    assert app.runtime.cell(EVENTS).restarts == 0
    assert [d for d in app.runtime.dead_letters.letters() if d.reason == "crash"] == []
    assert f"a send receipt for no reminder (key {key!r}): ignored" in caplog.text
    event_id = schedule(data, CONSOLE, -5)
    check(app, manual_clock)
    wait_for(lambda: state_of(data, event_id).state == "delivered")
    assert console_text(app).count("Reminder: stretch your legs") == 1


def _write(store: Store, event_id: int, **columns: Any) -> None:
    """Write a stored reminder's ``columns`` as given (a hand edit, a damaged row)."""
    if isinstance(store, EventStore):
        for column, value in columns.items():
            store._db.execute(f"UPDATE events SET {column} = ? WHERE id = ?", (value, event_id))
        return
    key = f"event-{event_id}"
    value = json.loads(store._journal.run(store._raw(key)))
    store._journal.run(store._kv.put(key, json.dumps({**value, **columns}).encode()))


@pytest.mark.parametrize("first_local", ["every day", "2026-13-45T09:00:00", "2026-01-30T09:00:00+01:00", 42])
def test_a_reminder_whose_stored_first_time_is_damaged_repeats_as_an_older_row_and_says_so_once(
    open_events: Callable[[], Store], caplog: pytest.LogCaptureFixture, first_local: Any
) -> None:
    """Its first occurrence's local wall time is no local date and time (a hand edit): it
    repeats from its first occurrence's moment (an older row's ``first_due``), or the one due
    now's; delivered or given up, it moves on, and the warning comes once."""
    store = open_events()
    events = [store.add(EventPayload(date=dt.date(2026, 1, 30), time=dt.time(9, 0), repeat="daily",
                                     description=f"pills {n}"), CONSOLE) for n in range(3)]
    first_due = dt.datetime(2026, 1, 29, 8, 0).timestamp()  # an older row's first occurrence: at 8
    for event in events:
        _write(store, event.id, first_local=first_local)
    _write(store, events[2].id, first_due=first_due)
    store.delivered(events[0].id, events[0].due, events[0].due + 60)
    store.failed(events[1].id, events[1].due, "the LLM is down", max_attempts=1, retry_in=60,
                 now=events[1].due + 60)
    store.delivered(events[2].id, events[2].due, events[2].due + 60)
    assert [_local(store.get(e.id).due) for e in events] == [  # type: ignore[union-attr]
        "2026-01-31 09:00", "2026-01-31 09:00", "2026-01-31 08:00"]
    for event in events:
        assert caplog.text.count(f"reminder #{event.id}: its first time") == 1
    caplog.clear()
    following = ["2026-02-01 09:00", "2026-02-01 09:00", "2026-02-01 08:00"]
    for event, expected in zip(events, following, strict=True):
        moved = store.get(event.id)  # it counts from the time found, kept: nothing more to say
        assert moved is not None
        store.delivered(event.id, moved.due, moved.due + 60)
        assert _local(store.get(event.id).due) == expected  # type: ignore[union-attr]
    assert "its first time" not in caplog.text


def test_a_reminder_whose_stored_first_time_is_damaged_is_delivered_without_a_crash(
    backend: dict[str, Any], make_app: Callable[..., Application], fake_llm: FakeLLMServer,
    manual_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Its receipt no longer crashes the scheduler (every receipt of it did): it goes out
    once, moves on to tomorrow, and the log says once what was wrong with it."""
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock, **backend,
                   events={**FAST, "check_seconds": 1})
    wait_for(lambda: handing_out(app))
    store = app.resource("events")
    date, at = due_in(-5)
    event = store.add(EventPayload(date=date, time=at, repeat="daily", description="take your pills"),
                      CONSOLE)
    _write(store, event.id, first_local="yesterday at nine")
    _reminder_out(app, manual_clock, "Reminder: take your pills")
    wait_for(lambda: store.get(event.id).due != event.due)
    check(app, manual_clock, times=3)
    assert app.runtime.cell(EVENTS).restarts == 0
    assert [d for d in app.runtime.dead_letters.letters() if d.reason == "crash"] == []
    moved = store.get(event.id)
    assert (moved.state, moved.failures) == ("pending", 0)
    tomorrow = dt.datetime.fromtimestamp(event.due) + dt.timedelta(days=1)
    assert _local(moved.due) == tomorrow.strftime("%Y-%m-%d %H:%M")
    assert caplog.text.count(f"reminder #{event.id}: its first time 'yesterday at nine' is not") == 1


# ---------------------------------------------------------------- a time with a UTC offset, a store that fails


@pytest.mark.usefixtures("berlin")
@pytest.mark.parametrize(("asked", "first", "then"), [
    ("09:00Z", "2026-03-28T10:00+01:00", "2026-03-29 10:00"),
    ("09:00+02:00", "2026-03-28T08:00+01:00", "2026-03-29 08:00"),
])
def test_a_repeating_reminder_asked_with_a_utc_offset_is_stored_at_that_moments_local_time(
    backend: dict[str, Any], make_app: Callable[..., Application], fake_llm: FakeLLMServer,
    asked: str, first: str, then: str
) -> None:
    """"Every day at 9 UTC", asked after 9 UTC (13:00 in Berlin) and first dated yesterday:
    the model gives the time with an offset. It is that moment's local time (09:00Z is 10:00
    in Berlin in winter), from the next one still to come, and keeps that local time across
    the change to summer time; the user hears so, and nothing crashes (it crashed the
    executor three times, and nothing was stored)."""
    clock = ManualClock(wall=dt.datetime(2026, 3, 27, 12, 0, tzinfo=dt.timezone.utc).timestamp())
    answers(fake_llm, {"date": "2026-03-26", "time": asked, "repeat": "daily", "description": "take the pill"},
            "Every day, then.")
    app = make_app(base_url=fake_llm.base_url, events=FAST, clock=clock, **backend)
    ask(app, "remind me every day at 9 UTC to take the pill", clock=clock)
    [output] = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert output["ok"] is True, output
    assert f"scheduled for {first}, repeating daily" in output["output"]
    assert "Every day, then." in console_text(app)
    assert app.runtime.dead_letters.letters() == []
    assert app.runtime.cell(routes.executor("event")).restarts == 0
    store = app.resource("events")
    event = store.get(1)
    assert event is not None and (event.description, event.state) == ("take the pill", "pending")
    store.delivered(event.id, event.due, event.due + 60)
    assert _local(store.get(event.id).due) == then  # summer time: the same local time


def test_a_store_that_fails_a_reminder_fails_that_action_and_the_next_chats_reminder_is_stored(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, tmp_path: Path,
    caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses one write with an error the executor does not expect (SQLite says
    the disk is full): that action fails, named, and its user hears so through the LLM; the
    executor does not crash (three restarts, a dead letter, every chat's reminders held up
    meanwhile), and another chat's reminder asked next is stored at once."""
    data = tmp_path / "data"
    EventStore(data / "events.sqlite3").close()
    db = sqlite3.connect(data / "events.sqlite3")
    try:
        db.execute("CREATE TRIGGER no_room BEFORE INSERT ON events WHEN NEW.description = 'renew the passport' "
                   "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
        db.commit()
    finally:
        db.close()
    tomorrow = (dt.date.today() + dt.timedelta(days=1)).isoformat()
    answers(fake_llm, {"date": tomorrow, "time": "10:00", "description": "renew the passport"},
            "I could not set that reminder.")
    answers(fake_llm, {"date": tomorrow, "time": "11:00", "description": "call the dentist"}, "Set for tomorrow.")
    app = make_app(base_url=fake_llm.base_url, events=FAST, data_dir=data)
    for chat, text in (("A", "remind me tomorrow at 10 to renew my passport"),
                       ("B", "remind me tomorrow at 11 to call the dentist")):
        envelope = app.runtime.send("interface.console", ConsoleInput(text=text, chat_id=chat))
        assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, 15), f"{chat} did not finish"
    failed, stored = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert failed["ok"] is False
    assert "could not be stored (IntegrityError: database or disk is full)" in failed["output"]
    assert "I could not set that reminder." in console_text(app)
    assert stored["ok"] is True and "reminder #1 scheduled for" in stored["output"]
    assert "Set for tomorrow." in console_text(app)
    assert app.runtime.cell(routes.executor("event")).restarts == 0
    assert app.runtime.dead_letters.letters() == []
    event = state_of(data, 1)
    assert (event.description, event.context.chat_id) == ("call the dentist", "B")
    logged = [r for r in caplog.records if "storing the reminder" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # its traceback, once
