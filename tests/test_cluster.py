"""Several daemons serve one bot through NATS JetStream: a real nats-server (from the
venv, on 127.0.0.1, JetStream on a temp dir), real daemons, the fake Bot API and LLM.

Real time: the daemons are real processes (killed, restarted) and the NATS server's
leases, acknowledgement waits and redeliveries run on its clock, so no ManualClock here."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, NatsServer, actors, send_chunks, wait_for

from autoresponse.actors.journal.jetstream import DEAD_SUBJECT, WORK_SUBJECT, JetStreamJournal, kv_key
from autoresponse.actors.journal.shared_memory import SharedConversationStore
from autoresponse.actors.routes import interface
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.interfaces.events import EventPayload, due_in
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import Envelope, OriginalContext, UserRequest

ALLOWED = 7


def request(chat: int, text: str) -> UserRequest:
    return UserRequest(text=text, context=OriginalContext(chat_id=chat, message_id=1, interface_name="telegram"))


def test_the_journal_dedupes_by_id_and_shares_send_keys_traces_and_dead_letters(nats_server: NatsServer) -> None:
    one = JetStreamJournal(nats_server.url, node="one")
    two = JetStreamJournal(nats_server.url, node="two")
    try:
        first = Envelope.new(request(1, "hello"), correlation_id="telegram-1-100")
        assert one.accept(first, actor="llm").result(5) is True
        assert two.accept(first, actor="llm").result(5) is False  # a second poller's copy
        assert not two.was_sent("k#0")
        one.mark_sent("k#0").result(5)
        assert two.was_sent("k#0")  # any worker sees what another sent
        one.record_trace("c1", [{"actor": "llm"}]).result(5)
        assert two.trace("c1") == [{"actor": "llm"}] and two.trace("c2") is None
        one.record_dead_letter({"id": 5, "time": 1.0, "reason": "crash"}).result(5)
        assert [d["reason"] for d in two.dead_letters(10)] == ["crash"]
        assert two.dead_letter(5)["node"] == "one" and two.dead_letter_counts() == {"crash": 1}
        assert one.last_dead_letter_id() != two.last_dead_letter_id()  # each numbers its own
        assert two.status()["pending"] == 1
    finally:
        one.close()
        two.close()


def test_a_damaged_dead_letter_or_trace_on_the_server_is_left_out(nats_server: NatsServer) -> None:
    journal = JetStreamJournal(nats_server.url, node="one")
    try:
        journal.record_dead_letter({"id": 5, "time": 1.0, "reason": "crash"}).result(5)

        async def damage() -> None:  # what another version, or a hand, could have put there
            for junk in (b"not json", b"[" * 100_000, b"[1, 2]"):
                await journal._js.publish(DEAD_SUBJECT, junk)
            await journal._traces.put(kv_key("c1"), b"not json")
        journal.run(damage())
        assert [d["id"] for d in journal.dead_letters(10)] == [5]
        assert journal.trace("c1") is None
    finally:
        journal.close()


def test_work_on_the_stream_that_cannot_run_is_a_dead_letter_and_leaves_the_stream(
        tmp_path: Path, nats_server: NatsServer) -> None:
    """What another version, or a hand, published: an item whose payload no actor reads, and
    a message that is no item at all. Each becomes a dead letter holding it as it came, with
    why, and leaves the stream; the work behind them still runs."""
    journal = JetStreamJournal(nats_server.url, node="publisher")
    broken = {"correlation": "telegram-1-1", "actor": interface("telegram"), "type": "TelegramText",
              "payload": "not json"}
    try:
        async def publish() -> None:
            await journal._js.publish(f"{WORK_SUBJECT}.broken", json.dumps(broken).encode())
            await journal._js.publish(f"{WORK_SUBJECT}.junk", b"\xff junk, no item")
        journal.run(publish())
    finally:
        journal.close()
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        daemon = cluster_daemon(tmp_path, "a", nats_server, llm, telegram).start()
        try:
            telegram.push_text("hello", chat_id=7, user_id=ALLOWED, message_id=1)
            wait_for(lambda: len(telegram.sent()) == 1, timeout=60)

            def letters() -> list[dict[str, Any]]:
                return json.loads(daemon.cli("deadletters", "list", "--json").stdout)["letters"]
            wait_for(lambda: len(letters()) == 2, timeout=30)
            found = {letter["envelope"]["correlation_id"]: letter for letter in letters()}
        finally:
            assert daemon.stop() == 0
    assert all(letter["reason"] == "unreadable work item" for letter in found.values())
    item = found["telegram-1-1"]
    assert item["actor"] == interface("telegram") and item["envelope"]["body"] == {"raw": "not json"}
    assert item["detail"].startswith("TelegramText: cannot run it: its payload is unreadable")
    [junk] = [letter for correlation, letter in found.items() if correlation.startswith("nats-")]
    assert junk["envelope"]["body"] == {"raw": "\ufffd junk, no item"}
    assert junk["detail"].startswith("it is no work item (ValidationError")
    reader = JetStreamJournal(nats_server.url, node="reader")
    try:
        assert reader.status()["pending"] == 0  # both taken off the stream
    finally:
        reader.close()


def test_an_item_larger_than_the_server_takes_is_refused_at_the_door(nats_server: NatsServer) -> None:
    journal = JetStreamJournal(nats_server.url, node="one")
    try:
        huge = Envelope.new(request(1, "x" * 1_100_000), correlation_id="inject-huge")
        with pytest.raises(ValueError, match="larger than the NATS server takes"):
            journal.accept(huge, actor="llm")
        small = Envelope.new(request(1, "hello"), correlation_id="inject-small")
        assert journal.accept(small, actor="llm").result(5) is True  # nothing else held up
        assert journal.status()["pending"] == 1
    finally:
        journal.close()


def test_only_one_daemon_holds_a_lease_and_another_takes_it_when_released(nats_server: NatsServer) -> None:
    # A TTL of 3 s, renewed every second: a stall of the holder's renewals would need two
    # seconds to lose it (at 1 s, a 0.7 s stall of a loaded machine did).
    one = JetStreamJournal(nats_server.url, node="one", lease_seconds=3.0)
    two = JetStreamJournal(nats_server.url, node="two", lease_seconds=3.0)
    try:
        first = one.lease("poller-x")
        wait_for(lambda: first._acquired.is_set())
        second = two.lease("poller-x")
        time.sleep(4)  # more than the TTL: renewals keep it with its holder
        assert not second._acquired.is_set()
        assert set(one.status()["leases"].values()) == {"one"}
        first.release()
        wait_for(lambda: second._acquired.is_set(), timeout=5)
        assert set(two.status()["leases"].values()) == {"two"}
    finally:
        one.close()
        two.close()


def test_chat_memory_is_shared_and_concurrent_appends_all_land(nats_server: NatsServer) -> None:
    one = JetStreamJournal(nats_server.url, node="one")
    two = JetStreamJournal(nats_server.url, node="two")
    try:
        a = SharedConversationStore(one, max_tokens=200)
        b = SharedConversationStore(two, max_tokens=200)
        a.append("telegram:1:", "user", "how full is the disk?")
        b.append("telegram:1:", "assistant", "72% full")
        assert [(t.role, t.content) for t in a.recent("telegram:1:")] == [
            ("user", "how full is the disk?"), ("assistant", "72% full")]
        writers = [threading.Thread(target=lambda s=store, k=k: [s.append("telegram:2:", "user", f"{k}-{n}")
                                                                 for n in range(10)])
                   for k, store in enumerate((a, b))]
        for w in writers:
            w.start()
        for w in writers:
            w.join(60)
        assert len(b.history("telegram:2:")) == 20  # compare-and-set: no write lost
        a.append("telegram:3:", "user", "x" * 4000)  # over the budget: the oldest go
        a.append("telegram:3:", "user", "short")
        assert [e.content for e in b.history("telegram:3:")][-1] == "short"
        assert sum(e.tokens for e in b.history("telegram:3:")) <= 200
        assert b.forget("telegram:1:") == 2 and a.recent("telegram:1:") == []
        assert dict(b.chats_with_memory()) == {"telegram:2:": 20, "telegram:3:": 1}
        a.seen(OriginalContext(chat_id=-5, message_id=1, interface_name="telegram", chat_title="Ops Team",
                               chat_type="group"))
        assert [c.chat_id for c in b.find_chats("telegram", "ops team")] == ["-5"]
    finally:
        one.close()
        two.close()


def cluster_daemon(tmp_path: Path, name: str, nats: NatsServer, llm: FakeLLMServer,
                   telegram: FakeTelegramServer, **extra: str) -> Daemon:
    home = tmp_path / name
    home.mkdir()
    env = dict(AUTORESPONSE_LLM__BASE_URL=llm.base_url, AUTORESPONSE_LLM__STREAM="false",
               AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
               AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_CONSOLE__ENABLED="false",
               AUTORESPONSE_TELEGRAM__ALLOWED_USERS=f"[{ALLOWED}]", AUTORESPONSE_EVENTS__ENABLED="false",
               AUTORESPONSE_JOURNAL__BACKEND="nats", AUTORESPONSE_NATS__URL=nats.url,
               AUTORESPONSE_NATS__NODE=name, AUTORESPONSE_NATS__ACK_WAIT_SECONDS="3",
               AUTORESPONSE_NATS__LEASE_SECONDS="2")
    return Daemon(home, **{**env, **extra})


def replies_per_chat(telegram: FakeTelegramServer, base: int) -> Counter[int]:
    return Counter(int(c.params["chat_id"]) - base for c in telegram.sent())


def test_three_daemons_share_one_bot_and_two_kills_lose_nothing(tmp_path: Path, nats_server: NatsServer) -> None:
    updates, base = 600, 20_000
    rng = random.Random(14)
    with FakeLLMServer(delay=0.5) as llm, FakeTelegramServer() as telegram:
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram).start() for name in "abc"]
        try:
            pusher = threading.Thread(target=lambda: [
                telegram.push_text(f"hello {n}", chat_id=base + n, user_id=ALLOWED, message_id=n)
                for n in range(updates)])
            pusher.start()
            victims = rng.sample(daemons, 2)
            time.sleep(1.5)
            victims[0].kill()  # SIGKILL mid-flow, and later a second one
            time.sleep(2.0)
            victims[1].kill()
            pusher.join(60)
            wait_for(lambda: len(replies_per_chat(telegram, base)) >= updates, timeout=120)
            (survivor,) = set(daemons) - set(victims)
            took_over = survivor.status()["cluster"]["redelivered_here"]
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.poll() is None:
                    daemon.stop()
    per_update = replies_per_chat(telegram, base)
    lost = [n for n in range(updates) if per_update[n] == 0]
    duplicates = sum(count - 1 for count in per_update.values() if count > 1)
    print(f"\n3 daemons, 2 killed: {updates} updates, {len(lost)} lost, {duplicates} duplicate replies")
    assert lost == []
    # A duplicate is a send whose confirmation the kill caught: at most one per kill and chat.
    assert max(per_update.values()) <= 3
    assert took_over > 0  # the killed daemons' unfinished items went to the survivor


def test_the_lease_holder_dies_and_another_daemon_polls_on_from_the_stored_offset(
        tmp_path: Path, nats_server: NatsServer) -> None:
    base = 30_000
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        daemons = {name: cluster_daemon(tmp_path, name, nats_server, llm, telegram).start() for name in "ab"}
        try:
            for n in range(50):
                telegram.push_text(f"hello {n}", chat_id=base + n, user_id=ALLOWED, message_id=n)
            wait_for(lambda: len(replies_per_chat(telegram, base)) == 50, timeout=60)
            leases = daemons["a"].status()["cluster"]["leases"]
            holder = next(iter(leases.values()))
            assert holder in daemons
            daemons[holder].kill()
            killed = time.monotonic()
            polls_before = len(telegram.calls_to("getUpdates"))
            for n in range(50, 100):
                telegram.push_text(f"hello {n}", chat_id=base + n, user_id=ALLOWED, message_id=n)
            wait_for(lambda: len(replies_per_chat(telegram, base)) == 100, timeout=60)
            (survivor,) = set(daemons) - {holder}
            assert set(daemons[survivor].status()["cluster"]["leases"].values()) == {survivor}
            resumed = next(c.time for c in telegram.calls_to("getUpdates")[polls_before:]
                           if c.params.get("offset") is not None)
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.poll() is None:
                    daemon.stop()
    per_update = replies_per_chat(telegram, base)
    assert sorted(per_update) == list(range(100))
    assert set(per_update.values()) == {1}  # none missed, none handled twice
    # Once the lease's TTL (2 s) ran out, not at some later chance: well under the 60 s the
    # replies were waited for, with room for a loaded machine.
    assert resumed - killed < 15


def test_two_requests_of_one_chat_are_answered_in_order_while_three_workers_run(
        tmp_path: Path, nats_server: NatsServer) -> None:
    def respond(body: dict[str, Any]) -> FakeResponse:
        text = body["messages"][-1]["content"]
        slow = "first" in text and "answer" not in text
        said = "first" if "first" in text else "second"
        return FakeResponse(content=json.dumps({"actions": [
            {"type": "message_telegram_bot", "payload": {"text": f"answer to the {said}"}}]}),
            delay=1.5 if slow else 0.0)

    chat = 40_000
    with FakeLLMServer(responder=respond) as llm, FakeTelegramServer() as telegram:
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram).start() for name in "abc"]
        try:
            for round_ in range(3):
                telegram.push_text("the first question", chat_id=chat + round_, user_id=ALLOWED, message_id=1)
                telegram.push_text("the second question", chat_id=chat + round_, user_id=ALLOWED, message_id=2)
            wait_for(lambda: len(telegram.sent()) >= 6, timeout=60)
        finally:
            for daemon in daemons:
                daemon.stop()
    for round_ in range(3):
        texts = [c.params["text"] for c in telegram.sent(chat + round_)]
        assert texts == ["answer to the first", "answer to the second"], texts


def test_a_follow_up_answered_by_another_daemon_sees_the_first_exchange(
        tmp_path: Path, nats_server: NatsServer) -> None:
    chat = 50_000
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram).start() for name in "ab"]
        try:
            telegram.push_text("remember the word pelican", chat_id=chat, user_id=ALLOWED, message_id=1)
            wait_for(lambda: telegram.sent(chat), timeout=60)

            def turns(daemon: Daemon) -> int:
                return sum(a["processed"] for n, a in actors(daemon.status()).items() if n.startswith("conversation"))

            first = max(daemons, key=turns)  # the daemon that answered: it goes away
            first.kill()
            (other,) = [d for d in daemons if d is not first]
            telegram.push_text("which word was it?", chat_id=chat, user_id=ALLOWED, message_id=2)
            wait_for(lambda: len(telegram.sent(chat)) == 2, timeout=60)
            assert turns(other) > 0
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.poll() is None:
                    daemon.stop()
    follow_up = next(r for r in llm.requests if "which word was it?" in json.dumps(r.body))
    said = [m["content"] for m in follow_up.body["messages"]]
    assert any("remember the word pelican" in text for text in said[:-1]), said


def test_reminders_are_shared_and_handed_out_by_one_daemon_only(tmp_path: Path, nats_server: NatsServer) -> None:
    chat = 60_000
    context = OriginalContext(chat_id=chat, message_id=9, interface_name="telegram", chat_type="private")
    writer = JetStreamJournal(nats_server.url, node="writer")
    try:
        store = SharedEventStore(writer)
        fast = {"AUTORESPONSE_EVENTS__ENABLED": "true", "AUTORESPONSE_EVENTS__CHECK_SECONDS": "0.1"}
        with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
            daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram, **fast).start() for name in "ab"]
            try:
                date, at = due_in(2)  # due while both daemons check every 0.1 s
                event = store.add(EventPayload(date=date, time=at, description="stretch your legs"), context)
                later = store.add(EventPayload(date=date + dt.timedelta(days=1), time=at, description="later"),
                                  context)
                assert later.id == event.id + 1
                wait_for(lambda: store.get(event.id).state == "delivered", timeout=60)
                time.sleep(1.0)  # ten more checks on each daemon: nothing goes out again
            finally:
                for daemon in daemons:
                    daemon.stop()
        reminders = [c for c in telegram.sent(chat) if "stretch your legs" in c.params["text"]]
        assert len(reminders) == 1, [c.params["text"] for c in telegram.sent(chat)]
    finally:
        writer.close()


def test_two_daemons_read_one_reddit_inbox_through_one_lease(tmp_path: Path, nats_server: NatsServer) -> None:
    from autoresponse.testing.fake_reddit import FakeRedditServer

    secret, password = "reddit-secret-c1", "reddit-password-c1"
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram, FakeRedditServer(password=password) as reddit:
        reddit_env = dict(
            AUTORESPONSE_REDDIT__CLIENT_ID="reddit-client", AUTORESPONSE_REDDIT__CLIENT_SECRET=secret,
            AUTORESPONSE_REDDIT__USERNAME="synth_bot", AUTORESPONSE_REDDIT__PASSWORD=password,
            AUTORESPONSE_REDDIT__OAUTH_URL=reddit.base_url, AUTORESPONSE_REDDIT__REDDIT_URL=reddit.base_url,
            AUTORESPONSE_REDDIT__ALLOWED_USERS='["ada"]', AUTORESPONSE_REDDIT__POLL_INTERVAL="0.2")
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram, **reddit_env).start()
                   for name in "ab"]
        try:
            comments = [reddit.push_comment(f"question {n}", author="ada") for n in range(6)]
            wait_for(lambda: len(reddit.replies()) >= 6, timeout=60)
            time.sleep(1.0)  # five more polls: nothing is answered twice
            holders = [set(d.status()["cluster"]["leases"].items()) for d in daemons]
        finally:
            for daemon in daemons:
                daemon.stop()
    assert sorted(r.thing_id for r in reddit.replies()) == sorted(comments)
    assert holders[0] == holders[1]  # both see the same leases
    pollers = {holder for name, holder in holders[0] if name == "poller-reddit-synth_bot"}
    assert len(pollers) == 1 and pollers <= {"a", "b"}


def test_a_webhook_call_posted_to_two_daemons_is_answered_once(tmp_path: Path, nats_server: NatsServer) -> None:
    from conftest import free_port

    from autoresponse.testing.fake_telegram import post_update

    secret = "webhook-secret-5f2c9a0d1e"
    chat = 70_000
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        ports = [free_port(), free_port()]
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram,
                                  AUTORESPONSE_TELEGRAM__WEBHOOK_URL="https://bot.example.org/hook",
                                  AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET=secret,
                                  AUTORESPONSE_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{port}").start()
                   for name, port in zip("ab", ports)]
        try:
            hooks = [f"http://127.0.0.1:{port}/hook" for port in ports]  # the public URL's path
            assert post_update(hooks[0], telegram.text_update("hi", chat_id=chat, user_id=ALLOWED),
                               secret_token="wrong") == 401
            update = telegram.text_update("hello", chat_id=chat, user_id=ALLOWED, message_id=1)
            assert [post_update(hook, update, secret_token=secret) for hook in hooks] == [200, 200]
            wait_for(lambda: telegram.sent(chat), timeout=60)
            time.sleep(1.0)  # the second copy had every chance to be answered too
        finally:
            for daemon in daemons:
                daemon.stop()
    assert len(telegram.sent(chat)) == 1
    assert telegram.calls_to("getUpdates") == []


def test_a_daemon_without_its_nats_server_exits_with_one_line(tmp_path: Path) -> None:
    from conftest import free_port

    daemon = Daemon(tmp_path, AUTORESPONSE_JOURNAL__BACKEND="nats",
                    AUTORESPONSE_NATS__URL=f"nats://127.0.0.1:{free_port()}")
    with pytest.raises(AssertionError):
        daemon.start()
    assert daemon.wait(30) == 1
    lines = [line for line in daemon.log().splitlines() if line.strip()]
    assert any("cannot reach NATS at nats://127.0.0.1" in line for line in lines), lines
    assert "Traceback" not in daemon.log()


def test_a_nats_outage_pauses_the_daemons_and_loses_nothing(tmp_path: Path, nats_server: NatsServer) -> None:
    updates, base = 100, 80_000
    with FakeLLMServer(delay=0.2) as llm, FakeTelegramServer() as telegram:
        daemons = [cluster_daemon(tmp_path, name, nats_server, llm, telegram).start() for name in "ab"]
        try:
            for n in range(updates // 2):
                telegram.push_text(f"hello {n}", chat_id=base + n, user_id=ALLOWED, message_id=n)
            time.sleep(0.5)
            nats_server.stop()  # mid-flow
            for n in range(updates // 2, updates):
                telegram.push_text(f"hello {n}", chat_id=base + n, user_id=ALLOWED, message_id=n)
            time.sleep(3.0)
            nats_server.start()
            wait_for(lambda: len(replies_per_chat(telegram, base)) >= updates, timeout=120)
            assert all(d.proc is not None and d.proc.poll() is None for d in daemons)  # both still up
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.poll() is None:
                    daemon.stop()
    assert sorted(replies_per_chat(telegram, base)) == list(range(updates))


def test_a_cancel_on_a_shared_journal_is_explained_to_its_user_and_a_stranger_hears_nothing(
    nats_server: NatsServer, make_app: Any
) -> None:
    """A chat's items run one after another on a shared journal, so /cancel cannot reach the
    request under way: its user is told; a stranger's (on X, a public reply) gets nothing."""
    from autoresponse.actors.conversation import CANCEL_UNAVAILABLE
    from autoresponse.actors.routes import CONVERSATIONS, sender
    from autoresponse.messages import OutboundMessage

    app = make_app(journal={"backend": "nats"}, nats={"url": nats_server.url})
    allowed = OriginalContext(chat_id="thread-1", message_id=8, interface_name="console", user_id=7)
    stranger = allowed.model_copy(update={"message_id": 9, "user_id": 666, "autonomous": True})
    with app.runtime.probe(sender("console")) as out:
        for context in (stranger, allowed):  # the stranger's first: its answer would come first
            envelope = app.runtime.send(CONVERSATIONS, UserRequest(text="/cancel", context=context))
            assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, timeout=10)
        wait_for(lambda: out.bodies(OutboundMessage))
        assert [(m.reply_to_message_id, m.text) for m in out.bodies(OutboundMessage)] == [(8, CANCEL_UNAVAILABLE)]


def test_one_long_message_is_remembered_cut_to_fit_the_shared_memory(nats_server: NatsServer) -> None:
    """A message longer than the whole budget does not wipe the chat's shared memory, itself
    included: it is kept, cut to fit with its framing; a budget below the framing alone
    still keeps the newest entry."""
    journal = JetStreamJournal(nats_server.url, node="one")
    try:
        store = SharedConversationStore(journal, max_tokens=200)
        store.append("telegram:1:", "user", "earlier: my server is web-3")
        store.append("telegram:1:", "user", "L" * 20_000)
        assert [t.content for t in store.recent("telegram:1:")] == ["L" * ((200 - 4) * 4)]
        tiny = SharedConversationStore(journal, max_tokens=2)
        tiny.append("telegram:2:", "user", "first")
        tiny.append("telegram:2:", "user", "second")
        assert dict(tiny.chats_with_memory())["telegram:2:"] == 1
    finally:
        journal.close()


def test_shared_memory_past_its_retention_is_never_read_back(
        nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat written to all along (so the bucket's TTL never forgets it) keeps no entry
    past the retention: a month on, what was said then is in no prompt, nor counted."""
    from autoresponse.actors.journal import shared_memory

    clock = [time.time()]
    monkeypatch.setattr(shared_memory, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    journal = JetStreamJournal(nats_server.url, node="one")
    try:
        store = SharedConversationStore(journal, retention_seconds=30 * 24 * 3600)
        store.append("telegram:1:", "user", "my password is hunter2")
        clock[0] += 20 * 24 * 3600
        store.append("telegram:1:", "user", "and my server is web-3")
        clock[0] += 11 * 24 * 3600  # the password is 31 days old, the server 11
        assert [t.content for t in store.recent("telegram:1:")] == ["and my server is web-3"]
        assert store.chats_with_memory() == [("telegram:1:", 1)]
        store.append("telegram:1:", "user", "what did I tell you?")
        assert [e.content for e in store.history("telegram:1:")] == ["and my server is web-3",
                                                                     "what did I tell you?"]
        assert store.chats_with_memory() == [("telegram:1:", 2)]
        stored = journal.run(journal.bucket("autoresponse_memory").get(kv_key("telegram:1:")))
        assert b"hunter2" not in stored.value  # the write dropped it
    finally:
        journal.close()


def _limit_send_keys(journal: JetStreamJournal, max_msgs: int) -> None:
    """Let the server keep at most ``max_msgs`` send keys (-1: no limit): past it, it refuses
    new ones, as when JetStream's store is full."""
    import dataclasses

    async def limit() -> None:
        info = await journal._js.stream_info("KV_autoresponse_sent")
        await journal._js.update_stream(dataclasses.replace(info.config, max_msgs=max_msgs))
    journal.run(limit())


def test_a_send_key_the_server_refused_is_written_once_it_has_room(
        nats_server: NatsServer, caplog: pytest.LogCaptureFixture) -> None:
    """JetStream's store is full for a moment as a reply's chunk goes out: its send key is
    tried again until the server takes it, so the daemon that runs the item next (this one
    died before finishing it) does not send that chunk again."""
    one = JetStreamJournal(nats_server.url, node="one")
    two = JetStreamJournal(nats_server.url, node="two")
    key = "c1:user:0:0123456789ab:0#0"
    try:
        one.mark_sent("an-earlier-reply#0").result(5)
        _limit_send_keys(one, 1)  # full
        confirmed = one.mark_sent(key, "c1")
        wait_for(lambda: "was not written" in caplog.text or confirmed.done(), timeout=20)
        assert one.was_sent(key)  # here it is sent, and the sender goes on
        _limit_send_keys(one, -1)  # room again
        assert confirmed.result(30) is True
        assert two.was_sent(key)  # the next to run c1 skips the chunk
    finally:
        one.close()
        two.close()


def test_the_chunks_an_open_item_sent_are_not_sent_again_after_the_retention(nats_server: NatsServer) -> None:
    """A long reply is stopped between its chunks (its daemon stops), and the item is taken
    up again only after the journal's retention has passed (a long downtime): each chunk
    reaches the user once. Send keys expire with the retention, but not an open item's;
    once it is finished, they go with the retention as any."""
    keys = [f"c1:user:0:0123456789ab:0#{chunk}" for chunk in range(3)]
    delivered: list[str] = []

    def run_on(journal: JetStreamJournal, stop_after: int | None = None) -> None:
        taken: list[str] = []
        journal.start_feed(lambda item: taken.append(item.correlation) or True, lambda: 10)
        wait_for(lambda: taken == ["c1"], timeout=30)
        send_chunks(journal, "c1", keys, delivered, stop_after)

    first = JetStreamJournal(nats_server.url, node="one", retention_seconds=1.0)  # its buckets' TTL
    try:
        assert first.accept(Envelope.new(request(1, "hello"), correlation_id="c1"), actor="llm").result(5)
        run_on(first, stop_after=1)
        first.mark_sent("gone:user:0:0123456789ab:0#0").result(5)  # of no item
    finally:
        first.close()  # the item goes back to the stream
    later = JetStreamJournal(nats_server.url, node="two")
    try:
        wait_for(lambda: not later.was_sent("gone:user:0:0123456789ab:0#0"), timeout=30)  # the retention passed
        run_on(later)
        assert delivered == keys
        later.finish("c1")

        def open_items_keys() -> int:
            info = later.run(later._js.stream_info("KV_autoresponse_sent_open", subjects_filter=">"))
            return len(info.state.subjects or {})
        wait_for(lambda: open_items_keys() == 0, timeout=30)  # finished: nothing kept for ever
        wait_for(lambda: not any(later.was_sent(key) for key in keys), timeout=30)
    finally:
        later.close()
